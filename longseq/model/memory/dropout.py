"""Memory dropout (``mem_dropout``): in training, each memory slot is hidden from attention with that
probability, the same slots in every layer, drawn once per forward pass.  A hidden slot is masked out of the
softmax (it is not zeroed, which would leave it in as a key of position only), and the other slots keep their
relative positions, so the model learns not to rely on any one cached position.  Recurrent layers' states are
not dropped."""

from __future__ import annotations

import torch

from longseq.model.memory.policy import MemoryPolicy


class MemoryDropout(MemoryPolicy):
    def __init__(self, rate: float) -> None:
        super().__init__()
        self.rate = rate

    def begin(self, step) -> None:
        if not (step.training and step.mlen):
            return
        dropped = torch.rand(step.batch, step.mlen, device=step.device) < self.rate  # (B, M)
        segment = torch.zeros(step.batch, step.qlen, dtype=torch.bool, device=step.device)
        step.dropped_keys = torch.cat([dropped, segment], dim=1)  # (B, M + T): keys in memory order
