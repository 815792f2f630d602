"""AdamW with decoupled weight decay, and learning-rate schedules as pure functions of the step."""

from __future__ import annotations

import math

import torch
from torch import nn

from longseq.config import TrainConfig


def build_optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.AdamW:
    """AdamW; biases, LayerNorm weights and the u/v vectors are not decayed."""
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        skip = param.dim() < 2 or "layer_norm" in name or "r_w_bias" in name or "r_r_bias" in name
        (no_decay if skip else decay).append(param)
    groups = [
        {"params": decay, "weight_decay": config.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=config.lr, betas=(config.beta1, config.beta2), eps=config.eps)


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
