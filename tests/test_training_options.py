"""Optimizers and training options: LAMB against a hand-written reference, layer-wise learning-rate decay,
activation checkpointing (same loss and gradients), per-layer gradient norms, bf16 autocast stability."""

import json
import math

import numpy as np
import pytest
import torch
from test_train import tiny_corpus, tiny_run

from longseq import ModelConfig, TrainConfig
from longseq.model import TransformerXLLM
from longseq.train import train
from longseq.train.optim import Lamb, build_optimizer


def test_lamb_matches_the_update_rule_written_out():
    torch.manual_seed(0)
    w = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    ref = w.detach().clone()
    m, v = torch.zeros_like(ref), torch.zeros_like(ref)
    opt = Lamb([w], lr=0.1, betas=(0.9, 0.99), eps=1e-6, weight_decay=0.01)
    for t in range(1, 4):
        grad = torch.randn(5, 3, dtype=torch.float64)
        w.grad = grad.clone()
        opt.step()
        m = 0.9 * m + 0.1 * grad
        v = 0.99 * v + 0.01 * grad * grad
        update = (m / (1 - 0.9**t)) / ((v / (1 - 0.99**t)).sqrt() + 1e-6) + 0.01 * ref
        ref = ref - 0.1 * (ref.norm() / update.norm()) * update
        torch.testing.assert_close(w.detach(), ref, rtol=0, atol=1e-12)


def test_layer_wise_decay_scales_each_depth():
    model = TransformerXLLM(ModelConfig(vocab_size=20, n_layer=3, d_model=16, n_head=2, d_head=8, d_inner=32))
    opt = build_optimizer(model, TrainConfig(layer_lr_decay=0.5))
    scale = {id(p): g["lr_scale"] for g in opt.param_groups for p in g["params"]}
    named = dict(model.named_parameters())
    assert scale[id(named["transformer.word_emb.emb_layers.0.weight"])] == 0.5**4  # embedding: depth 0 of top 4
    assert scale[id(named["transformer.layers.0.dec_attn.qkv_net.weight"])] == 0.5**3
    assert scale[id(named["transformer.layers.2.pos_ff.core_net.0.weight"])] == 0.5
    assert scale[id(named["transformer.r_w_bias"])] == 1.0  # shared u sits on top
    decayed = {id(p) for g in opt.param_groups if g["weight_decay"] > 0 for p in g["params"]}
    assert id(named["transformer.layers.0.dec_attn.layer_norm.weight"]) not in decayed
    assert len({id(p) for g in opt.param_groups for p in g["params"]}) == len(list(model.parameters()))


def test_activation_checkpointing_gives_the_same_loss_and_gradients():
    config = ModelConfig(vocab_size=20, n_layer=3, d_model=16, n_head=2, d_head=8, d_inner=32, dropout=0.2, mem_len=6)
    torch.manual_seed(0)
    model = TransformerXLLM(config).double().train()
    ids = torch.randint(0, 20, (2, 10))
    mems = model(ids[:, :4]).mems
    results = []
    for every in (0, 1, 2):
        model.transformer.activation_checkpointing = every
        model.zero_grad()
        torch.manual_seed(5)  # the same dropout masks
        loss = model(ids[:, 4:], mems, ids[:, 4:]).loss
        loss.backward()
        results.append((loss.detach(), [p.grad.clone() for p in model.parameters()]))
    for loss, grads in results[1:]:
        assert torch.equal(loss, results[0][0])
        for a, b in zip(grads, results[0][1]):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_per_layer_gradient_norms_are_logged(tmp_path):
    train(tiny_run(max_steps=4, grad_norm_interval=2), str(tmp_path), corpus=tiny_corpus(), progress=False)
    with open(tmp_path / "metrics.jsonl") as f:
        norms = [r for r in map(json.loads, f) if "grad_norms" in r]
    assert [r["step"] for r in norms] == [2, 4]
    assert set(norms[0]["grad_norms"]) == {"embedding", "layer0", "layer1", "top"}
    assert all(math.isfinite(v) and v > 0 for v in norms[0]["grad_norms"].values())


def test_bf16_autocast_follows_float32_training(tmp_path):
    """200 steps of a tiny model: bf16 autocast stays within 0.05 nats of float32 (mean over the last 50 steps)."""
    corpus = tiny_corpus()
    common = dict(max_steps=200, eval_interval=1000, log_interval=50, grad_accum=1, lr=3e-3)
    fp32 = train(tiny_run(**common), str(tmp_path / "fp32"), corpus=corpus, progress=False)
    bf16 = train(tiny_run(**common, precision="bf16"), str(tmp_path / "bf16"), corpus=corpus, progress=False)
    assert np.mean(fp32.losses[-50:]) < np.mean(fp32.losses[:10]) - 0.3  # it did learn
    assert abs(np.mean(bf16.losses[-50:]) - np.mean(fp32.losses[-50:])) < 0.05
    assert not all(a == b for a, b in zip(bf16.losses, fp32.losses))  # bf16 really ran


def test_fp16_needs_a_gpu(tmp_path):
    from longseq.config import ConfigError

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(ConfigError, match="fp16 needs a GPU"):
        train(tiny_run(precision="fp16"), str(tmp_path), corpus=tiny_corpus(), progress=False)
