"""Optimizers and training options: LAMB against a hand-written reference, layer-wise learning-rate decay,
activation checkpointing (same loss and gradients), per-layer gradient norms, bf16 autocast stability."""

import json
import math

import numpy as np
import pytest
import torch
from support import tiny_corpus, tiny_run

from longseq import ConfigError, ModelConfig, TrainConfig
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


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_half_precision_follows_float32_training(tmp_path, precision):
    """200 steps of a tiny model: bf16 autocast, and fp16 autocast with dynamic loss scaling, stay within 0.05 nats
    of float32 (mean over the last 50 steps)."""
    corpus = tiny_corpus()
    common = dict(max_steps=200, eval_interval=1000, log_interval=50, grad_accum=1, lr=3e-3)
    fp32 = train(tiny_run(**common), str(tmp_path / "fp32"), corpus=corpus, progress=False)
    half = train(tiny_run(**common, precision=precision), str(tmp_path / precision), corpus=corpus, progress=False)
    assert np.mean(fp32.losses[-50:]) < np.mean(fp32.losses[:10]) - 0.3  # it did learn
    assert abs(np.mean(half.losses[-50:]) - np.mean(fp32.losses[-50:])) < 0.05
    assert not all(a == b for a, b in zip(half.losses, fp32.losses))  # half precision really ran


def test_fp16_overflow_is_left_to_the_loss_scaler_and_resume_keeps_its_scale(tmp_path):
    """An infinite gradient under fp16 is an overflow: the loss scaler skips that update and halves its scale (the
    NaN guard stays quiet); a run stopped after it and resumed continues bit for bit and keeps the halved scale
    (the losses alone cannot tell: scaling by a power of two is exact)."""
    corpus = tiny_corpus()

    def poison_step_3():
        left = [1]

        def hook(step, model):
            if step == 3 and left[0]:
                left[0] -= 1
                next(model.parameters()).grad.fill_(float("inf"))

        return hook

    run = tiny_run(max_steps=8, eval_interval=1000, log_interval=1, precision="fp16", save_interval=4)
    whole = train(run, str(tmp_path / "whole"), corpus=corpus, progress=False, after_backward=poison_step_3())
    train(run, str(tmp_path / "split"), corpus=corpus, progress=False, stop_after=4, after_backward=poison_step_3())
    state = json.loads((tmp_path / "split" / "last" / "trainer_state.json").read_text())
    assert state["scaler"]["scale"] == 2.0**15  # 2^16 halved once
    resumed = train(run, str(tmp_path / "split"), corpus=corpus, progress=False, resume=True)
    assert resumed.losses == whole.losses[4:]
    state = json.loads((tmp_path / "split" / "last" / "trainer_state.json").read_text())
    assert state["scaler"]["scale"] == 2.0**15  # carried over the resume, not reset to 2^16
    with open(tmp_path / "whole" / "metrics.jsonl") as f:
        assert not any("skipped" in r for r in map(json.loads, f))


def test_fp16_nan_loss_is_skipped_and_rolled_back_like_float32(tmp_path):
    """A weight poisoned to inf makes every following loss NaN: under fp16 the guard skips those steps (the loss
    scaler is closed each time) and rolls back to the last checkpoint, and the run finishes."""

    def poison_step_3():
        left = [1]

        def hook(step, model):
            if step == 3 and left[0]:
                left[0] -= 1
                with torch.no_grad():
                    next(model.parameters()).fill_(float("inf"))

        return hook

    run = tiny_run(max_steps=6, eval_interval=1000, log_interval=1, precision="fp16", save_interval=2)
    result = train(run, str(tmp_path), corpus=tiny_corpus(), progress=False, after_backward=poison_step_3())
    with open(tmp_path / "metrics.jsonl") as f:
        log = list(map(json.loads, f))
    assert sum("skipped" in r for r in log) == 3 and sum("rollback" in r for r in log) == 1
    assert result.step == 6 and all(math.isfinite(x) for x in result.losses[-3:])


def test_memory_length_curriculum_grows_the_carried_memory(tmp_path):
    """mem_len_start=2 growing to mem_len=8 over 6 steps: after step k the memory holds mem_len_at(k) positions."""
    from longseq.tasks.lm import LanguageModeling, mem_len_at
    from longseq.train import Trainer

    run = tiny_run(max_steps=10, eval_interval=100, grad_accum=1, mem_len_start=2, mem_len_warmup_steps=6)
    run.data.varlen = False
    assert [mem_len_at(k, run.train, 8) for k in range(8)] == [2, 3, 4, 5, 6, 7, 8, 8]
    trainer = Trainer(LanguageModeling(run, corpus=tiny_corpus()), run, str(tmp_path), progress=False)
    trainer._open()
    lengths = []
    for _ in range(8):
        trainer.step()
        lengths.append(trainer.memory.mem_length)
    trainer.dir.close()
    assert lengths == [2, 3, 4, 5, 6, 7, 8, 8]


def test_memory_curriculum_as_a_fraction_of_the_run_scales_with_max_steps():
    """mem_len_warmup_frac=0.6 of 10 steps is the 6-step ramp above; of 20 steps it is a 12-step ramp; setting both
    forms, or a fraction outside [0, 1], is refused."""
    from longseq.tasks.lm import mem_len_at

    by_steps = tiny_run(max_steps=10, mem_len_start=2, mem_len_warmup_steps=6).train
    by_frac = tiny_run(max_steps=10, mem_len_start=2, mem_len_warmup_frac=0.6).train
    assert [mem_len_at(k, by_frac, 8) for k in range(12)] == [mem_len_at(k, by_steps, 8) for k in range(12)]
    longer = tiny_run(max_steps=20, mem_len_start=2, mem_len_warmup_frac=0.6).train
    assert longer.mem_len_ramp_steps == 12 and [mem_len_at(k, longer, 8) for k in (0, 6, 11, 12)] == [2, 5, 7, 8]
    with pytest.raises(ConfigError, match="not both"):
        tiny_run(mem_len_start=0, mem_len_warmup_steps=6, mem_len_warmup_frac=0.5)
    with pytest.raises(ConfigError, match=r"mem_len_warmup_frac must be in \[0, 1\]"):
        tiny_run(mem_len_start=0, mem_len_warmup_frac=1.5)


def test_dropout_on_r_and_the_uv_initialisation_are_their_own_settings():
    base = dict(vocab_size=20, n_layer=1, d_model=16, n_head=2, d_head=8, d_inner=32, dropout=0.0, mem_len=4)
    x = torch.randint(0, 20, (2, 6))

    def two_draws(**extra):
        torch.manual_seed(0)
        model = TransformerXLLM(ModelConfig(**base, **extra)).train()
        return model(x).logits, model(x).logits

    a, b = two_draws()
    assert torch.equal(a, b)  # no dropout anywhere
    a, b = two_draws(dropout_r=0.5)
    assert not torch.equal(a, b)  # only R is dropped
    torch.manual_seed(0)
    zeros = TransformerXLLM(ModelConfig(**base, uv_init="zeros"))
    normal = TransformerXLLM(ModelConfig(**base))
    assert not zeros.transformer.r_w_bias.any() and not zeros.transformer.r_r_bias.any()
    assert normal.transformer.r_w_bias.abs().sum() > 0
