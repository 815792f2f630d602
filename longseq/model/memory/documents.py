"""Document tracking: the document id of every memory slot, so that no token attends to another document, in
the segment or in the memory (``doc_reset``), and per-stream resets of the memory (:func:`reset_rows`)."""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor

from longseq.model.memory.policy import MemoryPolicy, Update
from longseq.model.memory.state import Memory


class Documents(MemoryPolicy):
    """Query (B, T) and key (B, K) document ids for the masks, and the ids of the slots that stay.  Inactive
    (no ids anywhere) unless the segment comes with ``doc_ids`` or the memory has them."""

    def __init__(self, cmem_rate: int, cmem_len: int) -> None:
        super().__init__()
        self.cmem_rate, self.cmem_len = cmem_rate, cmem_len

    def begin(self, step) -> None:
        mem_docs, doc_ids = step.memory.doc_ids, step.doc_ids
        if doc_ids is None and mem_docs is None:
            return
        batch, qlen = step.batch, step.qlen  # qlen counts memory tokens: they belong to no document of their own
        if doc_ids is not None and tuple(doc_ids.shape) != (batch, qlen):
            raise ValueError(f"doc_ids must have the input's shape {(batch, qlen)}, got {tuple(doc_ids.shape)}")
        query = (
            doc_ids.long() if doc_ids is not None else torch.zeros(batch, qlen, dtype=torch.long, device=step.device)
        )
        if mem_docs is None:  # memory without ids continues the segment's first document
            mem_docs = query[:, :1].expand(batch, step.mlen)
        step.docs = (query, torch.cat([mem_docs, query], dim=1))

    def write(self, step, update: Update) -> None:
        if step.docs is None:
            return
        update.last_doc = step.docs[0][:, -1]  # recurrent layers' states belong to it
        key_docs = step.docs[1]  # (B, C + M + T) in memory order, memory tokens removed
        cmem = step.memory.cmem_length
        cmem_docs, mem_docs = key_docs[:, :cmem], key_docs[:, cmem:]
        evicted, mem_docs = mem_docs[:, : update.n_evicted], mem_docs[:, update.n_evicted :]
        if not self.cmem_len:
            update.doc_ids = mem_docs
            return
        if update.n_evicted:
            group_last = evicted[:, min(self.cmem_rate, update.n_evicted) - 1 :: self.cmem_rate]  # newest of a group
            if group_last.size(1) < update.compressed[0].size(1) - cmem_docs.size(1):
                group_last = torch.cat([group_last, evicted[:, -1:]], dim=1)
            cmem_docs = torch.cat([cmem_docs, group_last], dim=1)[:, -self.cmem_len :]
        update.doc_ids = torch.cat([cmem_docs, mem_docs], dim=1)


def reset_rows(memory: Memory | None, rows: Tensor, initial_tokens: Tensor | None = None) -> Memory | None:
    """Clear the memory of the stream rows where ``rows`` (B,) is True: their slots get document id -1 and are
    masked from then on, so nothing of the previous document reaches the next one.  With memory tokens, pass the
    model's initial tokens (``model.transformer.memory_tokens``) as ``initial_tokens``: those rows restart from
    them.  Returns a new memory."""
    if memory is None or not bool(rows.any()):
        return memory
    if memory.storage != "hidden":
        raise ValueError("document resets need the hidden-state memory, not a key/value memory")
    doc = memory.doc_ids
    if doc is None:
        doc = torch.zeros(rows.size(0), memory.length, dtype=torch.long, device=rows.device)
    tokens = memory.tokens
    if tokens is not None:
        if initial_tokens is None:
            raise ValueError("this memory carries memory tokens: pass initial_tokens=model.transformer.memory_tokens")
        tokens = torch.where(rows[:, None, None], initial_tokens.to(tokens.dtype).expand_as(tokens), tokens)
    layers = tuple(  # a recurrent layer's state restarts from zeros, as at the start of a stream
        replace(layer, state=_zero_rows(layer.state, rows), inner=reset_rows(layer.inner, rows))
        for layer in memory.layers
    )
    last = None if memory.last_doc is None else memory.last_doc.masked_fill(rows, -1)
    return replace(memory, layers=layers, doc_ids=doc.masked_fill(rows[:, None], -1), tokens=tokens, last_doc=last)


def _zero_rows(state: tuple | None, rows: Tensor) -> tuple | None:
    """The state's floating tensors with the chosen rows zeroed (counters and document ids stay)."""
    if state is None:
        return None
    return tuple(t.masked_fill(rows.view(-1, *[1] * (t.dim() - 1)), 0) if t.is_floating_point() else t for t in state)
