"""The step of one forward pass over a hidden-state memory (the :class:`~longseq.model.memory.policy.MemoryStep`
protocol; the policies it applies are listed in :mod:`longseq.model.memory.policy`)."""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor

from longseq.model.memory.policy import LayerContext, MaskInputs, StepInputs, StepOutput, Update
from longseq.model.memory.state import LayerMemory, Memory


class HiddenStep:
    """One forward pass over a hidden-state memory: each attention layer attends to [compressed; memory; segment];
    each recurrent layer (ssm, conv, rnn) continues from its state.  The policies read and write the attributes
    set here (the table in :mod:`~longseq.model.memory.policy`)."""

    def __init__(self, policies, given: StepInputs) -> None:
        if given.recurrence.same_length and given.recurrence.mem_len < 1:
            raise ValueError("same_length=True needs mem_len >= 1: it limits every query to the last mem_len keys")
        self.policies, self.memory, self.recurrence = policies, given.memory, given.recurrence
        self.batch, self.qlen, self.training, self.device = given.batch, given.qlen, given.training, given.device
        self.attends = given.attends
        self.mlen = given.memory.length
        self.doc_ids = given.doc_ids  # (B, T) of the segment, or None
        self.docs: tuple[Tensor, Tensor] | None = None  # (B, T') query and (B, K) key document ids
        self.dropped_keys: Tensor | None = None  # (B, K) keys hidden by memory dropout, drawn once per forward
        self.with_mass = False
        self.inputs: list[Tensor | None] = []
        self.plain: list[Tensor | None] = []
        self.masses: list[Tensor | None] = []
        self.states: dict[int, LayerMemory] = {}
        for policy in policies.active:
            policy.begin(self)

    @property
    def klen(self) -> int:
        return self.mlen + self.qlen

    def layer(self, i: int) -> LayerMemory:
        return self.memory.layers[i] if self.memory.layers else LayerMemory()

    def wrap(self, hidden: Tensor) -> Tensor:
        for policy in self.policies.active:
            hidden = policy.wrap(self, hidden)
        return hidden

    def wrap_flags(self, flags: Tensor) -> Tensor:
        for policy in self.policies.active:
            flags = policy.wrap_flags(self, flags)
        return flags

    def mask_inputs(self) -> MaskInputs:
        r = self.recurrence
        span = r.mem_len + self.policies.config.memory.cmem_len if r.same_length else None
        query_docs, key_docs = self.docs if self.docs is not None else (None, None)
        return MaskInputs(self.qlen, self.mlen, span, query_docs, key_docs, self.dropped_keys)

    def carried_tables(self, clamp_len: int, dtype: torch.dtype) -> None:
        return None  # every layer projects the shared positions inside its own forward

    def table_rows(self) -> None:
        return None

    def carry_tables(self, tables: list, clamp_len: int) -> list:
        return tables

    def read(self, layer: int, hidden: Tensor) -> LayerContext:
        if not self.attends[layer]:
            self.inputs.append(None)
            self.plain.append(None)
            stored = self.layer(layer)
            return LayerContext(
                state=stored.state,
                docs=self.state_docs(),
                inner=stored.inner,
                phase=stored.phase,
                recurrence=self.recurrence,
            )
        self.inputs.append(hidden)
        stored = self.layer(layer).hidden
        plain = None if stored is None or stored.size(1) == 0 else self.policies.codec.decode(stored, hidden.dtype)
        self.plain.append(plain)  # dequantized once, reused by the update
        context = LayerContext(memory=plain, with_mass=self.with_mass)
        for policy in self.policies.active:
            context = policy.read(self, layer, context)
        return context

    def record(self, layer: int, present, mass: Tensor | None) -> None:
        self.masses.append(mass)
        if not self.attends[layer]:
            self.states[layer] = present

    def state_docs(self) -> tuple | None:
        """(document of every position (B, T), document of the last position before the segment (B,)), or None."""
        if self.docs is None:
            return None
        query = self.docs[0]
        last = self.memory.last_doc if self.memory.last_doc is not None else query[:, 0]  # no ids: continue
        return query, last

    def write(self, hidden: Tensor) -> StepOutput:
        update = Update(self.inputs, self.plain, self.masses, hidden)
        for policy in self.policies.active:
            policy.write(self, update)
        codec, keep_graph = self.policies.codec, self.training and self.policies.config.mixers.state_bptt > 1
        compressed = update.compressed or (None,) * len(update.kept)
        layers = tuple(
            LayerMemory(codec.encode(h), c) if h is not None else self._state(i, keep_graph)
            for i, (h, c) in enumerate(zip(update.kept, compressed))
        )
        memory = Memory(
            layers,
            "hidden",
            doc_ids=update.doc_ids,
            last_doc=update.last_doc,
            tokens=update.tokens,
            tokens_age=update.tokens_age,
        )
        return StepOutput(update.hidden, memory, tuple(update.reconstructions))

    def _state(self, i: int, keep_graph: bool) -> LayerMemory:
        """A recurrent layer's new state: stop-gradient unless it back-propagates through several segments."""
        made = self.states[i]
        return replace(made, state=tuple(t if keep_graph else t.detach() for t in made.state))
