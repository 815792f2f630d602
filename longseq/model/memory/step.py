"""The step of one forward pass over a hidden-state memory (see :mod:`longseq.model.memory.policy`)."""

from __future__ import annotations

import torch
from torch import Tensor

from longseq.model.memory.policy import LayerContext, Update
from longseq.model.memory.state import LayerMemory, Memory, Recurrence


class HiddenStep:
    """One forward pass over a hidden-state memory: each layer attends to [compressed; memory; segment]."""

    def __init__(self, policies, memory: Memory, batch: int, qlen: int, recurrence: Recurrence,
                 doc_ids: Tensor | None, training: bool, device: torch.device, layers) -> None:  # fmt: skip
        if recurrence.same_length and recurrence.mem_len < 1:
            raise ValueError("same_length=True needs mem_len >= 1: it limits every query to the last mem_len keys")
        self.policies, self.memory, self.recurrence = policies, memory, recurrence
        self.batch, self.qlen, self.training, self.device, self.layers = batch, qlen, training, device, layers
        self.mlen = memory.length
        self.doc_ids = doc_ids  # (B, T) of the segment, or None
        self.docs: tuple[Tensor, Tensor] | None = None  # (B, T') query and (B, K) key document ids
        self.with_mass = False
        self.inputs: list[Tensor] = []
        self.plain: list[Tensor | None] = []
        self.masses: list[Tensor | None] = []
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

    def relative_tables(self, positions, project) -> list:
        """The relative positions every layer receives: the shared ``positions`` object (each layer projects it
        inside its own forward; ``project`` is for key/value storage, which carries projected tables)."""
        return [positions(self.klen + 1)] * len(self.layers)

    def write(self, hidden: Tensor) -> tuple[Tensor, Memory, Tensor | None]:
        """The segment's output (B, T, E), the new memory and the policies' auxiliary loss (or None)."""
        update = Update(self.inputs, self.plain, self.masses, hidden)
        for policy in self.policies.active:
            policy.write(self, update)
        codec = self.policies.codec
        compressed = update.compressed or (None,) * len(update.kept)
        layers = tuple(LayerMemory(codec.encode(h), c) for h, c in zip(update.kept, compressed))
        memory = Memory(layers, "hidden", update.doc_ids, update.tokens, update.tokens_age)
        aux = torch.stack(update.aux_losses).mean() if update.aux_losses else None
        return update.hidden, memory, aux
