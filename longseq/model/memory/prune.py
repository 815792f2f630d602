"""Pruning by attention score (``mem_select="attention"``): of the old memory, keep the slots that received the
most attention mass in this segment; the segment itself always stays.

The kept slots stay in their original order; as with compressed memory, relative positions then count slots, not
tokens.  Per layer, since each layer attends with its own weights.
"""

from __future__ import annotations

import torch

from longseq.model.memory.policy import MemoryPolicy, Update
from longseq.model.memory.truncate import keep_recent


class AttentionPrune(MemoryPolicy):
    """The selection policy that asks every layer for the attention mass of its keys."""

    def begin(self, step) -> None:
        if step.doc_ids is not None or step.memory.doc_ids is not None:
            raise ValueError("mem_select=attention does not support document ids or reset_rows")
        step.with_mass = True

    def write(self, step, update: Update) -> None:
        mem_len, cmem = step.recurrence.mem_len, step.memory.cmem_length
        with torch.no_grad():
            kept = []
            for inputs, old, mass in zip(update.inputs, update.plain, update.masses):
                room = mem_len - inputs.size(1)
                if old is None or room <= 0 or old.size(1) <= room:
                    kept.append(keep_recent(inputs, old, mem_len))
                    continue
                old_mass = mass[:, cmem : cmem + old.size(1)]  # (B, M) mass of the old plain slots
                keep = old_mass.topk(room, dim=1).indices.sort(dim=1).values  # (B, room), chronological
                picked = old.gather(1, keep[:, :, None].expand(-1, -1, old.size(2)))
                kept.append(torch.cat([picked, inputs], dim=1).detach())
        update.kept = tuple(kept)
        update.n_evicted = step.memory.mem_length + update.inputs[0].size(1) - update.kept[0].size(1)
