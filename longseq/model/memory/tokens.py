"""Memory tokens (Bulatov et al., 2022, the Recurrent Memory Transformer): ``n`` tokens read before the segment
and written after it, carried to the next segment, with back-propagation through ``bptt`` segments.

The layers see [read tokens; segment; write tokens]; the written tokens' last-layer states become the next
segment's read tokens.  The first segment reads the learned initial tokens.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from longseq.model.memory.policy import MemoryPolicy, Update


class MemoryTokens(MemoryPolicy):
    def __init__(self, n: int, d_model: int, bptt: int) -> None:
        super().__init__()
        self.n, self.bptt = n, bptt
        self.initial = nn.Parameter(torch.zeros(n, d_model))  # the first segment's read tokens

    def begin(self, step) -> None:
        if step.doc_ids is not None:
            raise ValueError("document ids are not supported together with memory tokens")
        step.qlen += 2 * self.n

    def wrap(self, step, hidden: Tensor) -> Tensor:
        read = step.memory.tokens
        if read is None:
            read = self.initial.to(hidden.dtype).expand(hidden.size(0), -1, -1)  # (B, n, E)
        return torch.cat([read, hidden, read], dim=1)  # (B, n + T + n, E)

    def wrap_flags(self, step, flags: Tensor) -> Tensor:
        """Flags of the segment's positions (B, T), False over the tokens: memory tokens are never global."""
        pad = flags.new_zeros(flags.size(0), self.n)
        return torch.cat([pad, flags, pad], dim=1)

    def write(self, step, update: Update) -> None:
        n, qlen = self.n, step.qlen
        segment = slice(n, qlen - n)
        written = update.hidden[:, qlen - n :]  # (B, n, E): the new memory tokens
        update.hidden = update.hidden[:, segment]
        update.inputs = [x[:, segment] for x in update.inputs]
        if step.docs is not None:  # the memory keeps segment positions only
            query, key = step.docs
            step.docs = (query[:, segment], torch.cat([key[:, : step.mlen], key[:, step.mlen :][:, segment]], dim=1))
        age = step.memory.tokens_age + 1
        if not step.training or age >= self.bptt:
            written, age = written.detach(), 0
        update.tokens, update.tokens_age = written, age
