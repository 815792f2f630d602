"""The memory step, declared: what a layer stack gives the memory for one forward pass and what it gets back; and
the policies that decide what the memory keeps.

A forward pass opens one step on the memory it was given (:meth:`~longseq.model.memory.compose.MemoryPolicies.begin`,
with a :class:`StepInputs`).  The stack then:

1. lets the step lay out the embedded segment (:meth:`MemoryStep.wrap`: memory tokens around it) and the global
   flags (:meth:`MemoryStep.wrap_flags`);
2. reads :meth:`MemoryStep.mask_inputs` once, for the layers' attention masks (sizes, documents, dropped slots);
3. asks for the relative tables a key/value memory carries (:meth:`MemoryStep.carried_tables`, else it projects
   them and hands them over with :meth:`MemoryStep.carry_tables`);
4. for every attention layer, reads its context (:meth:`MemoryStep.read`, an attention context of
   :mod:`~longseq.model.memory.context`), runs the layer and records its keys and values
   (:meth:`MemoryStep.record`); a recurrent layer gets its own state from the stack, not from the step;
5. gets the new memory back from :meth:`MemoryStep.write`, which it hands the recurrent layers' new states.

The step never sees the layers: it knows only which of them attend (``StepInputs.attends``).  Two steps implement
the protocol: :class:`~longseq.model.memory.step.HiddenStep` (hidden states, every compaction policy) and
:class:`~longseq.model.memory.cache.KeyValueStep` (projected keys and values, evaluation and generation).

The hidden-state step asks its policies, in this order, each for a typed result:

    policy       file          at the start                   at the end
    tokens       tokens.py     positions: 2n more             strip: the segment's outputs -> WrittenTokens
    selection    truncate.py   -                              select -> Selection (kept, n_evicted)
                 prune.py      needs_mass: every layer's
                               attention mass of its keys
    compression  compress.py   read: [compressed; memory]     compress(Selection) -> Compressed
    documents    documents.py  begin: query and key ids       write(Selection, Compressed) -> SlotDocuments
    dropout      dropout.py    draw: the keys hidden          -

The storage codec (float, or 8 bits: quantize.py) encodes what is kept and decodes what is read.  A new policy
takes one of these roles (a new selection rule is a class with ``needs_mass`` and ``select``) in a file of its own,
switched on by a config field in :func:`longseq.model.memory.compose.build_policies`.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import torch
from torch import Tensor

from longseq.config.model import Recurrence
from longseq.model.memory.state import LayerState, Memory


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
    """What the stack reads of a step for the layers' attention masks (:class:`~longseq.model.attention.PatternMask`)
    and for their rotary positions (:class:`~longseq.model.positions.Rotation`)."""

    qlen: int  # positions the layers see: the segment, and memory tokens around it
    mlen: int  # memory positions before them (compressed and plain)
    span: int | None  # with same_length, the keys every query sees
    query_docs: Tensor | None  # (B, T') document of every query
    key_docs: Tensor | None  # (B, K) document of every key
    dropped_keys: Tensor | None  # (B, K) keys memory dropout hides this pass
    sinks: int = 0  # the first keys of the pass that are the stream's first positions (attention sinks): every
    # query sees them
    gap: int = 0  # positions of the stream evicted between the sinks and the memory
    position: int = 0  # where the segment starts in the stream (the positions read before it)


def sink_keys(recurrence: Recurrence, memory: Memory, klen: int) -> tuple[int, int, int]:
    """What the masks and positions read of a pass over ``klen`` keys after ``memory``: its sinks (the first keys,
    the stream's first positions), the positions evicted between them and the memory, and where the segment starts
    in the stream."""
    sinks = min(recurrence.sinks, klen)
    return sinks, max(0, memory.position - memory.length) if sinks else 0, memory.position


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
    """One forward pass over a memory (see the module docstring for the order of the calls).  ``caches_keys``: the
    memory holds the attention layers' keys (as rotary positions turn them, where they do not depend on the pass),
    not their inputs."""

    caches_keys: bool

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

    def read(self, layer: int, hidden: Tensor):
        """Attention layer ``layer``'s context (:mod:`~longseq.model.memory.context`); ``hidden`` (B, T', E) is
        the layer's input, kept for the update."""

    def record(self, layer: int, present: tuple[Tensor, Tensor], mass: Tensor | None) -> None:
        """What attention layer ``layer`` returned: keys and values of [memory; segment] (B, H, K, D), and the
        attention mass of every key when its context asked for it."""

    def write(self, hidden: Tensor, states: dict[int, LayerState]) -> StepOutput:
        """The new memory after the last layer, whose output (B, T', E) is ``hidden``; ``states`` holds the new
        state of every recurrent layer, by index."""


class WrittenTokens(NamedTuple):
    """What the memory tokens leave at the end of a pass: the segment's outputs and layer inputs without the
    tokens, the documents of its positions, and the written tokens with the segments their graph spans."""

    hidden: Tensor  # (B, T, E)
    inputs: list[Tensor | None]  # per layer (B, T, E), None for a recurrent layer
    docs: tuple[Tensor, Tensor] | None
    tokens: Tensor  # (B, n, E)
    age: int


class Selection(NamedTuple):
    """The new plain memory of every attention layer (B, M', E) (None for a recurrent layer), and how many
    positions of [memory; segment] left it (the same in every layer)."""

    kept: tuple[Tensor | None, ...]
    n_evicted: int


class Compressed(NamedTuple):
    """The new compressed memory of every layer (B, C', E), and the learned compressors' targets."""

    compressed: tuple[Tensor, ...]
    reconstructions: tuple[Reconstruction, ...] = ()


class SlotDocuments(NamedTuple):
    """The document of every slot of the new memory (B, C' + M'), and of the segment's last position (B,)."""

    doc_ids: Tensor
    last_doc: Tensor
