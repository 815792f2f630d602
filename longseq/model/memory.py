"""Segment-level recurrence memory: the cached, stop-gradient hidden states of earlier segments."""

from __future__ import annotations

import torch
from torch import Tensor

Memory = tuple[Tensor, ...]
"""One (B, M, E) tensor per layer: the input of that layer for the last M positions."""


def update_memory(hiddens: list[Tensor], memory: Memory | None, mem_len: int) -> Memory:
    """Append this segment's layer inputs to the memory and keep the last ``mem_len`` positions.

    The result is detached: no gradient ever flows into a previous segment (the paper's SG(.)).
    """
    with torch.no_grad():
        new = []
        for layer, hidden in enumerate(hiddens):  # hidden: (B, T, E)
            if mem_len == 0:
                new.append(hidden[:, :0].detach())
                continue
            old = None if memory is None else memory[layer]
            joined = hidden if old is None or old.size(1) == 0 else torch.cat([old, hidden], dim=1)  # (B, M+T, E)
            new.append(joined[:, -mem_len:].detach())
        return tuple(new)
