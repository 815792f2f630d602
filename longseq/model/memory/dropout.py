"""Memory dropout (``mem_dropout``): in training, each memory slot is hidden from attention with that
probability, the same slots in every layer, drawn once per forward pass.  A hidden slot is masked out of the
softmax (it is not zeroed, which would leave it in as a key of position only), and the other slots keep their
relative positions, so the model learns not to rely on any one cached position.  Recurrent layers' states are
not dropped."""

from __future__ import annotations

import torch
from torch import Tensor


class MemoryDropout:
    def __init__(self, rate: float) -> None:
        self.rate = rate

    def draw(self, step) -> Tensor | None:
        """The keys (B, M + T) hidden this pass (True), memory slots only; None outside training or memory."""
        if not (step.training and step.mlen):
            return None
        dropped = torch.rand(step.batch, step.mlen, device=step.device) < self.rate  # (B, M)
        segment = torch.zeros(step.batch, step.qlen, dtype=torch.bool, device=step.device)
        return torch.cat([dropped, segment], dim=1)  # (B, M + T): keys in memory order
