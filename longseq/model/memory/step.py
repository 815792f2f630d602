"""The step of one forward pass over a hidden-state memory (the :class:`~longseq.model.memory.policy.MemoryStep`
protocol; the policies it asks, and in which order, are listed in :mod:`longseq.model.memory.policy`)."""

from __future__ import annotations

import torch
from torch import Tensor

from longseq.model.memory.context import HiddenContext
from longseq.model.memory.policy import MaskInputs, StepInputs, StepOutput, sink_keys
from longseq.model.memory.state import HiddenMemory, LayerState, Memory


class HiddenStep:
    """One forward pass over a hidden-state memory: each attention layer attends to [compressed; memory; segment].
    The policies read the attributes set here (sizes, the call's recurrence, the memory it continues)."""

    caches_keys = False  # the memory holds the layers' inputs

    def __init__(self, policies, given: StepInputs) -> None:
        if given.recurrence.same_length and given.recurrence.mem_len < 1:
            raise ValueError("same_length=True needs mem_len >= 1: it limits every query to the last mem_len keys")
        self.policies, self.config, self.memory = policies, policies.config, given.memory
        self.recurrence, self.batch, self.qlen = given.recurrence, given.batch, given.qlen
        self.training, self.device, self.attends = given.training, given.device, given.attends
        self.mlen = given.memory.length
        # the positions of the stream read after this pass, counted where sinks read them (the gap after the sinks);
        # 0 otherwise, so that a memory of hidden states keeps one structure from step to step (torch.export,
        # torch.compile)
        self.position = given.memory.position + given.qlen if given.recurrence.sinks else 0
        self.doc_ids = given.doc_ids  # (B, T) of the segment, or None
        if given.recurrence.sinks and (given.doc_ids is not None or given.memory.doc_ids is not None):
            raise ValueError(
                f"sinks={given.recurrence.sinks} keeps the first positions of one stream: documents kept apart "
                "(doc_reset, document ids) have a start each; read them without sinks"
            )
        tokens, selection = policies.tokens, policies.selection
        if tokens is not None:
            tokens.check(self)
            self.qlen += 2 * tokens.n  # the layers see [read tokens; segment; write tokens]
        selection.check(self)
        self.with_mass = selection.needs_mass
        self.docs = policies.documents.begin(self)  # (B, T') query and (B, K) key document ids, or None
        self.dropped_keys = None if policies.dropout is None else policies.dropout.draw(self)  # (B, K), once
        n = len(given.attends)
        self.inputs: list[Tensor | None] = [None] * n  # per attention layer, its input (B, T', E)
        self.plain: list[Tensor | None] = [None] * n  # the dense memory it attended to, compressed part aside
        self.masses: list[Tensor | None] = [None] * n  # the attention mass of its keys, when asked for

    @property
    def klen(self) -> int:
        return self.mlen + self.qlen

    def layer(self, i: int) -> HiddenMemory | None:
        return self.memory.layers[i] if self.memory.layers else None

    def wrap(self, hidden: Tensor) -> Tensor:
        tokens = self.policies.tokens
        return hidden if tokens is None else tokens.wrap(self, hidden)

    def wrap_flags(self, flags: Tensor) -> Tensor:
        tokens = self.policies.tokens
        return flags if tokens is None else tokens.wrap_flags(flags)

    def mask_inputs(self) -> MaskInputs:
        r = self.recurrence
        span = r.mem_len + self.config.memory.cmem_len if r.same_length else None
        query_docs, key_docs = self.docs if self.docs is not None else (None, None)
        sinks = sink_keys(r, self.memory, self.klen)
        return MaskInputs(self.qlen, self.mlen, span, query_docs, key_docs, self.dropped_keys, *sinks)

    def carried_tables(self, clamp_len: int, dtype: torch.dtype) -> None:
        return None  # every layer projects the shared positions inside its own forward

    def table_rows(self) -> None:
        return None

    def carry_tables(self, tables: list, clamp_len: int) -> list:
        return tables

    def read(self, layer: int, hidden: Tensor) -> HiddenContext:
        self.inputs[layer] = hidden
        stored = self.layer(layer)
        plain = (
            None if stored is None or stored.length == 0 else self.policies.codec.decode(stored.hidden, hidden.dtype)
        )
        self.plain[layer] = plain  # dequantized once, reused by the update
        compression = self.policies.compression
        memory = plain if compression is None else compression.read(self, layer, plain)
        return HiddenContext(memory, self.with_mass)

    def record(self, layer: int, present, mass: Tensor | None) -> None:
        self.masses[layer] = mass

    def write(self, hidden: Tensor, states: dict[int, LayerState]) -> StepOutput:
        policies, inputs, docs, written = self.policies, self.inputs, self.docs, None
        if policies.tokens is not None:
            written = policies.tokens.strip(self, hidden, inputs, docs)
            hidden, inputs, docs = written.hidden, written.inputs, written.docs
        selection = policies.selection.select(self, inputs, self.plain, self.masses)
        compressed = (
            None if policies.compression is None else policies.compression.compress(self, inputs, self.plain, selection)
        )
        documents = policies.documents.write(self, docs, selection, compressed)
        older = compressed.compressed if compressed is not None else (None,) * len(selection.kept)
        layers = tuple(
            HiddenMemory(policies.codec.encode(kept), c) if attends else states[i]
            for i, (attends, kept, c) in enumerate(zip(self.attends, selection.kept, older))
        )
        memory = Memory(
            layers,
            HiddenMemory,
            doc_ids=None if documents is None else documents.doc_ids,
            last_doc=None if documents is None else documents.last_doc,
            tokens=None if written is None else written.tokens,
            tokens_age=0 if written is None else written.age,
            position=self.position,
        )
        return StepOutput(hidden, memory, () if compressed is None else compressed.reconstructions)
