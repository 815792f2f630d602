"""Optimizers and schedules: LAMB against its update rule written out, layer-wise learning-rate decay, and the
learning-rate schedules (cosine, linear, inverse square root, constant, with warmup)."""

from __future__ import annotations

import pytest
import torch

from longseq import ModelConfig, TrainConfig
from longseq.diagnostics.syncs import HostSyncs
from longseq.model import TransformerXLLM
from longseq.train import learning_rate
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
    assert scale[id(named["transformer.stack.layers.0.dec_attn.qkv_net.weight"])] == 0.5**3
    assert scale[id(named["transformer.stack.layers.2.pos_ff.core_net.0.weight"])] == 0.5
    assert scale[id(named["transformer.stack.r_w_bias"])] == 1.0  # shared u sits on top
    decayed = {id(p) for g in opt.param_groups if g["weight_decay"] > 0 for p in g["params"]}
    assert id(named["transformer.stack.layers.0.dec_attn.layer_norm.weight"]) not in decayed
    assert len({id(p) for g in opt.param_groups for p in g["params"]}) == len(list(model.parameters()))


def test_schedules():
    cfg = TrainConfig(max_steps=100, lr=1.0, min_lr=0.1, warmup_steps=10, schedule="cosine")
    assert learning_rate(0, cfg) == pytest.approx(0.1)
    assert learning_rate(9, cfg) == pytest.approx(1.0)
    assert learning_rate(10, cfg) == pytest.approx(1.0)
    assert learning_rate(100, cfg) == pytest.approx(0.1)
    assert learning_rate(55, cfg) == pytest.approx(0.55)
    linear = TrainConfig(max_steps=100, lr=1.0, min_lr=0.0, warmup_steps=0, schedule="linear")
    assert learning_rate(50, linear) == pytest.approx(0.5)
    inv = TrainConfig(max_steps=100, lr=1.0, warmup_steps=4, schedule="inv_sqrt")
    assert learning_rate(16, inv) == pytest.approx(0.5)
    assert learning_rate(70, TrainConfig(max_steps=100, lr=1.0, warmup_steps=4, schedule="constant")) == 1.0


def lamb_reference(params, grads_per_step, lr=1e-2, betas=(0.9, 0.99), eps=1e-6, weight_decay=0.01):
    """You et al. (2020), one tensor at a time: m, v; bias-corrected Adam direction plus decoupled decay; the
    trust ratio ||w|| / ||update|| (1 where either norm is 0)."""
    m = [torch.zeros_like(p) for p in params]
    v = [torch.zeros_like(p) for p in params]
    for t, grads in enumerate(grads_per_step, 1):
        for i, (p, g) in enumerate(zip(params, grads)):
            m[i] = betas[0] * m[i] + (1 - betas[0]) * g
            v[i] = betas[1] * v[i] + (1 - betas[1]) * g * g
            update = (m[i] / (1 - betas[0] ** t)) / ((v[i] / (1 - betas[1] ** t)).sqrt() + eps) + weight_decay * p
            w_norm, u_norm = p.norm(), update.norm()
            trust = w_norm / u_norm if w_norm > 0 and u_norm > 0 else 1.0
            params[i] = p - lr * trust * update
    return params


def test_lamb_updates_every_tensor_at_once_as_the_formulas_do():
    torch.manual_seed(0)
    shapes = [(5, 3), (7,), (2, 2, 2)]
    start = [torch.randn(s, dtype=torch.float64) for s in shapes]
    start[1].zero_()  # a zero tensor: trust ratio 1
    grads = [[torch.randn(s, dtype=torch.float64) for s in shapes] for _ in range(4)]
    params = [torch.nn.Parameter(p.clone()) for p in start]
    optimizer = Lamb(params, lr=1e-2, betas=(0.9, 0.99), eps=1e-6, weight_decay=0.01)
    for step in grads:
        for p, g in zip(params, step):
            p.grad = g.clone()
        optimizer.step()
    for got, want in zip(params, lamb_reference([p.clone() for p in start], grads)):
        torch.testing.assert_close(got.detach(), want, rtol=0, atol=1e-12)


def test_the_optimizers_read_nothing_back_from_the_device():
    from longseq.config import TrainConfig
    from longseq.train.optim import build_optimizer

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    model.config = type("C", (), {"n_layer": 0})()
    for name in ("adamw", "lamb"):
        optimizer = build_optimizer(model, TrainConfig(optimizer=name))
        for p in model.parameters():
            p.grad = torch.randn_like(p)
        optimizer.step()
        with HostSyncs() as syncs:
            optimizer.step()
        assert syncs.where == [], (name, syncs.where)


def test_a_run_shorter_than_its_preset_keeps_the_warm_ups_share_and_says_so(tmp_path, text_corpus, capsys):
    """``--set max_steps=N`` kept the preset's warmup_steps (100 of 1,200): a 100-step smoke run warmed up from start
    to end and never decayed.  The warm-up now keeps its share of the run, said on stderr and written in run.toml;
    a warm-up the user sets over the whole run is kept, and said."""
    from support import TINY_CLI, assert_names, records

    from longseq.cli import main
    from longseq.config import load_run_config

    args = ["train", "--data", str(text_corpus), "--tokenizer", "char", *TINY_CLI, "max_steps=24", "log_interval=1"]
    assert main([*args, "--out", str(tmp_path / "short")]) == 0
    assert "warmup_steps scaled from 100 to 2" in capsys.readouterr().err  # 100 * 24 / 1200
    assert load_run_config(str(tmp_path / "short" / "run.toml")).train.optim.warmup_steps == 2
    lrs = [r["lr"] for r in records(tmp_path / "short") if "lr" in r]
    assert len(lrs) == 24 and lrs[0] < lrs[1] == max(lrs)  # two steps up (the last at the peak) ...
    assert all(a > b for a, b in zip(lrs[2:], lrs[3:])) and lrs[-1] < lrs[1] / 2  # ... then the cosine decay
    assert main([*args, "warmup_steps=30", "--out", str(tmp_path / "mine")]) == 0
    assert_names(capsys.readouterr().err, "warmup_steps=30 >= max_steps=24", "never")
    assert load_run_config(str(tmp_path / "mine" / "run.toml")).train.optim.warmup_steps == 30
    lrs = [r["lr"] for r in records(tmp_path / "mine") if "lr" in r]
    assert all(a < b for a, b in zip(lrs, lrs[1:]))  # the user's choice: warm-up all along
