"""The memory step, declared: what a layer stack gives the memory for one forward pass and what it gets back; and
the policies that decide what the memory keeps.

A forward pass opens one step on the memory it was given (:meth:`~longseq.model.memory.compose.MemoryPolicies.begin`,
with a :class:`StepInputs`).  The stack then:

1. lets the step lay out the embedded segment (:meth:`MemoryStep.wrap`: memory tokens around it) and the global
   flags (:meth:`MemoryStep.wrap_flags`);
2. reads :meth:`MemoryStep.mask_inputs` once, for the layers' attention masks (sizes, documents, dropped slots);
3. asks for the relative tables a key/value memory carries (:meth:`MemoryStep.carried_tables`, else it projects
   them and hands them over with :meth:`MemoryStep.carry_tables`);
4. for every layer, reads its :class:`LayerContext` (:meth:`MemoryStep.read`), runs the layer and records its
   output (:meth:`MemoryStep.record`);
5. gets the new memory back from :meth:`MemoryStep.write` as a :class:`StepOutput`.

The step never sees the layers: it knows only which of them attend (``StepInputs.attends``).  Two steps implement
the protocol: :class:`~longseq.model.memory.step.HiddenStep` (hidden states, every compaction policy) and
:class:`~longseq.model.memory.cache.KeyValueStep` (projected keys and values, evaluation and generation).

The hidden-state step applies small policies, each in its own file, in this order (hooks: ``begin``, ``wrap``,
``wrap_flags``, ``read``, ``write``; what each reads and writes of the step and the :class:`Update`):

    policy       file          begin writes        read changes        write reads -> writes
    tokens       tokens.py     step.qlen (+2n)     -                   update.hidden, inputs -> tokens, tokens_age
    selection    truncate.py   -                   -                   inputs, plain -> kept, n_evicted
                 prune.py      step.with_mass      -                   inputs, plain, masses -> kept, n_evicted
    compression  compress.py   -                   context.memory      inputs, plain, n_evicted -> compressed,
                                                   ([compressed; M])   reconstructions
    documents    documents.py  step.docs           -                   step.docs, n_evicted -> doc_ids, last_doc
    dropout      dropout.py    step.dropped_keys   -                   -

The storage codec (float, or 8 bits: quantize.py) encodes what is kept and decodes what is read.  A new policy is
a subclass of :class:`MemoryPolicy` in a file of its own, switched on by a config field in
:func:`longseq.model.memory.compose.build_policies`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

import torch
from torch import Tensor, nn

from longseq.model.memory.state import Memory, Recurrence


class StepInputs(NamedTuple):
    """What a stack gives :meth:`~longseq.model.memory.compose.MemoryPolicies.begin` for one forward pass."""

    memory: Memory  # what the previous segment left
    batch: int  # B
    qlen: int  # T, the segment's positions
    recurrence: Recurrence  # mem_len, clamp_len, same_length of this call
    doc_ids: Tensor | None  # (B, T) document of every position, or None
    training: bool
    device: torch.device
    attends: tuple[bool, ...]  # per layer: True reads [memory; segment] by attention, False carries a state


class MaskInputs(NamedTuple):
    """What the stack reads of a step for the layers' attention masks (:class:`~longseq.model.attention.PatternMask`)."""

    qlen: int  # positions the layers see: the segment, and memory tokens around it
    mlen: int  # memory positions before them (compressed and plain)
    span: int | None  # with same_length, the keys every query sees
    query_docs: Tensor | None  # (B, T') document of every query
    key_docs: Tensor | None  # (B, K) document of every key
    dropped_keys: Tensor | None  # (B, K) keys memory dropout hides this pass


@dataclass
class LayerContext:
    """What one layer reads from the memory: an attention layer attends to hidden states (B, C + M, E), or to a
    key/value ``cache`` ((keys, values) of (B, H, M, D), ``()`` for none yet, or a ring), and ``with_mass`` asks it
    for the attention mass of every key; a recurrent layer (ssm, conv, rnn) continues from its ``state``, with
    ``docs`` = (document of every position (B, T), document of the last position before the segment (B,)) when
    documents are tracked."""

    memory: Tensor | None = None
    cache: object | None = None
    with_mass: bool = False
    state: tuple | None = None
    docs: tuple | None = None
    inner: Memory | None = None  # an hourglass block's memory of its shortened layers
    phase: int = 0  # an hourglass block's position in its current group (host: no read of the device)
    recurrence: Recurrence | None = None  # the call's (an hourglass derives its shortened layers' from it)


class Reconstruction(NamedTuple):
    """A learned compressor's attention-reconstruction target for one layer (Rae et al., 2019): the stack scores
    it with that layer's attention weights (:meth:`~longseq.model.layers.DecoderLayer.reconstruction_loss`)."""

    layer: int
    hidden: Tensor  # (B, T, E) the segment's layer inputs
    old: Tensor  # (B, n, E) the evicted states
    compressed: Tensor  # (B, n / c, E) their compression, the only part that carries a gradient


class StepOutput(NamedTuple):
    """What :meth:`MemoryStep.write` gives back: the last layer's output for the segment (memory tokens stripped),
    the new memory, and the compressors' reconstruction targets (empty without learned compression)."""

    hidden: Tensor  # (B, T, E)
    memory: Memory
    reconstructions: tuple[Reconstruction, ...] = ()


class MemoryStep(Protocol):
    """One forward pass over a memory (see the module docstring for the order of the calls)."""

    def wrap(self, hidden: Tensor) -> Tensor:
        """The embedded segment (B, T, E) as the layers see it (B, T', E)."""

    def wrap_flags(self, flags: Tensor) -> Tensor:
        """Per-position flags (B, T) laid out as :meth:`wrap` lays out the segment."""

    def mask_inputs(self) -> MaskInputs:
        """Sizes, documents and dropped slots for the attention masks."""

    def carried_tables(self, clamp_len: int, dtype: torch.dtype) -> list | None:
        """The projected relative tables (H, K + 1, D) per layer (None for a recurrent layer) that the memory
        carries, when they cover this pass; None when the stack must project them (:meth:`carry_tables`) or,
        for a hidden-state memory, when every layer projects the shared positions inside its own forward."""

    def table_rows(self) -> int | None:
        """Rows of relative positions the stack projects for :meth:`carry_tables`; None: the memory carries no
        tables, and every layer gets the shared positions of this pass."""

    def carry_tables(self, tables: list, clamp_len: int) -> list:
        """Keep projected ``tables`` (``table_rows()`` rows each) in the memory written, and return the rows
        this pass reads."""

    def read(self, layer: int, hidden: Tensor) -> LayerContext:
        """Layer ``layer``'s context; ``hidden`` (B, T', E) is the layer's input, kept for the update."""

    def record(self, layer: int, present, mass: Tensor | None) -> None:
        """What layer ``layer`` returned: keys and values of [memory; segment] (attention) or its new
        :class:`~longseq.model.memory.state.LayerMemory` (a recurrent layer), and the attention mass asked for."""

    def write(self, hidden: Tensor) -> StepOutput:
        """The new memory after the last layer, whose output (B, T', E) is ``hidden``."""


@dataclass
class Update:
    """The new memory under construction, filled in by the policies' ``write`` in order."""

    inputs: list[Tensor | None]  # per layer, the segment's layer inputs (B, T, E); None for a recurrent layer
    plain: list[Tensor | None]  # per layer, the dense memory the layer attended to (B, M, E), compressed part aside
    masses: list[Tensor | None]  # per layer, attention mass of every key (B, K) when asked for
    hidden: Tensor  # the last layer's output (B, T', E), memory tokens included until the tokens policy strips them
    kept: tuple[Tensor, ...] = ()  # per layer, the new plain memory (B, M', E)
    n_evicted: int = 0  # positions of [memory; segment] that left the plain memory
    compressed: tuple[Tensor, ...] | None = None
    doc_ids: Tensor | None = None
    last_doc: Tensor | None = None  # (B,) document of the segment's last position
    tokens: Tensor | None = None
    tokens_age: int = 0
    reconstructions: list[Reconstruction] = field(default_factory=list)


class MemoryPolicy(nn.Module):
    """A part of the memory's behaviour.  Every hook is optional; ``step`` is the forward pass's
    :class:`~longseq.model.memory.step.HiddenStep`.  A policy is an ``nn.Module`` so that it may own parameters
    (compressors, tokens)."""

    def begin(self, step) -> None:
        """Called once when a forward pass opens its step, before the embedding."""

    def wrap(self, step, hidden: Tensor) -> Tensor:
        """The embedded segment (B, T, E) as the layers will see it."""
        return hidden

    def wrap_flags(self, step, flags: Tensor) -> Tensor:
        """Per-position flags of the segment (B, T) (global tokens) laid out as :meth:`wrap` lays out tokens."""
        return flags

    def read(self, step, layer: int, context: LayerContext) -> LayerContext:
        """What layer ``layer`` attends to before the segment."""
        return context

    def write(self, step, update: Update) -> None:
        """Fill in this policy's part of the new memory."""
