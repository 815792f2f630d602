"""Memory tokens (Bulatov et al., 2022, the Recurrent Memory Transformer): ``n`` tokens read before the segment
and written after it, carried to the next segment, with back-propagation through ``bptt`` segments.

The layers see [read tokens; segment; write tokens]; the written tokens' last-layer states become the next
segment's read tokens.  The first segment reads the learned initial tokens.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from longseq.model.memory.policy import WrittenTokens


class MemoryTokens(nn.Module):
    def __init__(self, n: int, d_model: int, bptt: int) -> None:
        super().__init__()
        self.n, self.bptt = n, bptt
        self.initial = nn.Parameter(torch.zeros(n, d_model))  # the first segment's read tokens

    def check(self, step) -> None:
        if step.doc_ids is not None:
            raise ValueError("document ids are not supported together with memory tokens")

    def wrap(self, step, hidden: Tensor) -> Tensor:
        read = step.memory.tokens
        if read is None:
            read = self.initial.to(hidden.dtype).expand(hidden.size(0), -1, -1)  # (B, n, E)
        return torch.cat([read, hidden, read], dim=1)  # (B, n + T + n, E)

    def wrap_flags(self, flags: Tensor) -> Tensor:
        """Flags of the segment's positions (B, T), False over the tokens: memory tokens are never global."""
        pad = flags.new_zeros(flags.size(0), self.n)
        return torch.cat([pad, flags, pad], dim=1)

    def strip(self, step, hidden: Tensor, inputs: list, docs) -> WrittenTokens:
        """The pass's outputs (B, n + T + n, E) and layer inputs without the tokens, and the written tokens."""
        n, qlen = self.n, step.qlen
        segment = slice(n, qlen - n)
        written = hidden[:, qlen - n :]  # (B, n, E): the new memory tokens
        if docs is not None:  # the memory keeps segment positions only
            query, key = docs
            docs = (query[:, segment], torch.cat([key[:, : step.mlen], key[:, step.mlen :][:, segment]], dim=1))
        age = step.memory.tokens_age + 1
        if not step.training or age >= self.bptt:
            written, age = written.detach(), 0
        inputs = [None if x is None else x[:, segment] for x in inputs]
        return WrittenTokens(hidden[:, segment], inputs, docs, written, age)
