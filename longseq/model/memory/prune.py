"""Pruning by attention score (``mem_select="attention"``): of the old memory, keep the slots that received the
most attention mass in this segment; the segment itself always stays.

The kept slots stay in their original order; as with compressed memory, relative positions then count slots, not
tokens.  Per layer, since each layer attends with its own weights.
"""

from __future__ import annotations

import torch

from longseq.model.memory.policy import Selection
from longseq.model.memory.truncate import keep_recent


class AttentionPrune:
    """The selection policy that asks every layer for the attention mass of its keys."""

    needs_mass = True

    def check(self, step) -> None:
        if step.doc_ids is not None or step.memory.doc_ids is not None:
            raise ValueError("mem_select=attention does not support document ids or reset_rows")

    def select(self, step, inputs: list, plain: list, masses: list) -> Selection:
        mem_len, cmem = step.recurrence.mem_len, step.memory.cmem_length
        with torch.no_grad():
            kept = []
            for new, old, mass in zip(inputs, plain, masses):
                room = mem_len - new.size(1)
                if old is None or room <= 0 or old.size(1) <= room:
                    kept.append(keep_recent(new, old, mem_len))
                    continue
                old_mass = mass[:, cmem : cmem + old.size(1)]  # (B, M) mass of the old plain slots
                keep = old_mass.topk(room, dim=1).indices.sort(dim=1).values  # (B, room), chronological
                picked = old.gather(1, keep[:, :, None].expand(-1, -1, old.size(2)))
                kept.append(torch.cat([picked, new], dim=1).detach())
        return Selection(tuple(kept), step.memory.mem_length + inputs[0].size(1) - kept[0].size(1))
