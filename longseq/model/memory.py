"""Segment-level recurrence memory: the cached, stop-gradient hidden states of earlier segments."""

from __future__ import annotations

from dataclasses import dataclass

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


@dataclass
class KVMemory:
    """Key/value memory for evaluation and generation: per layer, the projected keys and values of the
    last M positions (B, H, M, D), so the memory is not projected again at every segment.

    Gives the same outputs as the hidden-state memory.  ``rel_keys`` carries each layer's W_R R table
    (H, R, D) for ``rel_clamp`` between calls, so R is not projected again either.  Start from
    :meth:`empty`.  Not for training: gradients never reach cached keys and values.
    """

    keys: tuple[Tensor, ...]
    values: tuple[Tensor, ...]
    rel_keys: tuple[Tensor, ...] | None = None
    rel_clamp: int = 0

    @classmethod
    def empty(cls) -> KVMemory:
        return cls(keys=(), values=())

    @property
    def length(self) -> int:
        return self.keys[0].size(2) if self.keys else 0

    @classmethod
    def from_presents(cls, presents, mem_len: int, rel_keys=None, rel_clamp: int = 0) -> KVMemory:
        """Keep the last ``mem_len`` positions of each layer's (keys, values)."""
        with torch.no_grad():
            keys = tuple(k[:, :, max(0, k.size(2) - mem_len) :].detach() for k, _ in presents)
            values = tuple(v[:, :, max(0, v.size(2) - mem_len) :].detach() for _, v in presents)
        return cls(keys, values, rel_keys, rel_clamp)
