"""The optimizers: LAMB's update written out per tensor (the paper's formulas) against the one that updates every
tensor at once, and neither reads anything back from the device."""

from __future__ import annotations

import torch

from longseq.diagnostics.syncs import HostSyncs
from longseq.train.optim import Lamb


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
