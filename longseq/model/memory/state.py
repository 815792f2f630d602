"""The recurrence memory as one immutable object: what a forward pass hands to the next.

A :class:`Memory` holds, per layer, what the next segment attends to before itself:

* with ``storage="hidden"`` (training, and every compaction policy) the layer inputs of the last M positions
  (B, M, E), as floats or 8-bit :class:`~longseq.model.memory.quantize.Quantized`, and the Compressive
  Transformer's older compressed states (B, C, E);
* with ``storage="kv"`` or ``"ring"`` (evaluation, generation) the projected keys and values (B, H, M, D), so the
  memory is never projected twice; ``ring`` keeps them in preallocated ring buffers.

Beside them: the document id of every slot, the memory tokens written by the last segment, and (key/value
storage) the projected relative table, carried so that W_R R is not projected again either.

``forward`` never changes a memory; it returns a new one.  By default everything but the memory tokens is
detached: no gradient reaches an earlier segment (the paper's SG(.)).  In training, ``mem_bptt``, ``state_bptt``
and ``mem_tokens_bptt`` > 1 keep the graph, which the caller cuts with :meth:`Memory.detach` every that many
segments.  ``memory[i]`` is layer i's hidden-state memory
(B, M, E), as in the paper's ``mems`` list.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from longseq.model.memory.quantize import Quantized, dense, join_rows, split_rows

STORAGES = ("hidden", "kv", "ring")


@dataclass(frozen=True)
class Recurrence:
    """How one call reads and writes the memory: ``mem_len`` positions kept, relative distances clamped to
    ``clamp_len`` (<= 0: no clamp), and with ``same_length`` every query sees exactly the last ``mem_len`` keys."""

    mem_len: int
    clamp_len: int = -1
    same_length: bool = False


@dataclass(frozen=True)
class LayerMemory:
    """One layer's part of the memory (see :class:`Memory`)."""

    hidden: Tensor | Quantized | None = None  # (B, M, E)
    compressed: Tensor | None = None  # (B, C, E), older than hidden
    keys: Tensor | None = None  # (B, H, M, D)
    values: Tensor | None = None  # (B, H, M, D)
    ring: object | None = None  # a RingKV holding keys and values (ring storage)
    ring_version: int = 0  # the ring's write count when this memory was made
    state: tuple[Tensor, ...] | None = None  # a recurrent layer's state (ssm, conv, rnn mixers; the LSTM baseline)
    inner: Memory | None = None  # an hourglass block's memory of its shortened layers
    phase: int = 0  # an hourglass block's position in its current group, the same for every row (host)

    @property
    def mem_length(self) -> int:
        if self.hidden is not None:
            return self.hidden.size(1)
        if self.keys is not None:
            return self.keys.size(2)
        return self.ring.length if self.ring is not None else 0

    @property
    def cmem_length(self) -> int:
        return 0 if self.compressed is None else self.compressed.size(1)

    def float_tensors(self) -> list[Tensor]:
        """The tensors that hold states, not 8-bit storage or indices (an hourglass's state holds its phase): what
        must be of the model's dtype."""
        out = [t for t in (self.compressed, self.keys, self.values) if t is not None]
        out += [t for t in self.state or () if t.is_floating_point()]
        if isinstance(self.hidden, Tensor):
            out.append(self.hidden)
        if self.inner is not None:
            out += [t for layer in self.inner.layers for t in layer.float_tensors()]
        return out

    def tensors(self) -> list[Tensor]:
        """Every tensor the layer's memory holds, 8-bit storage and integer states included."""
        out = [t for t in (self.compressed, self.keys, self.values, *(self.state or ())) if t is not None]
        if self.inner is not None:
            out += [t for layer in self.inner.layers for t in layer.tensors()]
        if isinstance(self.hidden, Quantized):
            out += [self.hidden.values, self.hidden.scale]
        elif self.hidden is not None:
            out.append(self.hidden)
        return out


@dataclass(frozen=True)
class Memory:
    """The memory one forward pass hands to the next (see the module docstring).  Start from :meth:`empty`
    (or ``None``), or from a list of (B, M, E) tensors with :meth:`from_hidden`."""

    layers: tuple[LayerMemory, ...] = ()
    storage: str = "hidden"
    doc_ids: Tensor | None = None  # (B, C + M): document of every slot, -1 where cleared
    last_doc: Tensor | None = None  # (B,): document of the last position read (recurrent layers' states belong to it)
    tokens: Tensor | None = None  # (B, n, E) memory tokens, written by the last segment (keep their graph)
    tokens_age: int = 0  # segments the tokens' graph spans
    table: tuple | None = None  # key/value storage: (per-layer (H, R, D) relative tables, their clamp_len)

    def __post_init__(self) -> None:
        if self.storage not in STORAGES:
            raise ValueError(f"memory storage must be one of {STORAGES}, got {self.storage!r}")

    @classmethod
    def empty(cls, storage: str = "hidden") -> Memory:
        """An empty memory.  ``kv`` stores projected keys and values (evaluation: identical outputs, less work);
        ``ring`` keeps them in ring buffers that are never reallocated (generation: no copy per token)."""
        return cls(storage=storage)

    @classmethod
    def from_hidden(cls, states: Sequence[Tensor]) -> Memory:
        """A hidden-state memory from one (B, M, E) tensor per layer, detached."""
        if isinstance(states, Memory):
            return states
        return cls(tuple(LayerMemory(hidden=s.detach()) for s in states))

    # --- sizes -----------------------------------------------------------------------------------------------

    @property
    def mem_length(self) -> int:
        """Positions of the (uncompressed) memory (of the attention layers; recurrent layers hold a state)."""
        return max([0, *(layer.mem_length for layer in self.layers)])

    @property
    def cmem_length(self) -> int:
        return max([0, *(layer.cmem_length for layer in self.layers)])

    @property
    def length(self) -> int:
        """Positions a query of the next segment sees before the segment: compressed plus plain memory."""
        return self.cmem_length + self.mem_length

    @property
    def batch_size(self) -> int | None:
        tensors = [t for layer in self.layers for t in layer.tensors()]
        if tensors:
            return tensors[0].size(0)
        rings = [layer.ring for layer in self.layers if layer.ring is not None and layer.ring.keys.storage is not None]
        return rings[0].keys.storage.size(0) if rings else None

    @property
    def nbytes(self) -> int:
        """Bytes held by the memory's tensors (hidden, compressed, keys and values, memory tokens)."""
        total = sum(t.numel() * t.element_size() for layer in self.layers for t in layer.tensors())
        return total + (0 if self.tokens is None else self.tokens.numel() * self.tokens.element_size())

    # --- the paper's list of per-layer states ----------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.layers)

    def __getitem__(self, layer: int) -> Tensor:
        """Layer ``layer``'s hidden-state memory (B, M, E), dequantized if stored in 8 bits (a recurrent layer:
        its state); a slice gives a tuple of them."""
        if isinstance(layer, slice):
            return tuple(self[i] for i in range(len(self.layers))[layer])
        hidden = self.layers[layer].hidden
        if hidden is None and self.layers[layer].state is not None:
            return self.layers[layer].state
        if hidden is None:
            raise ValueError(f"this {self.storage} memory holds keys and values, not hidden states")
        return dense(hidden, torch.float32) if isinstance(hidden, Quantized) else hidden

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    # --- transformations (each returns a new memory) ---------------------------------------------------------

    def to(self, device) -> Memory:
        """The memory with every tensor on ``device`` (a checkpoint's memory is read on the CPU); a ring memory,
        written in place, is refused."""
        if self.storage == "ring":
            raise ValueError("a ring memory is written in place and cannot be copied to another device")

        def move(t):
            return None if t is None else t.to(device)

        def layer_to(layer: LayerMemory) -> LayerMemory:
            hidden = layer.hidden
            hidden = (
                Quantized(hidden.values.to(device), hidden.scale.to(device))
                if isinstance(hidden, Quantized)
                else move(hidden)
            )
            return replace(layer, hidden=hidden, compressed=move(layer.compressed), keys=move(layer.keys),
                           values=move(layer.values), state=None if layer.state is None else tuple(map(move, layer.state)),
                           inner=None if layer.inner is None else layer.inner.to(device))  # fmt: skip

        table = None if self.table is None else (tuple(map(move, self.table[0])), self.table[1])
        return replace(self, layers=tuple(layer_to(layer) for layer in self.layers), doc_ids=move(self.doc_ids),
                       last_doc=move(self.last_doc), tokens=move(self.tokens), table=table)  # fmt: skip

    def detach(self) -> Memory:
        """The memory with the graphs of the hidden states (``mem_bptt``), the memory tokens and the recurrent
        states cut (the end of a back-propagation window)."""
        layers = tuple(
            replace(
                layer,
                hidden=layer.hidden.detach() if isinstance(layer.hidden, Tensor) else layer.hidden,
                state=None if layer.state is None else tuple(t.detach() for t in layer.state),
                inner=None if layer.inner is None else layer.inner.detach(),
            )
            for layer in self.layers
        )
        tokens = None if self.tokens is None else self.tokens.detach()
        return replace(self, layers=layers, tokens=tokens, tokens_age=0 if tokens is not None else self.tokens_age)

    def split(self, chunks: int) -> list[Memory]:
        """The memory cut along the batch (stream) axis into ``chunks`` parts (gradient accumulation, ranks)."""
        if self.storage != "hidden":
            raise ValueError("only a hidden-state memory can be split across batch chunks")

        def cut(x):
            return [None] * chunks if x is None else list(x.chunk(chunks, 0))

        def cut_state(state):
            return [None] * chunks if state is None else list(zip(*(t.chunk(chunks, 0) for t in state)))

        def cut_inner(inner):
            return [None] * chunks if inner is None else inner.split(chunks)

        per_layer = [
            [
                LayerMemory(h, c, state=r, inner=m, phase=layer.phase)
                for h, c, r, m in zip(
                    split_rows(layer.hidden, chunks),
                    cut(layer.compressed),
                    cut_state(layer.state),
                    cut_inner(layer.inner),
                )
            ]
            for layer in self.layers
        ]
        docs, tokens, last = cut(self.doc_ids), cut(self.tokens), cut(self.last_doc)
        return [
            replace(
                self, layers=tuple(layer[i] for layer in per_layer), doc_ids=docs[i], tokens=tokens[i], last_doc=last[i]
            )  # fmt: skip
            for i in range(chunks)
        ]

    @classmethod
    def join(cls, parts: Sequence[Memory]) -> Memory:
        """Inverse of :meth:`split`."""
        first = parts[0]

        def cat(xs):
            return None if xs[0] is None else torch.cat(list(xs))

        def cat_state(states):
            return None if states[0] is None else tuple(torch.cat(list(ts)) for ts in zip(*states))

        layers = tuple(
            LayerMemory(
                join_rows([p.layers[i].hidden for p in parts]),
                cat([p.layers[i].compressed for p in parts]),
                state=cat_state([p.layers[i].state for p in parts]),
                inner=None if first.layers[i].inner is None else Memory.join([p.layers[i].inner for p in parts]),
                phase=first.layers[i].phase,
            )
            for i in range(len(first.layers))
        )
        return replace(first, layers=layers, doc_ids=cat([p.doc_ids for p in parts]),
                       tokens=cat([p.tokens for p in parts]), last_doc=cat([p.last_doc for p in parts]))  # fmt: skip

    # --- checkpoints -----------------------------------------------------------------------------------------

    def to_tensors(self) -> dict[str, Tensor]:
        """Flat, named CPU tensors for a checkpoint (safetensors); hidden-state memories only."""
        if self.storage != "hidden":
            raise ValueError("only a hidden-state memory is saved in checkpoints")
        out: dict[str, Tensor] = {}
        for i, layer in enumerate(self.layers):
            if isinstance(layer.hidden, Quantized):
                out[f"memory.hidden_q.{i}"] = layer.hidden.values
                out[f"memory.hidden_scale.{i}"] = layer.hidden.scale
            elif layer.hidden is not None:
                out[f"memory.hidden.{i}"] = layer.hidden
            if layer.compressed is not None:
                out[f"memory.compressed.{i}"] = layer.compressed
            for j, tensor in enumerate(layer.state or ()):
                out[f"memory.state.{i}.{j}"] = tensor
            if layer.inner is not None:
                out.update({f"memory.inner.{i}/{k}": v for k, v in layer.inner.to_tensors().items()})
            if layer.phase:
                out[f"memory.phase.{i}"] = torch.tensor(layer.phase)
        if self.doc_ids is not None:
            out["memory.doc_ids"] = self.doc_ids
        if self.tokens is not None:
            out["memory.tokens"] = self.tokens
        if self.last_doc is not None:
            out["memory.last_doc"] = self.last_doc
        return {k: v.detach().cpu().contiguous() for k, v in out.items()}

    @classmethod
    def from_tensors(cls, tensors: dict[str, Tensor], tokens_age: int = 0) -> Memory | None:
        """Inverse of :meth:`to_tensors` (None when the checkpoint holds no memory)."""
        t = {k: v for k, v in tensors.items() if "/" not in k}
        layers = sorted({int(k.split(".")[2]) for k in t if k.startswith(("memory.hidden", "memory.state."))})
        if not layers and "memory.tokens" not in t:
            return None

        def hidden(i):
            if f"memory.hidden_q.{i}" in t:
                return Quantized(t[f"memory.hidden_q.{i}"], t[f"memory.hidden_scale.{i}"])
            return t.get(f"memory.hidden.{i}")

        def state(i):
            n = sum(k.startswith(f"memory.state.{i}.") for k in t)
            return tuple(t[f"memory.state.{i}.{j}"] for j in range(n)) or None

        def inner(i):
            prefix = f"memory.inner.{i}/"
            nested = {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}
            return Memory.from_tensors(nested) if nested else None

        def phase(i):  # written since the phase is kept on the host; before, the hourglass's state held it
            if f"memory.phase.{i}" in t:
                return int(t[f"memory.phase.{i}"])
            held = state(i)
            return int(held[2][0]) if held is not None and len(held) == 4 and not held[2].is_floating_point() else 0

        parts = tuple(
            LayerMemory(hidden(i), t.get(f"memory.compressed.{i}"), state=state(i), inner=inner(i), phase=phase(i))
            for i in layers
        )
        return cls(parts, doc_ids=t.get("memory.doc_ids"), tokens=t.get("memory.tokens"), tokens_age=tokens_age,
                   last_doc=t.get("memory.last_doc"))  # fmt: skip

    # --- checks ----------------------------------------------------------------------------------------------

    def check_dtype(self, dtype: torch.dtype, autocast: bool = False) -> None:
        """Raise ``ValueError`` naming the layer when a state tensor is not of the model's ``dtype``."""
        _check_dtype(self, dtype, autocast)

    def check(self, n_layer: int, batch: int, d_model: int, n_head: int, d_head: int) -> None:
        """Raise ``ValueError`` naming the problem when this memory does not fit a model and a batch."""
        if self.storage == "ring":
            return _check_ring(self, batch)
        if not self.layers:
            return
        if len(self.layers) != n_layer:
            raise ValueError(f"mems must hold one tensor per layer ({n_layer}), got {len(self.layers)}")
        if self.storage == "kv":
            want = (batch, n_head, self.mem_length, d_head)
            kv = [x for layer in self.layers if layer.state is None for x in (layer.keys, layer.values)]
            if any(x is None or tuple(x.shape) != want for x in kv):
                raise ValueError(
                    f"a key/value memory must hold {n_layer} key and value tensors of shape (B, H, M, D) = {want}"
                )
            return
        want = (batch, self.mem_length, d_model)
        for i, layer in enumerate(self.layers):
            if layer.hidden is None and layer.state is not None:
                continue  # a recurrent layer's state
            shape = tuple(layer.hidden.shape) if layer.hidden is not None else None
            if shape != want:
                raise ValueError(f"mems[{i}] must have shape (batch, mem_len, d_model) = {want}, got {shape}")


def _check_dtype(memory: Memory, dtype: torch.dtype, autocast: bool) -> None:
    """Every floating tensor of ``memory`` (hidden states, compressed states, keys, values, recurrent states,
    memory tokens) must be floating point, of the model's ``dtype``; under ``autocast`` any float16, bfloat16 or
    float32."""
    allowed = (torch.float16, torch.bfloat16, torch.float32) if autocast else (dtype,)
    named = [(f"mems[{i}]", t) for i, layer in enumerate(memory.layers) for t in layer.float_tensors()]
    named += [("mems.tokens", memory.tokens)] if memory.tokens is not None else []
    for name, tensor in named:
        if tensor.dtype not in allowed:
            want = "float16, bfloat16 or float32 under autocast" if autocast else f"{dtype}, the dtype of its weights"
            raise ValueError(
                f"{name} holds {tensor.dtype} tensors, but the model reads {want}: pass the memory a model of this "
                "dtype returned, or cast the model and its memory alike"
            )


def _check_ring(memory: Memory, batch: int) -> None:
    rows = memory.batch_size
    if rows is not None and rows != batch:
        raise ValueError(f"the ring memory holds {rows} streams, the input {batch}")
    for layer in memory.layers:
        if layer.ring is not None and layer.ring.version != layer.ring_version:
            raise ValueError(
                "this ring memory was superseded: ring storage is written in place, so only the memory returned by "
                "the latest call may be passed on (use storage='kv' to keep several)"
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
