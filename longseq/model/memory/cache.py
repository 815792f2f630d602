"""Key/value storage for evaluation and generation: per layer, the projected keys and values of the last M
positions (B, H, M, D), so the memory is never projected again, and the projected relative table W_R R, carried
between calls so that it is not projected again either.  The outputs equal those of the hidden-state memory.

A :class:`~longseq.model.memory.state.RingMemory` keeps keys and values in preallocated ring buffers (generation:
no copy of the memory per token).  A ring is written in place, so only the memory returned by the latest call is
valid; an older one is refused by name (:meth:`~longseq.model.memory.state.Memory.check`).

Truncation to ``mem_len`` is the only policy here: compaction, memory tokens and document ids need the
hidden-state memory, and a bidirectional model cannot cache keys (every segment token sees the later ones).
"""

from __future__ import annotations

import torch
from torch import Tensor

from longseq.model.memory.context import CacheContext, RingContext
from longseq.model.memory.policy import MaskInputs, StepInputs, StepOutput
from longseq.model.memory.state import KVMemory, LayerState, Memory, RingMemory


class KeyValueStep:
    """One forward pass over a key/value or ring memory (the :class:`~longseq.model.memory.policy.MemoryStep`
    protocol)."""

    def __init__(self, policies, given: StepInputs) -> None:
        config, memory, recurrence = policies.config, given.memory, given.recurrence
        if config.pattern.bidirectional:
            raise ValueError(
                "a bidirectional model cannot use a key/value memory: every segment token sees the later ones"
            )
        if given.doc_ids is not None or memory.doc_ids is not None:
            raise ValueError("document resets need the hidden-state memory, not a key/value memory")
        if config.memory.compacted:
            raise ValueError(
                "memory compaction (cmem_len, mem_quant, mem_select, mem_tokens) needs the hidden-state memory"
            )
        if recurrence.same_length and recurrence.mem_len < 1:
            raise ValueError("same_length=True needs mem_len >= 1: it limits every query to the last mem_len keys")
        self.memory, self.recurrence, self.qlen, self.attends = memory, recurrence, given.qlen, given.attends
        self.training, self.mlen = given.training, memory.length
        self.presents: list = [None] * len(given.attends)  # per attention layer, keys and values of [memory; segment]
        self.rings = self._rings() if memory.kind is RingMemory else None
        self.table = memory.table

    @property
    def klen(self) -> int:
        return self.mlen + self.qlen

    def _rings(self) -> list:
        mem_len = self.recurrence.mem_len
        rings = [layer.ring if isinstance(layer, RingMemory) else None for layer in self.memory.layers]
        if not rings:
            rings = [RingKV(mem_len + self.qlen, mem_len) if attends else None for attends in self.attends]
        live = [r for r in rings if r is not None]
        if live and live[0].keys.capacity < live[0].length + self.qlen:
            rings = [None if r is None else r.grown(live[0].length + self.qlen + mem_len) for r in rings]
        return rings

    def wrap(self, hidden: Tensor) -> Tensor:
        return hidden

    def wrap_flags(self, flags: Tensor) -> Tensor:
        return flags

    def mask_inputs(self) -> MaskInputs:
        span = self.recurrence.mem_len if self.recurrence.same_length else None
        return MaskInputs(self.qlen, self.mlen, span, None, None, None)

    def carried_tables(self, clamp_len: int, dtype: torch.dtype) -> list | None:
        """The carried tables when they were projected for this clamp_len and dtype and cover this pass (evaluation
        has no dropout on R; training projects anew every pass)."""
        table = None if self.table is None or self.table[1] != clamp_len else self.table[0]
        live = [t for t in table or () if t is not None]
        if self.training or not live or live[0].size(1) < self.klen + 1 or live[0].dtype != dtype:
            return None
        return self._rows(table)

    def table_rows(self) -> int:
        """Distances up to ``mem_len`` + this segment, so that the next segments of this length reuse them."""
        return max(self.klen, self.recurrence.mem_len + self.qlen) + 1

    def carry_tables(self, tables: list, clamp_len: int) -> list:
        self.table = (tuple(tables), clamp_len)
        return self._rows(self.table[0])

    def _rows(self, table) -> list:
        live = [t for t in table if t is not None]
        if not live:  # an encoding without tables (rope, nope)
            return list(table)
        rows = live[0].size(1)
        return [None if t is None else t[:, rows - self.klen - 1 :] for t in table]

    def read(self, layer: int, hidden: Tensor) -> CacheContext | RingContext:
        if self.rings is not None:
            return RingContext(self.rings[layer])
        if not self.mlen:
            return CacheContext()  # nothing cached yet: the layer's keys are the segment's
        stored = self.memory.layers[layer]
        return CacheContext(stored.keys, stored.values)

    def record(self, layer: int, present, mass) -> None:
        self.presents[layer] = present

    def write(self, hidden: Tensor, states: dict[int, LayerState]) -> StepOutput:
        if self.rings is not None:
            layers = tuple(
                RingMemory(r, r.version) if attends else states[i]
                for i, (attends, r) in enumerate(zip(self.attends, self.rings))
            )
            return StepOutput(hidden, Memory(layers, RingMemory, table=self.table))
        mem_len = self.recurrence.mem_len
        with torch.no_grad():
            layers = tuple(
                KVMemory(_last(kv[0], mem_len), _last(kv[1], mem_len)) if attends else states[i]
                for i, (attends, kv) in enumerate(zip(self.attends, self.presents))
            )
        return StepOutput(hidden, Memory(layers, KVMemory, table=self.table))


def _last(states: Tensor, mem_len: int) -> Tensor:
    """The last ``mem_len`` positions of (B, H, K, D), detached."""
    return states[:, :, max(0, states.size(2) - mem_len) :].detach()


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
        self.mirrored: Tensor | None = None  # storage as (..., 2, capacity, ...) along dim: its two copies
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
            self.mirrored = self.storage.unflatten(self.dim, (2, self.capacity))  # the two copies side by side
        end = (self.start + self.length) % self.capacity  # where the next position goes
        first = min(n, self.capacity - end)
        head = x if first == n else x.narrow(self.dim, 0, first)
        self.mirrored.narrow(self.dim + 1, end, first).copy_(head.unsqueeze(self.dim))  # both copies in one write
        if n > first:
            tail = x.narrow(self.dim, first, n - first).unsqueeze(self.dim)
            self.mirrored.narrow(self.dim + 1, 0, n - first).copy_(tail)
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
        self.version = 0  # writes so far: a memory made at an older version is stale

    def extend(self, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        """Append the segment's (B, H, T, D) keys and values; return those of [memory; segment] as views."""
        total = self.length + key.size(2)
        if total > self.keys.capacity:
            raise ValueError(f"ring capacity {self.keys.capacity} is below memory + segment = {total}")
        self.keys.append(key.detach())
        self.values.append(value.detach())
        self.length = min(total, self.mem_len)
        self.version += 1
        return self.keys.view(total), self.values.view(total)

    def selected(self, rows: Tensor) -> tuple[RingKV, int]:
        """A new ring holding the streams ``rows`` (B',) of this one, and its version (beam search)."""
        ring = RingKV(self.keys.capacity, self.mem_len)
        if self.length:
            ring.keys.append(self.keys.view(self.length).index_select(0, rows))
            ring.values.append(self.values.view(self.length).index_select(0, rows))
            ring.length = self.length
        return ring, ring.version

    def grown(self, capacity: int) -> RingKV:
        """A copy with more capacity (only when a longer segment than ever before arrives)."""
        ring = RingKV(capacity, self.mem_len)
        if self.length:
            ring.keys.append(self.keys.view(self.length))
            ring.values.append(self.values.view(self.length))
            ring.length = self.length
        return ring
