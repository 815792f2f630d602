"""The step of one forward pass over a hidden-state memory (see :mod:`longseq.model.memory.policy`)."""

from __future__ import annotations

import torch
from torch import Tensor

from longseq.model.memory.policy import LayerContext, Update
from longseq.model.memory.state import LayerMemory, Memory, Recurrence


class HiddenStep:
    """One forward pass over a hidden-state memory: each attention layer attends to [compressed; memory; segment];
    each recurrent layer (ssm, conv, rnn) continues from its state."""

    def __init__(self, policies, memory: Memory, batch: int, qlen: int, recurrence: Recurrence,
                 doc_ids: Tensor | None, training: bool, device: torch.device, layers) -> None:  # fmt: skip
        if recurrence.same_length and recurrence.mem_len < 1:
            raise ValueError("same_length=True needs mem_len >= 1: it limits every query to the last mem_len keys")
        self.policies, self.memory, self.recurrence = policies, memory, recurrence
        self.batch, self.qlen, self.training, self.device, self.layers = batch, qlen, training, device, layers
        self.mlen = memory.length
        self.doc_ids = doc_ids  # (B, T) of the segment, or None
        self.docs: tuple[Tensor, Tensor] | None = None  # (B, T') query and (B, K) key document ids
        self.dropped_keys: Tensor | None = None  # (B, K) keys hidden by memory dropout, drawn once per forward
        self.with_mass = False
        self.inputs: list[Tensor] = []
        self.plain: list[Tensor | None] = []
        self.masses: list[Tensor | None] = []
        self.attends = [hasattr(layer, "dec_attn") for layer in layers]  # the others carry a state
        self.states: dict[int, LayerMemory] = {}
        for policy in policies.active:
            policy.begin(self)

    @property
    def klen(self) -> int:
        return self.mlen + self.qlen

    @property
    def span(self) -> int | None:
        """With ``same_length``, the keys every query sees."""
        r = self.recurrence
        return r.mem_len + self.policies.config.memory.cmem_len if r.same_length else None

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

    def read(self, i: int, hidden: Tensor) -> LayerContext:
        """Layer ``i``'s context; ``hidden`` (B, T', E) is the layer's input, kept for the update."""
        if not self.attends[i]:
            self.inputs.append(None)
            self.plain.append(None)
            stored = self.layer(i)
            return LayerContext(
                state=stored.state, docs=self.state_docs(), inner=stored.inner, recurrence=self.recurrence
            )
        self.inputs.append(hidden)
        stored = self.layer(i).hidden
        plain = None if stored is None or stored.size(1) == 0 else self.policies.codec.decode(stored, hidden.dtype)
        self.plain.append(plain)  # dequantized once, reused by the update
        context = LayerContext(memory=plain, with_mass=self.with_mass)
        for policy in self.policies.active:
            context = policy.read(self, i, context)
        return context

    def record(self, i: int, present, mass: Tensor | None) -> None:
        self.masses.append(mass)
        if not self.attends[i]:
            self.states[i] = present

    def state_docs(self) -> tuple | None:
        """(document of every position (B, T), document of the last position before the segment (B,)), or None."""
        if self.docs is None:
            return None
        query = self.docs[0]
        last = self.memory.last_doc if self.memory.last_doc is not None else query[:, 0]  # no ids: continue
        return query, last

    def relative_tables(self, positions, project) -> list:
        """The relative positions every layer receives: the shared ``positions`` object (each layer projects it
        inside its own forward; ``project`` is for key/value storage, which carries projected tables)."""
        return [positions(self.klen + 1)] * len(self.layers)

    def write(self, hidden: Tensor) -> tuple[Tensor, Memory, Tensor | None]:
        """The segment's output (B, T, E), the new memory and the policies' auxiliary loss (or None)."""
        update = Update(self.inputs, self.plain, self.masses, hidden)
        for policy in self.policies.active:
            policy.write(self, update)
        codec, keep_graph = self.policies.codec, self.training and self.policies.config.mixers.state_bptt > 1
        compressed = update.compressed or (None,) * len(update.kept)
        layers = tuple(
            LayerMemory(codec.encode(h), c) if h is not None else self._state(i, keep_graph)
            for i, (h, c) in enumerate(zip(update.kept, compressed))
        )
        memory = Memory(layers, "hidden", doc_ids=update.doc_ids, last_doc=update.last_doc, tokens=update.tokens,
                        tokens_age=update.tokens_age)  # fmt: skip
        aux = torch.stack(update.aux_losses).mean() if update.aux_losses else None
        return update.hidden, memory, aux

    def _state(self, i: int, keep_graph: bool) -> LayerMemory:
        """A recurrent layer's new state: stop-gradient unless it back-propagates through several segments."""
        made = self.states[i]
        return LayerMemory(state=tuple(t if keep_graph else t.detach() for t in made.state), inner=made.inner)
