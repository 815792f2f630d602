"""The recurrence memory as one immutable object: what a forward pass hands to the next.

A :class:`Memory` holds one small frozen object per layer, of the kind that layer keeps (as transformers 5's
``cache_utils`` has one class per kind of layer cache):

* :class:`HiddenMemory`: an attention layer's inputs of the last M positions (B, M, E), as floats or 8-bit
  :class:`~longseq.model.memory.quantize.Quantized`, and the Compressive Transformer's older compressed states
  (B, C, E) (training, and every compaction policy);
* :class:`KVMemory`: an attention layer's projected keys and values (B, H, M, D) (evaluation), so the memory is
  never projected twice; :class:`RingMemory` keeps them in preallocated ring buffers (generation);
* :class:`RecurrentState`: a recurrent layer's state (ssm, conv, rnn mixers; the LSTM baseline);
* :class:`HourglassState`: an hourglass block's state, with the memory of its shortened layers.

Every kind has the same small interface (:class:`LayerState`): ``length``, ``to``, ``detach``, ``split``, ``join``,
``select`` and its own checkpoint tensors; :class:`Memory` loops over them.  Beside the layers: the document id of
every slot, the memory tokens written by the last segment, and (key/value memories) the projected relative table,
carried so that W_R R is not projected again either.

``forward`` never changes a memory; it returns a new one.  By default everything but the memory tokens is
detached: no gradient reaches an earlier segment (the paper's SG(.)).  In training, ``mem_bptt``, ``state_bptt``
and ``mem_tokens_bptt`` > 1 keep the graph, which the caller cuts with :meth:`Memory.detach` every that many
segments.  ``memory[i]`` is layer i's hidden-state memory (B, M, E), as in the paper's ``mems`` list.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import ClassVar, Protocol

import torch
from torch import Tensor

from longseq.model.memory.quantize import Quantized, dense, join_rows, split_rows


class LayerState(Protocol):
    """What every kind of layer state offers :class:`Memory` (each returns a new object)."""

    attends: ClassVar[bool]  # the state of an attention layer (read by attention) or of a recurrent one

    @property
    def length(self) -> int:
        """Positions an attention layer sees before the segment (plain memory; 0 for a recurrent state)."""

    def to(self, device) -> LayerState: ...

    def detach(self) -> LayerState: ...

    def split(self, chunks: int) -> list[LayerState]:
        """The state cut along the batch (stream) axis into ``chunks`` parts."""

    @classmethod
    def join(cls, parts: Sequence[LayerState]) -> LayerState:
        """Inverse of :meth:`split`."""

    def select(self, rows: Tensor) -> LayerState:
        """The state of the streams ``rows`` (B',) in that order (reordering, beam search)."""

    def all_tensors(self) -> list[Tensor]:
        """Every tensor the state holds (8-bit storage and integer states included)."""

    def float_tensors(self) -> list[Tensor]:
        """The tensors that hold states, which must be of the model's dtype."""

    def reset_rows(self, rows: Tensor) -> LayerState:
        """The state with streams ``rows`` (B,) bool restarted, as at the start of a stream."""

    def to_tensors(self, i: int) -> dict[str, Tensor]:
        """Named tensors of layer ``i`` for a checkpoint."""


def _rows(x: Tensor | None, rows: Tensor) -> Tensor | None:
    return None if x is None else x.index_select(0, rows.to(x.device))


def _cat(parts: Sequence[Tensor | None]) -> Tensor | None:
    return None if parts[0] is None else torch.cat(list(parts))


def _chunk(x: Tensor | None, chunks: int) -> list:
    return [None] * chunks if x is None else list(x.chunk(chunks, 0))


# --- attention layers ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HiddenMemory:
    """An attention layer's hidden-state memory: the last M layer inputs (B, M, E), floats or 8-bit, and the
    compressed states (B, C, E), older than them."""

    hidden: Tensor | Quantized
    compressed: Tensor | None = None
    attends: ClassVar[bool] = True

    @property
    def length(self) -> int:
        return self.hidden.size(1)

    @property
    def cmem_length(self) -> int:
        return 0 if self.compressed is None else self.compressed.size(1)

    def dense(self, dtype: torch.dtype = torch.float32) -> Tensor:
        """The plain memory (B, M, E) as floats (dequantized when stored in 8 bits)."""
        return dense(self.hidden, dtype) if isinstance(self.hidden, Quantized) else self.hidden

    def to(self, device) -> HiddenMemory:
        hidden = self.hidden
        if isinstance(hidden, Quantized):
            hidden = Quantized(hidden.values.to(device), hidden.scale.to(device))
        else:
            hidden = hidden.to(device)
        return HiddenMemory(hidden, None if self.compressed is None else self.compressed.to(device))

    def detach(self) -> HiddenMemory:
        return replace(self, hidden=self.hidden.detach() if isinstance(self.hidden, Tensor) else self.hidden)

    def split(self, chunks: int) -> list[HiddenMemory]:
        return [HiddenMemory(h, c) for h, c in zip(split_rows(self.hidden, chunks), _chunk(self.compressed, chunks))]

    @classmethod
    def join(cls, parts: Sequence[HiddenMemory]) -> HiddenMemory:
        return cls(join_rows([p.hidden for p in parts]), _cat([p.compressed for p in parts]))

    def select(self, rows: Tensor) -> HiddenMemory:
        hidden = self.hidden
        if isinstance(hidden, Quantized):
            hidden = Quantized(_rows(hidden.values, rows), _rows(hidden.scale, rows))
        else:
            hidden = _rows(hidden, rows)
        return HiddenMemory(hidden, _rows(self.compressed, rows))

    def all_tensors(self) -> list[Tensor]:
        stored = [self.hidden.values, self.hidden.scale] if isinstance(self.hidden, Quantized) else [self.hidden]
        return stored + ([] if self.compressed is None else [self.compressed])

    def float_tensors(self) -> list[Tensor]:
        return ([] if isinstance(self.hidden, Quantized) else [self.hidden]) + (
            [] if self.compressed is None else [self.compressed]
        )

    def reset_rows(self, rows: Tensor) -> HiddenMemory:
        return self  # its slots are masked by their document id (-1) instead

    def to_tensors(self, i: int) -> dict[str, Tensor]:
        if isinstance(self.hidden, Quantized):
            out = {f"memory.hidden_q.{i}": self.hidden.values, f"memory.hidden_scale.{i}": self.hidden.scale}
        else:
            out = {f"memory.hidden.{i}": self.hidden}
        return out if self.compressed is None else {**out, f"memory.compressed.{i}": self.compressed}

    @classmethod
    def from_tensors(cls, t: dict[str, Tensor], i: int) -> HiddenMemory | None:
        if f"memory.hidden_q.{i}" in t:
            hidden = Quantized(t[f"memory.hidden_q.{i}"], t[f"memory.hidden_scale.{i}"])
        elif f"memory.hidden.{i}" in t:
            hidden = t[f"memory.hidden.{i}"]
        else:
            return None
        return cls(hidden, t.get(f"memory.compressed.{i}"))


@dataclass(frozen=True)
class KVMemory:
    """An attention layer's projected keys and values of the last M positions (B, H, M, D), detached."""

    keys: Tensor
    values: Tensor
    attends: ClassVar[bool] = True

    @property
    def length(self) -> int:
        return self.keys.size(2)

    def to(self, device) -> KVMemory:
        return KVMemory(self.keys.to(device), self.values.to(device))

    def detach(self) -> KVMemory:
        return self

    def split(self, chunks: int) -> list[KVMemory]:
        return [KVMemory(k, v) for k, v in zip(self.keys.chunk(chunks, 0), self.values.chunk(chunks, 0))]

    @classmethod
    def join(cls, parts: Sequence[KVMemory]) -> KVMemory:
        return cls(torch.cat([p.keys for p in parts]), torch.cat([p.values for p in parts]))

    def select(self, rows: Tensor) -> KVMemory:
        return KVMemory(_rows(self.keys, rows), _rows(self.values, rows))

    def all_tensors(self) -> list[Tensor]:
        return [self.keys, self.values]

    float_tensors = all_tensors

    def reset_rows(self, rows: Tensor) -> KVMemory:
        raise ValueError("document resets need the hidden-state memory, not a key/value memory")

    def to_tensors(self, i: int) -> dict[str, Tensor]:
        raise ValueError("only a hidden-state memory is saved in checkpoints, not a key/value memory")


@dataclass(frozen=True)
class RingMemory:
    """An attention layer's keys and values in a :class:`~longseq.model.memory.cache.RingKV`, written in place:
    only the memory made at the ring's latest write (``version``) is valid."""

    ring: object  # a RingKV
    version: int
    attends: ClassVar[bool] = True

    @property
    def length(self) -> int:
        return self.ring.length

    @property
    def stale(self) -> bool:
        return self.ring.version != self.version

    def _refuse(self, what: str):
        raise ValueError(f"a ring memory is written in place and cannot be {what}; use KVMemory to keep several")

    def to(self, device) -> RingMemory:
        self._refuse("copied to another device")

    def detach(self) -> RingMemory:
        return self

    def split(self, chunks: int) -> list[RingMemory]:
        self._refuse("split across batch chunks")

    @classmethod
    def join(cls, parts: Sequence[RingMemory]) -> RingMemory:
        parts[0]._refuse("joined")

    def select(self, rows: Tensor) -> RingMemory:
        """The selected streams in a new ring (a copy: the old memory stays valid until its ring is written)."""
        return RingMemory(*self.ring.selected(rows))

    def all_tensors(self) -> list[Tensor]:
        return [] if self.ring.keys.storage is None else [self.ring.keys.storage, self.ring.values.storage]

    float_tensors = all_tensors

    def reset_rows(self, rows: Tensor) -> RingMemory:
        raise ValueError("document resets need the hidden-state memory, not a ring memory")

    def to_tensors(self, i: int) -> dict[str, Tensor]:
        raise ValueError("only a hidden-state memory is saved in checkpoints, not a ring memory")


# --- recurrent layers ---------------------------------------------------------------------------------------------


def _zero_rows(tensors: tuple[Tensor, ...], rows: Tensor) -> tuple[Tensor, ...]:
    """The floating tensors with the chosen rows zeroed (counters and document ids stay)."""
    return tuple(t.masked_fill(rows.view(-1, *[1] * (t.dim() - 1)), 0) if t.is_floating_point() else t for t in tensors)


def _state_tensors(t: dict[str, Tensor], i: int) -> tuple[Tensor, ...]:
    n = sum(k.startswith(f"memory.state.{i}.") for k in t)
    return tuple(t[f"memory.state.{i}.{j}"] for j in range(n))


@dataclass(frozen=True)
class RecurrentState:
    """A recurrent layer's state: the tuple of tensors its module returned (batch first)."""

    tensors: tuple[Tensor, ...]
    attends: ClassVar[bool] = False
    length: ClassVar[int] = 0

    def to(self, device) -> RecurrentState:
        return RecurrentState(tuple(t.to(device) for t in self.tensors))

    def detach(self) -> RecurrentState:
        return RecurrentState(tuple(t.detach() for t in self.tensors))

    def split(self, chunks: int) -> list[RecurrentState]:
        return [RecurrentState(parts) for parts in zip(*(t.chunk(chunks, 0) for t in self.tensors))]

    @classmethod
    def join(cls, parts: Sequence[RecurrentState]) -> RecurrentState:
        return cls(tuple(torch.cat(list(ts)) for ts in zip(*(p.tensors for p in parts))))

    def select(self, rows: Tensor) -> RecurrentState:
        return RecurrentState(tuple(_rows(t, rows) for t in self.tensors))

    def all_tensors(self) -> list[Tensor]:
        return list(self.tensors)

    def float_tensors(self) -> list[Tensor]:
        return [t for t in self.tensors if t.is_floating_point()]

    def reset_rows(self, rows: Tensor) -> RecurrentState:
        return RecurrentState(_zero_rows(self.tensors, rows))  # restarts from zeros, as at the start of a stream

    def to_tensors(self, i: int) -> dict[str, Tensor]:
        return {f"memory.state.{i}.{j}": tensor for j, tensor in enumerate(self.tensors)}

    @classmethod
    def from_tensors(cls, t: dict[str, Tensor], i: int) -> RecurrentState | None:
        return cls(held) if (held := _state_tensors(t, i)) else None


@dataclass(frozen=True)
class HourglassState:
    """An hourglass block's state (its last inputs, the upsampled vectors of its last group, its group's document),
    the memory of its shortened layers, and its position in the current group (``phase``, on the host)."""

    tensors: tuple[Tensor, ...]
    inner: Memory = field(default_factory=lambda: Memory())
    phase: int = 0
    attends: ClassVar[bool] = False
    length: ClassVar[int] = 0

    def to(self, device) -> HourglassState:
        return replace(self, tensors=tuple(t.to(device) for t in self.tensors), inner=self.inner.to(device))

    def detach(self) -> HourglassState:
        return replace(self, tensors=tuple(t.detach() for t in self.tensors), inner=self.inner.detach())

    def split(self, chunks: int) -> list[HourglassState]:
        parts = zip(*(t.chunk(chunks, 0) for t in self.tensors))
        return [HourglassState(p, m, self.phase) for p, m in zip(parts, self.inner.split(chunks))]

    @classmethod
    def join(cls, parts: Sequence[HourglassState]) -> HourglassState:
        """Inverse of :meth:`split`.  Inner memories of different lengths (a dynamic hourglass's parts read
        different numbers of chunks) are left-padded with empty slots, masked by document id -1."""
        tensors = tuple(torch.cat(list(ts)) for ts in zip(*(p.tensors for p in parts)))
        longest = max(p.inner.mem_length for p in parts)
        return cls(tensors, Memory.join([_left_padded(p.inner, longest) for p in parts]), parts[0].phase)

    def select(self, rows: Tensor) -> HourglassState:
        return replace(self, tensors=tuple(_rows(t, rows) for t in self.tensors), inner=self.inner.select(rows))

    def all_tensors(self) -> list[Tensor]:
        return list(self.tensors) + self.inner.all_tensors()

    def float_tensors(self) -> list[Tensor]:
        return [t for t in self.tensors if t.is_floating_point()] + self.inner.float_tensors()

    def reset_rows(self, rows: Tensor) -> HourglassState:
        return replace(self, tensors=_zero_rows(self.tensors, rows), inner=self.inner.reset_rows(rows))

    def to_tensors(self, i: int) -> dict[str, Tensor]:
        out = {f"memory.state.{i}.{j}": tensor for j, tensor in enumerate(self.tensors)}
        out.update({f"memory.inner.{i}/{k}": v for k, v in self.inner.to_tensors().items()})
        return {**out, f"memory.phase.{i}": torch.tensor(self.phase)}

    @classmethod
    def from_tensors(cls, t: dict[str, Tensor], i: int) -> HourglassState | None:
        prefix = f"memory.inner.{i}/"
        nested = {k[len(prefix) :]: v for k, v in t.items() if k.startswith(prefix)}
        held = _state_tensors(t, i)
        if f"memory.phase.{i}" not in t and not nested:
            return None
        phase = int(t[f"memory.phase.{i}"]) if f"memory.phase.{i}" in t else 0
        return cls(held, Memory.from_tensors(nested) or Memory(), phase)


def _left_padded(memory: Memory, length: int) -> Memory:
    """A hidden-state memory with document ids, with empty slots (zeros, document -1) before its own up to
    ``length``."""
    missing = length - memory.mem_length
    if missing == 0 or not memory.layers:
        return memory
    if memory.doc_ids is None or not all(isinstance(layer, HiddenMemory) for layer in memory.layers):
        raise ValueError(
            "only hidden-state memories with document ids can be padded to join memories of different lengths"
        )
    layers = tuple(
        HiddenMemory(
            torch.cat([layer.hidden.new_zeros(layer.hidden.size(0), missing, layer.hidden.size(2)), layer.hidden], 1)
        )
        for layer in memory.layers
    )
    docs = torch.cat([memory.doc_ids.new_full((memory.doc_ids.size(0), missing), -1), memory.doc_ids], dim=1)
    return replace(memory, layers=layers, doc_ids=docs)


# Checkpoint readers, in the order they claim a layer's tensors (an hourglass's state before a plain one).
SAVED_KINDS = (HourglassState, RecurrentState, HiddenMemory)


def _layer_indices(t: dict[str, Tensor]) -> list[int]:
    prefixes = ("memory.hidden.", "memory.hidden_q.", "memory.state.", "memory.phase.")
    found = {int(k.split(".")[2].split("/")[0]) for k in t if k.startswith(prefixes)}
    found |= {int(k.split("/")[0].split(".")[2]) for k in t if k.startswith("memory.inner.")}
    return sorted(found)


@dataclass(frozen=True)
class Memory:
    """The memory one forward pass hands to the next (see the module docstring).  Start from :meth:`empty`
    (or ``None``), or from a list of (B, M, E) tensors with :meth:`from_hidden`.

    ``kind`` is the kind of state the attention layers keep (:class:`HiddenMemory`, :class:`KVMemory` or
    :class:`RingMemory`): what an empty memory becomes, and how the next forward pass reads it."""

    layers: tuple[LayerState, ...] = ()
    kind: type = HiddenMemory
    doc_ids: Tensor | None = None  # (B, C + M): document of every slot, -1 where cleared
    last_doc: Tensor | None = None  # (B,): document of the last position read (recurrent layers' states belong to it)
    tokens: Tensor | None = None  # (B, n, E) memory tokens, written by the last segment (keep their graph)
    tokens_age: int = 0  # segments the tokens' graph spans
    table: tuple | None = None  # key/value memories: (per-layer (H, R, D) relative tables, their clamp_len)
    position: int = 0  # positions of the stream read so far (every row alike): where the next segment starts

    def __post_init__(self) -> None:
        if self.kind not in (HiddenMemory, KVMemory, RingMemory):
            raise ValueError(
                f"a memory's kind must be HiddenMemory, KVMemory or RingMemory (from longseq.model), got {self.kind!r}"
            )
        wrong = [i for i, layer in enumerate(self.layers) if layer.attends and not isinstance(layer, self.kind)]
        if wrong:
            raise ValueError(f"layers {wrong} of a {self.kind.__name__} memory hold another kind of state")

    @classmethod
    def empty(cls, kind: type = HiddenMemory) -> Memory:
        """An empty memory.  :class:`KVMemory` stores projected keys and values (evaluation: identical outputs,
        less work); :class:`RingMemory` keeps them in ring buffers that are never reallocated (generation)."""
        return cls(kind=kind)

    @classmethod
    def from_hidden(cls, states: Sequence[Tensor]) -> Memory:
        """A hidden-state memory from one (B, M, E) tensor per layer, detached."""
        if isinstance(states, Memory):
            return states
        return cls(tuple(HiddenMemory(s.detach()) for s in states))

    # --- sizes -----------------------------------------------------------------------------------------------

    @property
    def mem_length(self) -> int:
        """Positions of the (uncompressed) memory (of the attention layers; recurrent layers hold a state)."""
        return max([0, *(layer.length for layer in self.layers)])

    @property
    def cmem_length(self) -> int:
        return max([0, *(layer.cmem_length for layer in self.layers if isinstance(layer, HiddenMemory))])

    @property
    def length(self) -> int:
        """Positions a query of the next segment sees before the segment: compressed plus plain memory."""
        return self.cmem_length + self.mem_length

    @property
    def batch_size(self) -> int | None:
        tensors = self.all_tensors()
        return tensors[0].size(0) if tensors else None

    @property
    def nbytes(self) -> int:
        """Bytes held by the memory's tensors (hidden, compressed, keys and values, memory tokens)."""
        tensors = self.all_tensors() + ([] if self.tokens is None else [self.tokens])
        return sum(t.numel() * t.element_size() for t in tensors)

    def all_tensors(self) -> list[Tensor]:
        """Every tensor the layers' states hold (a ring's storage; 8-bit storage and integer states included)."""
        return [t for layer in self.layers for t in layer.all_tensors()]

    def float_tensors(self) -> list[Tensor]:
        return [t for layer in self.layers for t in layer.float_tensors()]

    # --- the paper's list of per-layer states ----------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.layers)

    def __getitem__(self, layer: int) -> Tensor:
        """Layer ``layer``'s hidden-state memory (B, M, E), dequantized if stored in 8 bits (a recurrent layer:
        its state's tensors); a slice gives a tuple of them."""
        if isinstance(layer, slice):
            return tuple(self[i] for i in range(len(self.layers))[layer])
        state = self.layers[layer]
        if isinstance(state, HiddenMemory):
            return state.dense()
        if isinstance(state, (RecurrentState, HourglassState)):
            return state.tensors
        raise ValueError(f"this {type(state).__name__} memory holds keys and values, not hidden states")

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    # --- transformations (each returns a new memory) ---------------------------------------------------------

    def _each(self, fn, **changed) -> Memory:
        return replace(self, layers=tuple(fn(layer) for layer in self.layers), **changed)

    def to(self, device) -> Memory:
        """The memory with every tensor on ``device`` (a checkpoint's memory is read on the CPU); a ring memory,
        written in place, is refused."""

        def move(t):
            return None if t is None else t.to(device)

        table = None if self.table is None else (tuple(map(move, self.table[0])), self.table[1])
        return self._each(
            lambda layer: layer.to(device),
            doc_ids=move(self.doc_ids),
            last_doc=move(self.last_doc),
            tokens=move(self.tokens),
            table=table,
        )

    def detach(self) -> Memory:
        """The memory with the graphs of the hidden states (``mem_bptt``), the memory tokens and the recurrent
        states cut (the end of a back-propagation window)."""
        tokens = None if self.tokens is None else self.tokens.detach()
        age = 0 if tokens is not None else self.tokens_age
        return self._each(lambda layer: layer.detach(), tokens=tokens, tokens_age=age)

    def split(self, chunks: int) -> list[Memory]:
        """The memory cut along the batch (stream) axis into ``chunks`` parts (gradient accumulation, ranks)."""
        per_layer = [layer.split(chunks) for layer in self.layers]
        docs, tokens, last = _chunk(self.doc_ids, chunks), _chunk(self.tokens, chunks), _chunk(self.last_doc, chunks)
        return [
            replace(
                self,
                layers=tuple(parts[i] for parts in per_layer),
                doc_ids=docs[i],
                tokens=tokens[i],
                last_doc=last[i],
            )
            for i in range(chunks)
        ]

    @classmethod
    def join(cls, parts: Sequence[Memory]) -> Memory:
        """Inverse of :meth:`split`."""
        first = parts[0]
        layers = tuple(type(layer).join([p.layers[i] for p in parts]) for i, layer in enumerate(first.layers))
        return replace(
            first,
            layers=layers,
            doc_ids=_cat([p.doc_ids for p in parts]),
            tokens=_cat([p.tokens for p in parts]),
            last_doc=_cat([p.last_doc for p in parts]),
        )

    def select(self, rows: Tensor) -> Memory:
        """The memory of the streams ``rows`` (B',) in that order: reordered, repeated or a subset (beam search)."""
        rows = rows.long()
        return self._each(
            lambda layer: layer.select(rows),
            doc_ids=_rows(self.doc_ids, rows),
            last_doc=_rows(self.last_doc, rows),
            tokens=_rows(self.tokens, rows),
        )

    def reset_rows(self, rows: Tensor, initial_tokens: Tensor | None = None) -> Memory:
        """The memory with the streams where ``rows`` (B,) is True cleared (see
        :func:`~longseq.model.memory.documents.reset_rows`)."""
        if self.kind is not HiddenMemory:
            raise ValueError("document resets need the hidden-state memory, not a key/value memory")
        doc = self.doc_ids
        if doc is None:
            doc = torch.zeros(rows.size(0), self.length, dtype=torch.long, device=rows.device)
        tokens = self.tokens
        if tokens is not None:
            if initial_tokens is None:
                raise ValueError(
                    "this memory carries memory tokens: pass initial_tokens=model.transformer.stack.memory_tokens"
                )
            tokens = torch.where(rows[:, None, None], initial_tokens.to(tokens.dtype).expand_as(tokens), tokens)
        last = None if self.last_doc is None else self.last_doc.masked_fill(rows, -1)
        return self._each(
            lambda layer: layer.reset_rows(rows),
            doc_ids=doc.masked_fill(rows[:, None], -1),
            tokens=tokens,
            last_doc=last,
        )

    # --- checkpoints -----------------------------------------------------------------------------------------

    def to_tensors(self) -> dict[str, Tensor]:
        """Flat, named CPU tensors for a checkpoint (safetensors); hidden-state memories only."""
        if self.kind is not HiddenMemory:
            raise ValueError("only a hidden-state memory is saved in checkpoints")
        out: dict[str, Tensor] = {}
        for i, layer in enumerate(self.layers):
            out.update(layer.to_tensors(i))
        extra = {"memory.doc_ids": self.doc_ids, "memory.tokens": self.tokens, "memory.last_doc": self.last_doc}
        out.update({k: v for k, v in extra.items() if v is not None})
        if self.position:
            out["memory.position"] = torch.tensor(self.position, dtype=torch.int64)
        return {k: v.detach().cpu().contiguous() for k, v in out.items()}

    @classmethod
    def from_tensors(cls, tensors: dict[str, Tensor], tokens_age: int = 0) -> Memory | None:
        """Inverse of :meth:`to_tensors` (None when the checkpoint holds no memory)."""
        indices = _layer_indices(tensors)
        if not indices and "memory.tokens" not in tensors:
            return None
        flat = {k: v for k, v in tensors.items() if not k.startswith("memory.inner.")}

        def layer(i: int) -> LayerState:
            for kind in SAVED_KINDS:
                found = kind.from_tensors(tensors if kind is HourglassState else flat, i)
                if found is not None:
                    return found
            raise ValueError(f"the checkpoint's memory holds no state for layer {i}")

        return cls(
            tuple(layer(i) for i in indices),
            doc_ids=flat.get("memory.doc_ids"),
            tokens=flat.get("memory.tokens"),
            tokens_age=tokens_age,
            last_doc=flat.get("memory.last_doc"),
            position=int(flat["memory.position"]) if "memory.position" in flat else 0,
        )

    # --- checks ----------------------------------------------------------------------------------------------

    def check_dtype(self, dtype: torch.dtype, autocast: bool = False) -> None:
        """Raise ``ValueError`` naming the layer when a state tensor is not of the model's ``dtype``; under
        ``autocast`` any float16, bfloat16 or float32."""
        allowed = (torch.float16, torch.bfloat16, torch.float32) if autocast else (dtype,)
        named = [(f"mems[{i}]", t) for i, layer in enumerate(self.layers) for t in layer.float_tensors()]
        named += [("mems.tokens", self.tokens)] if self.tokens is not None else []
        for name, tensor in named:
            if tensor.dtype not in allowed:
                want = (
                    "float16, bfloat16 or float32 under autocast" if autocast else f"{dtype}, the dtype of its weights"
                )
                raise ValueError(
                    f"{name} holds {tensor.dtype} tensors, but the model reads {want}: pass the memory a model of "
                    "this dtype returned, or cast the model and its memory alike"
                )

    def check(self, n_layer: int, batch: int, d_model: int, n_head: int, d_head: int) -> None:
        """Raise ``ValueError`` naming the problem when this memory does not fit a model and a batch."""
        if not self.layers:
            return
        if len(self.layers) != n_layer:
            raise ValueError(
                f"mems must hold one tensor per layer ({n_layer}), got {len(self.layers)}: a memory (or cache) of "
                "another model?  Pass the one this model returned, or none to start afresh"
            )
        rows = self.batch_size
        if self.kind is RingMemory:
            if rows is not None and rows != batch:
                raise ValueError(f"the ring memory holds {rows} streams, the input {batch}")
            if any(layer.stale for layer in self.layers if isinstance(layer, RingMemory)):
                raise ValueError(
                    "this ring memory was superseded: ring storage is written in place, so only the memory returned "
                    "by the latest call may be passed on (use KVMemory to keep several)"
                )
            return
        for i, layer in enumerate(self.layers):
            if isinstance(layer, KVMemory):
                want = (batch, n_head, self.mem_length, d_head)
                if tuple(layer.keys.shape) != want or tuple(layer.values.shape) != want:
                    raise ValueError(
                        f"a key/value memory must hold {n_layer} key and value tensors of shape (B, H, M, D) = {want}"
                    )
            elif isinstance(layer, HiddenMemory) and tuple(layer.hidden.shape) != (batch, self.mem_length, d_model):
                want = (batch, self.mem_length, d_model)
                raise ValueError(
                    f"mems[{i}] must have shape (batch, mem_len, d_model) = {want}, got {tuple(layer.hidden.shape)}"
                )


def as_memory(mems) -> Memory:
    """``None``, a :class:`Memory`, or one (B, M, E) tensor per layer, as a :class:`Memory`."""
    if mems is None:
        return Memory()
    if isinstance(mems, Memory):
        return mems
    if isinstance(mems, (list, tuple)) and all(isinstance(m, Tensor) for m in mems):
        for i, m in enumerate(mems):
            if m.dim() != 3:
                raise ValueError(f"mems[{i}] must have shape (batch, mem_len, d_model), got {tuple(m.shape)}")
        return Memory.from_hidden(mems)
    raise ValueError(f"mems must be a Memory, None or one (B, M, E) tensor per layer, got {type(mems).__name__}")
