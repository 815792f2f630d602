"""Segment-level recurrence memory: the cached, stop-gradient hidden states of earlier segments."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

Memory = tuple[Tensor, ...]
"""One (B, M, E) tensor per layer: the input of that layer for the last M positions."""


def update_memory(hiddens: list[Tensor], memory: Memory | None, mem_len: int) -> Memory:
    """Append this segment's layer inputs to the memory and keep the last ``mem_len`` positions.

    The result is detached: no gradient ever flows into a previous segment (the paper's SG(.)).
    """
    with torch.no_grad():
        new = []
        for layer, hidden in enumerate(hiddens):  # hidden: (B, T, E)
            if mem_len == 0:
                new.append(hidden[:, :0].detach())
                continue
            old = None if memory is None else memory[layer]
            joined = hidden if old is None or old.size(1) == 0 else torch.cat([old, hidden], dim=1)  # (B, M+T, E)
            new.append(joined[:, -mem_len:].detach())
        return tuple(new)


@dataclass
class KVMemory:
    """Key/value memory for evaluation and generation: per layer, the projected keys and values of the
    last M positions (B, H, M, D), so the memory is not projected again at every segment.

    Gives the same outputs as the hidden-state memory.  ``rel_keys`` carries each layer's W_R R table
    (H, R, D) for ``rel_clamp`` between calls, so R is not projected again either.  Start from
    :meth:`empty`.  Not for training: gradients never reach cached keys and values.
    """

    keys: tuple[Tensor, ...]
    values: tuple[Tensor, ...]
    rel_keys: tuple[Tensor, ...] | None = None
    rel_clamp: int = 0
    rings: tuple | None = None  # per layer RingKV when ring storage is on (updated in place)
    ring: bool = False

    @classmethod
    def empty(cls, ring: bool = False) -> KVMemory:
        """An empty memory; ``ring=True`` stores keys and values in ring buffers that are never reallocated
        (for generation: no copy of the whole memory per token)."""
        return cls(keys=(), values=(), ring=ring)

    @property
    def length(self) -> int:
        if self.rings is not None:
            return self.rings[0].length
        return self.keys[0].size(2) if self.keys else 0

    @classmethod
    def from_presents(cls, presents, mem_len: int, rel_keys=None, rel_clamp: int = 0) -> KVMemory:
        """Keep the last ``mem_len`` positions of each layer's (keys, values)."""
        with torch.no_grad():
            keys = tuple(k[:, :, max(0, k.size(2) - mem_len) :].detach() for k, _ in presents)
            values = tuple(v[:, :, max(0, v.size(2) - mem_len) :].detach() for _, v in presents)
        return cls(keys, values, rel_keys, rel_clamp)


@dataclass
class Quantized:
    """An int8 tensor with a float scale per row (last axis reduced) or per channel (time axis reduced)."""

    values: Tensor  # int8 (B, M, E)
    scale: Tensor  # (B, M, 1) per row, (B, 1, E) per channel

    def dequantize(self, dtype: torch.dtype = torch.float32) -> Tensor:
        return self.values.to(dtype) * self.scale.to(dtype)

    @property
    def nbytes(self) -> int:
        return self.values.numel() * self.values.element_size() + self.scale.numel() * self.scale.element_size()

    def size(self, dim: int) -> int:
        return self.values.size(dim)


def quantize(x: Tensor, axis: str = "row") -> Quantized:
    """Symmetric int8 quantization of (B, M, E) with one scale per position (``row``) or per channel."""
    reduce = -1 if axis == "row" else 1
    scale = x.detach().abs().amax(dim=reduce, keepdim=True).clamp(min=1e-12) / 127.0
    values = torch.round(x.detach() / scale).clamp(-127, 127).to(torch.int8)
    return Quantized(values, scale.to(torch.float16 if x.dtype == torch.float16 else torch.float32))


def _dense(x: Tensor | Quantized, dtype: torch.dtype) -> Tensor:
    return x.dequantize(dtype) if isinstance(x, Quantized) else x


@dataclass
class MemoryState:
    """Hidden-state memory with the compaction options switched on in the model config.

    * ``hidden``: per layer, the last M layer inputs (B, M, E), as floats or :class:`Quantized`;
    * ``compressed``: per layer, the compressed memory (B, C, E) of the Compressive Transformer, older than ``hidden``;
    * ``doc_ids``: (B, C + M) document id of every memory slot, for per-stream resets (-1: cleared);
    * ``tokens``: (B, n, E) memory tokens of the Recurrent Memory Transformer, written by the last segment;
      they keep their graph for ``mem_tokens_bptt`` segments (``tokens_age`` counts them).

    A plain memory is a tuple of tensors; this structure is used when compression, quantization or
    document resets are in play.  Everything here but ``tokens`` is detached.
    """

    hidden: tuple[Tensor | Quantized, ...]
    compressed: tuple[Tensor, ...] | None = None
    doc_ids: Tensor | None = None
    tokens: Tensor | None = None
    tokens_age: int = 0

    @property
    def mem_length(self) -> int:
        return self.hidden[0].size(1) if self.hidden else 0

    @property
    def cmem_length(self) -> int:
        return self.compressed[0].size(1) if self.compressed else 0

    @property
    def length(self) -> int:
        """Positions attended to before the segment: compressed plus plain memory."""
        return self.cmem_length + self.mem_length

    def plain(self, layer: int, dtype: torch.dtype) -> Tensor | None:
        """The (uncompressed) memory of one layer as floats (B, M, E), dequantized if need be."""
        return _dense(self.hidden[layer], dtype) if self.mem_length else None

    def context(self, layer: int, plain: Tensor | None) -> Tensor | None:
        """[compressed; memory] of one layer (B, C + M, E), given that layer's :meth:`plain` memory."""
        if not self.cmem_length:
            return plain
        compressed = self.compressed[layer].to(plain.dtype if plain is not None else self.compressed[layer].dtype)
        return compressed if plain is None else torch.cat([compressed, plain], dim=1)

    @property
    def nbytes(self) -> int:
        """Bytes held by the memory tensors (hidden, compressed and memory tokens)."""
        total = 0
        for h in self.hidden:
            total += h.nbytes if isinstance(h, Quantized) else h.numel() * h.element_size()
        for c in self.compressed or ():
            total += c.numel() * c.element_size()
        if self.tokens is not None:
            total += self.tokens.numel() * self.tokens.element_size()
        return total


def memory_nbytes(mems) -> int:
    """Bytes of any memory structure: tuple of tensors, :class:`MemoryState` or :class:`KVMemory`."""
    if mems is None:
        return 0
    if isinstance(mems, MemoryState):
        return mems.nbytes
    if isinstance(mems, KVMemory):
        return sum(t.numel() * t.element_size() for t in mems.keys + mems.values)
    return sum(t.numel() * t.element_size() for t in mems)


def reset_rows(mems, rows: Tensor, initial_tokens: Tensor | None = None):
    """Clear the memory of the stream rows where ``rows`` (B,) is True: their slots get document id -1
    and are masked from then on, so nothing of the previous document reaches the next one.  With memory
    tokens, pass the model's ``transformer.memory_tokens`` as ``initial_tokens``: those rows restart from it."""
    if mems is None or not bool(rows.any()):
        return mems
    state = mems if isinstance(mems, MemoryState) else MemoryState(hidden=tuple(mems))
    batch = rows.size(0)
    doc = state.doc_ids
    if doc is None:
        doc = torch.zeros(batch, state.length, dtype=torch.long, device=rows.device)
    doc = doc.masked_fill(rows[:, None], -1)
    tokens = state.tokens
    if tokens is not None:
        if initial_tokens is None:
            raise ValueError("this memory carries memory tokens: pass initial_tokens=model.transformer.memory_tokens")
        tokens = torch.where(rows[:, None, None], initial_tokens.to(tokens.dtype).expand_as(tokens), tokens)
    return MemoryState(state.hidden, state.compressed, doc, tokens, state.tokens_age)


def _split_rows(x, chunks: int):
    if isinstance(x, Quantized):
        return [Quantized(v, s) for v, s in zip(x.values.chunk(chunks, 0), x.scale.chunk(chunks, 0))]
    return list(x.chunk(chunks, 0))


def _join_rows(parts):
    if isinstance(parts[0], Quantized):
        return Quantized(torch.cat([p.values for p in parts]), torch.cat([p.scale for p in parts]))
    return torch.cat(parts)


def split_memory(mems, chunks: int) -> list:
    """Split a memory along the batch (stream) axis into ``chunks`` parts, e.g. for gradient accumulation."""
    if mems is None:
        return [None] * chunks
    if isinstance(mems, MemoryState):
        hidden = [_split_rows(h, chunks) for h in mems.hidden]
        compressed = [c.chunk(chunks, 0) for c in mems.compressed] if mems.compressed is not None else None
        docs = mems.doc_ids.chunk(chunks, 0) if mems.doc_ids is not None else None
        tokens = mems.tokens.chunk(chunks, 0) if mems.tokens is not None else None
        return [
            MemoryState(
                tuple(h[i] for h in hidden),
                tuple(c[i] for c in compressed) if compressed is not None else None,
                docs[i] if docs is not None else None,
                tokens[i] if tokens is not None else None,
                mems.tokens_age,
            )
            for i in range(chunks)
        ]
    per_layer = [m.chunk(chunks, dim=0) for m in mems]
    return [tuple(layer[i] for layer in per_layer) for i in range(chunks)]


def join_memory(parts: list):
    """Inverse of :func:`split_memory`."""
    if isinstance(parts[0], MemoryState):
        n_layer = len(parts[0].hidden)
        hidden = tuple(_join_rows([p.hidden[i] for p in parts]) for i in range(n_layer))
        compressed = None
        if parts[0].compressed is not None:
            compressed = tuple(torch.cat([p.compressed[i] for p in parts]) for i in range(n_layer))
        docs = torch.cat([p.doc_ids for p in parts]) if parts[0].doc_ids is not None else None
        tokens = torch.cat([p.tokens for p in parts]) if parts[0].tokens is not None else None
        return MemoryState(hidden, compressed, docs, tokens, parts[0].tokens_age)
    return tuple(torch.cat(layer, dim=0) for layer in zip(*parts))


def memory_to_tensors(mems) -> dict[str, Tensor]:
    """Flat, named tensors for a checkpoint (safetensors)."""
    if mems is None:
        return {}
    if not isinstance(mems, MemoryState):
        return {f"mems.{i}": m.detach().cpu().contiguous() for i, m in enumerate(mems)}
    out: dict[str, Tensor] = {}
    for i, h in enumerate(mems.hidden):
        if isinstance(h, Quantized):
            out[f"state.hidden_q.{i}"] = h.values.cpu().contiguous()
            out[f"state.hidden_scale.{i}"] = h.scale.cpu().contiguous()
        else:
            out[f"state.hidden.{i}"] = h.detach().cpu().contiguous()
    for i, c in enumerate(mems.compressed or ()):
        out[f"state.compressed.{i}"] = c.detach().cpu().contiguous()
    if mems.doc_ids is not None:
        out["state.doc_ids"] = mems.doc_ids.cpu().contiguous()
    if mems.tokens is not None:
        out["state.tokens"] = mems.tokens.detach().cpu().contiguous()
    return out


def memory_from_tensors(tensors: dict[str, Tensor]):
    """Inverse of :func:`memory_to_tensors` (None when the checkpoint holds no memory)."""
    plain = sorted((int(k.split(".")[1]), v) for k, v in tensors.items() if k.startswith("mems."))
    if plain:
        return tuple(v for _, v in plain)
    layers = sorted({int(k.rsplit(".", 1)[1]) for k in tensors if k.startswith("state.hidden")})
    if not layers and "state.tokens" not in tensors:
        return None
    hidden = tuple(
        Quantized(tensors[f"state.hidden_q.{i}"], tensors[f"state.hidden_scale.{i}"])
        if f"state.hidden_q.{i}" in tensors
        else tensors[f"state.hidden.{i}"]
        for i in layers
    )
    compressed = tuple(tensors[f"state.compressed.{i}"] for i in layers) if "state.compressed.0" in tensors else None
    return MemoryState(hidden, compressed, tensors.get("state.doc_ids"), tensors.get("state.tokens"))


def detach_memory(mems):
    """The memory with the memory tokens' graph cut (the end of a back-propagation window)."""
    if isinstance(mems, MemoryState) and mems.tokens is not None:
        return MemoryState(mems.hidden, mems.compressed, mems.doc_ids, mems.tokens.detach(), 0)
    return mems


class RingBuffer:
    """The last ``capacity`` positions of a stream along ``dim``, in preallocated storage.

    A mirrored ring: every position is written twice, at ``i`` and ``i + capacity``, so the
    chronological window is always one contiguous slice of the storage.  Appending never
    reallocates and reading never copies; truncation is only a moved start index.
    """

    def __init__(self, capacity: int, dim: int = 2) -> None:
        if capacity < 1:
            raise ValueError(f"a ring buffer needs capacity >= 1, got {capacity}")
        self.capacity, self.dim = capacity, dim
        self.storage: Tensor | None = None
        self.start = 0  # storage index of the oldest position, in [0, capacity)
        self.length = 0

    def append(self, x: Tensor) -> None:
        """Add ``x``'s positions (along ``dim``) after the current ones, dropping the oldest beyond capacity."""
        n = x.size(self.dim)
        if n > self.capacity:
            x, n = x.narrow(self.dim, n - self.capacity, self.capacity), self.capacity
        if self.storage is None:
            shape = list(x.shape)
            shape[self.dim] = 2 * self.capacity
            self.storage = x.new_empty(shape)
        end = (self.start + self.length) % self.capacity  # where the next position goes
        first = min(n, self.capacity - end)
        for offset in (0, self.capacity):  # the two mirrored copies
            self.storage.narrow(self.dim, end + offset, first).copy_(x.narrow(self.dim, 0, first))
            if n > first:
                self.storage.narrow(self.dim, offset, n - first).copy_(x.narrow(self.dim, first, n - first))
        overflow = max(0, self.length + n - self.capacity)
        self.start = (self.start + overflow) % self.capacity
        self.length = min(self.capacity, self.length + n)

    def view(self, last: int | None = None) -> Tensor:
        """The newest ``last`` positions (default: all), oldest first, as a view of the storage."""
        last = self.length if last is None else min(last, self.length)
        if self.storage is None:
            raise ValueError("the ring buffer is empty")
        return self.storage.narrow(self.dim, self.start + self.length - last, last)


class RingKV:
    """One layer's key/value memory in two ring buffers of capacity ``mem_len`` + the longest segment."""

    def __init__(self, capacity: int, mem_len: int) -> None:
        self.keys, self.values = RingBuffer(capacity, dim=2), RingBuffer(capacity, dim=2)
        self.mem_len = mem_len
        self.length = 0  # positions of memory (before the next segment)

    def extend(self, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        """Append the segment's (B, H, T, D) keys and values; return those of [memory; segment] as views."""
        total = self.length + key.size(2)
        if total > self.keys.capacity:
            raise ValueError(f"ring capacity {self.keys.capacity} is below memory + segment = {total}")
        self.keys.append(key.detach())
        self.values.append(value.detach())
        self.length = min(total, self.mem_len)
        return self.keys.view(total), self.values.view(total)

    def grown(self, capacity: int) -> RingKV:
        """A copy with more capacity (only when a longer segment than ever before arrives)."""
        ring = RingKV(capacity, self.mem_len)
        if self.length:
            ring.keys.append(self.keys.view(self.length))
            ring.values.append(self.values.view(self.length))
            ring.length = self.length
        return ring
