"""The memory of a stack whose rows read different numbers of positions (a dynamic hourglass's chunks).

The rows' positions come left-aligned and padded to the longest row; the stack runs over them with a memory that
keeps everything it read (``mem_len`` = memory + segment), so no row's real positions are dropped yet.  Then
:func:`keep_last` keeps each row's last ``mem_len`` real positions, right-aligned: a row's memory slots and its next
segment's positions are contiguous, so relative distances count real positions only.  A slot that holds nothing
(a row with fewer positions than the others) gets document id -1 and is masked; the padding is never kept.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor

from longseq.model.memory.state import HiddenMemory, Memory


def keep_last(memory: Memory, counts: Tensor, qlen: int, mem_len: int) -> Memory:
    """The memory a stack wrote over ``qlen`` padded positions of which row b's first ``counts[b]`` are real (every
    layer a :class:`HiddenMemory` holding [memory; segment]): each row's last ``mem_len`` real slots."""
    total = memory.mem_length  # the earlier memory and the segment
    keep = min(mem_len, total)
    end = total - qlen + counts  # (B,): one past each row's last real slot
    index = end[:, None] - keep + torch.arange(keep, device=counts.device)  # (B, keep)
    empty = index < 0  # before the first slot: nothing there
    index = index.clamp(min=0)

    def rows(hidden: Tensor) -> Tensor:
        return hidden.gather(1, index[..., None].expand(-1, -1, hidden.size(-1)))

    layers = tuple(HiddenMemory(rows(layer.hidden)) for layer in memory.layers)
    docs = memory.doc_ids.gather(1, index).masked_fill(empty, -1)
    return replace(memory, layers=layers, doc_ids=docs)
