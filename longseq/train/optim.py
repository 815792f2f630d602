"""Optimizers (AdamW, LAMB), layer-wise learning-rate decay, and schedules as pure functions of the step."""

from __future__ import annotations

import math

import torch
from torch import nn

from longseq.config import TrainConfig
from longseq.model.registry import model_spec


class Lamb(torch.optim.Optimizer):
    """LAMB (You et al., 2020): Adam's direction, bias-corrected, plus decoupled weight decay, scaled per
    parameter tensor by the trust ratio ||w|| / ||update|| (1 where either norm is 0).

    Every tensor of a group is updated at once (PyTorch's ``_foreach`` operations), and the step count lives on
    the parameters' device, so a step reads nothing back from a GPU."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0) -> None:
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None if closure is None else closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if params:
                self._update(group, params)
        return loss

    def _update(self, group: dict, params: list) -> None:
        beta1, beta2 = group["betas"]
        for p in params:
            state = self.state[p]
            if not state:
                state["step"] = torch.zeros((), dtype=torch.float64, device=p.device)
                state["exp_avg"] = torch.zeros_like(p)
                state["exp_avg_sq"] = torch.zeros_like(p)
        grads = [p.grad for p in params]
        steps = [self.state[p]["step"] for p in params]
        m = [self.state[p]["exp_avg"] for p in params]
        v = [self.state[p]["exp_avg_sq"] for p in params]
        torch._foreach_add_(steps, 1)
        torch._foreach_lerp_(m, grads, 1 - beta1)  # m = beta1 m + (1 - beta1) g
        torch._foreach_mul_(v, beta2)
        torch._foreach_addcmul_(v, grads, grads, value=1 - beta2)
        first = [(1 - beta1**t).to(p.dtype) for t, p in zip(steps, params)]  # the bias corrections, on the device
        second = [(1 - beta2**t).to(p.dtype) for t, p in zip(steps, params)]
        update = torch._foreach_div(m, first)
        denom = torch._foreach_sqrt(torch._foreach_div(v, second))
        torch._foreach_add_(denom, group["eps"])
        torch._foreach_div_(update, denom)
        if group["weight_decay"]:
            torch._foreach_add_(update, params, alpha=group["weight_decay"])
        w_norm, u_norm = torch.stack(torch._foreach_norm(params)), torch.stack(torch._foreach_norm(update))
        trust = torch.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm, torch.ones_like(w_norm))
        torch._foreach_mul_(update, list(trust.unbind()))
        torch._foreach_add_(params, update, alpha=-group["lr"])


def build_optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.Optimizer:
    """AdamW or LAMB; biases, LayerNorm weights and the u/v vectors are not decayed.  With ``layer_lr_decay``
    d < 1 a parameter at depth k (its architecture's ``ModelSpec.layer_depths``: 0 the embedding, i + 1 layer i,
    top = n_layer + 1 above the layers) learns at lr * d^(top - k): the top is untouched and the embedding slowest.
    Each group's factor is its ``lr_scale``; the loop multiplies the schedule by it.  ``model`` is a language
    model or a task's model (its ``config`` is the language model's)."""
    top = model.config.n_layer + 1
    o = config.optim
    depths = model_spec(model.config.arch).layer_depths(model) if o.layer_lr_decay < 1 else {}
    groups: dict[tuple[bool, int], list] = {}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        skip = param.dim() < 2 or "layer_norm" in name or "r_w_bias" in name or "r_r_bias" in name
        depth = depths.get(name, top)
        groups.setdefault((not skip, depth), []).append(param)
    param_groups = [
        {
            "params": params,
            "weight_decay": o.weight_decay if decay else 0.0,
            "lr_scale": o.layer_lr_decay ** (top - depth),
        }
        for (decay, depth), params in sorted(groups.items(), key=lambda kv: (not kv[0][0], kv[0][1]))
    ]
    if o.optimizer == "lamb":
        return Lamb(param_groups, lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps)
    try:  # fused: one kernel for all tensors, the step count on the device (no read back from a GPU)
        return torch.optim.AdamW(param_groups, lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps, fused=True)
    except (RuntimeError, ValueError):  # a device or dtype the fused kernel does not serve
        return torch.optim.AdamW(param_groups, lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps)


def learning_rate(step: int, config: TrainConfig) -> float:
    """Learning rate for optimizer step ``step`` (0-based): linear warmup, then the chosen decay.

    ``cosine`` and ``linear`` decay from ``lr`` to ``min_lr`` at ``max_steps``; ``inv_sqrt`` is
    ``lr * sqrt(warmup / step)`` after warmup (the Transformer schedule); ``constant`` holds ``lr``.
    """
    o, total = config.optim, config.max_steps
    warmup = o.warmup_steps
    if warmup and step < warmup:
        return o.lr * (step + 1) / warmup
    if o.schedule == "constant":
        return o.lr
    if o.schedule == "inv_sqrt":
        return o.lr * math.sqrt(max(warmup, 1) / max(step, 1)) if step >= max(warmup, 1) else o.lr
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    if o.schedule == "linear":
        return o.min_lr + (o.lr - o.min_lr) * (1.0 - progress)
    return o.min_lr + 0.5 * (o.lr - o.min_lr) * (1.0 + math.cos(math.pi * progress))
