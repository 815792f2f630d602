"""Optimizers (AdamW, LAMB), layer-wise learning-rate decay, and schedules as pure functions of the step."""

from __future__ import annotations

import math

import torch
from torch import nn

from longseq.config import TrainConfig


class Lamb(torch.optim.Optimizer):
    """LAMB (You et al., 2020): Adam's direction, bias-corrected, plus decoupled weight decay, scaled per
    parameter tensor by the trust ratio ||w|| / ||update|| (1 where either norm is 0)."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0) -> None:
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None if closure is None else closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float64)
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                state["step"] += 1
                t = float(state["step"])
                m, v = state["exp_avg"], state["exp_avg_sq"]
                m.mul_(beta1).add_(p.grad, alpha=1 - beta1)
                v.mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
                update = (m / (1 - beta1**t)) / ((v / (1 - beta2**t)).sqrt() + group["eps"])
                if group["weight_decay"]:
                    update.add_(p, alpha=group["weight_decay"])
                w_norm, u_norm = p.norm(), update.norm()
                trust = torch.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm, torch.ones_like(w_norm))
                p.add_(update * trust, alpha=-group["lr"])
        return loss


def layer_of(name: str, n_layer: int) -> int:
    """Depth of a parameter for layer-wise learning-rate decay: 0 for the embedding, i + 1 for decoder layer i,
    n_layer + 1 for everything above the layers (softmax, shared u and v, compressors, task heads).  A task model's
    language model under ``lm.`` counts as the language model itself."""
    name = name.removeprefix("lm.")
    if name.startswith(("transformer.word_emb", "embedding")):
        return 0
    for prefix in ("transformer.layers.", "lstm.weight_ih_l", "lstm.weight_hh_l", "lstm.bias_ih_l", "lstm.bias_hh_l"):
        if name.startswith(prefix):
            return int(name[len(prefix) :].split(".")[0].split("_")[0]) + 1
    return n_layer + 1


def build_optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.Optimizer:
    """AdamW or LAMB; biases, LayerNorm weights and the u/v vectors are not decayed.  With ``layer_lr_decay``
    d < 1 a parameter at depth k (:func:`layer_of`) learns at lr * d^(top - k): the top is untouched and the
    embedding slowest.  Each group's factor is its ``lr_scale``; the loop multiplies the schedule by it."""
    n_layer = getattr(model.config, "n_layer", 0)
    top = n_layer + 1
    groups: dict[tuple[bool, int], list] = {}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        skip = param.dim() < 2 or "layer_norm" in name or "r_w_bias" in name or "r_r_bias" in name
        depth = layer_of(name, n_layer) if config.layer_lr_decay < 1 else top
        groups.setdefault((not skip, depth), []).append(param)
    param_groups = [
        {
            "params": params,
            "weight_decay": config.weight_decay if decay else 0.0,
            "lr_scale": config.layer_lr_decay ** (top - depth),
        }
        for (decay, depth), params in sorted(groups.items(), key=lambda kv: (not kv[0][0], kv[0][1]))
    ]
    if config.optimizer == "lamb":
        return Lamb(param_groups, lr=config.lr, betas=(config.beta1, config.beta2), eps=config.eps)
    return torch.optim.AdamW(param_groups, lr=config.lr, betas=(config.beta1, config.beta2), eps=config.eps)


def learning_rate(step: int, config: TrainConfig) -> float:
    """Learning rate for optimizer step ``step`` (0-based): linear warmup, then the chosen decay.

    ``cosine`` and ``linear`` decay from ``lr`` to ``min_lr`` at ``max_steps``; ``inv_sqrt`` is
    ``lr * sqrt(warmup / step)`` after warmup (the Transformer schedule); ``constant`` holds ``lr``.
    """
    warmup, total = config.warmup_steps, config.max_steps
    if warmup and step < warmup:
        return config.lr * (step + 1) / warmup
    if config.schedule == "constant":
        return config.lr
    if config.schedule == "inv_sqrt":
        return config.lr * math.sqrt(max(warmup, 1) / max(step, 1)) if step >= max(warmup, 1) else config.lr
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    if config.schedule == "linear":
        return config.min_lr + (config.lr - config.min_lr) * (1.0 - progress)
    return config.min_lr + 0.5 * (config.lr - config.min_lr) * (1.0 + math.cos(math.pi * progress))
