"""Memory dropout (``mem_dropout``): in training, whole memory slots are zeroed, the same slots in every layer,
so the model learns not to rely on any one cached position."""

from __future__ import annotations

import torch

from longseq.model.memory.policy import LayerContext, MemoryPolicy


class MemoryDropout(MemoryPolicy):
    def __init__(self, rate: float) -> None:
        super().__init__()
        self.rate = rate

    def read(self, step, layer: int, context: LayerContext) -> LayerContext:
        if not (step.training and step.mlen and context.memory is not None):
            return context
        if layer == 0 or not hasattr(step, "dropout_keep"):  # drawn once per forward, shared by the layers
            keep = torch.rand(step.batch, step.mlen, 1, device=step.device) >= self.rate  # (B, M, 1)
            step.dropout_keep = keep.to(context.memory.dtype)
        context.memory = context.memory * step.dropout_keep
        return context
