"""Document tracking: the document id of every memory slot, so that no token attends to another document, in
the segment or in the memory (``doc_reset``), and per-stream resets of the memory (:func:`reset_rows`)."""

from __future__ import annotations

import torch
from torch import Tensor

from longseq.model.memory.policy import Compressed, Selection, SlotDocuments
from longseq.model.memory.state import Memory


class Documents:
    """Query (B, T) and key (B, K) document ids for the masks, and the ids of the slots that stay.  Inactive
    (no ids anywhere) unless the segment comes with ``doc_ids`` or the memory has them."""

    def __init__(self, cmem_rate: int, cmem_len: int) -> None:
        self.cmem_rate, self.cmem_len = cmem_rate, cmem_len

    def begin(self, step) -> tuple[Tensor, Tensor] | None:
        """The document of every query (B, T') and of every key (B, C + M + T'), or None without documents."""
        mem_docs, doc_ids = step.memory.doc_ids, step.doc_ids
        if doc_ids is None and mem_docs is None:
            return None
        batch, qlen = step.batch, step.qlen  # qlen counts memory tokens: they belong to no document of their own
        if doc_ids is not None and tuple(doc_ids.shape) != (batch, qlen):
            raise ValueError(f"doc_ids must have the input's shape {(batch, qlen)}, got {tuple(doc_ids.shape)}")
        query = (
            doc_ids.long() if doc_ids is not None else torch.zeros(batch, qlen, dtype=torch.long, device=step.device)
        )
        if mem_docs is None:  # memory without ids continues the segment's first document
            mem_docs = query[:, :1].expand(batch, step.mlen)
        return query, torch.cat([mem_docs, query], dim=1)

    def write(self, step, docs, selection: Selection, compressed: Compressed | None) -> SlotDocuments | None:
        """The documents of the slots that stay, given the segment's ``docs`` (memory tokens stripped)."""
        if docs is None:
            return None
        last_doc = docs[0][:, -1]  # recurrent layers' states belong to it
        key_docs = docs[1]  # (B, C + M + T) in memory order, memory tokens removed
        cmem, n_evicted = step.memory.cmem_length, selection.n_evicted
        cmem_docs, mem_docs = key_docs[:, :cmem], key_docs[:, cmem:]
        evicted, mem_docs = mem_docs[:, :n_evicted], mem_docs[:, n_evicted:]
        if not self.cmem_len:
            return SlotDocuments(mem_docs, last_doc)
        if n_evicted:
            group_last = evicted[:, min(self.cmem_rate, n_evicted) - 1 :: self.cmem_rate]  # newest of a group
            if group_last.size(1) < compressed.compressed[0].size(1) - cmem_docs.size(1):
                group_last = torch.cat([group_last, evicted[:, -1:]], dim=1)
            cmem_docs = torch.cat([cmem_docs, group_last], dim=1)[:, -self.cmem_len :]
        return SlotDocuments(torch.cat([cmem_docs, mem_docs], dim=1), last_doc)


def reset_rows(memory: Memory | None, rows: Tensor, initial_tokens: Tensor | None = None) -> Memory | None:
    """Clear the memory of the stream rows where ``rows`` (B,) is True: their slots get document id -1 and are
    masked from then on, so nothing of the previous document reaches the next one.  With memory tokens, pass the
    model's initial tokens (``model.transformer.stack.memory_tokens``) as ``initial_tokens``: those rows restart from
    them.  Returns a new memory."""
    if memory is None or not bool(rows.any()):
        return memory
    return memory.reset_rows(rows, initial_tokens)
