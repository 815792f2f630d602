"""Key/value storage for evaluation and generation: per layer, the projected keys and values of the last M
positions (B, H, M, D), so the memory is never projected again, and the projected relative table W_R R, carried
between calls so that it is not projected again either.  The outputs equal those of the hidden-state memory.

A :class:`~longseq.model.memory.state.RingMemory` keeps keys and values in preallocated ring buffers (generation:
no copy of the memory per token).  A ring is written in place, so only the memory returned by the latest call is
valid; an older one is refused by name (:meth:`~longseq.model.memory.state.Memory.check`).

Truncation to ``mem_len`` is the only policy here, with attention sinks (the first ``sinks`` positions of the stream
kept before the memory, StreamingLLM): compaction, memory tokens and document ids need the hidden-state memory, and
a bidirectional model cannot cache keys (every segment token sees the later ones).
"""

from __future__ import annotations

import torch
from torch import Tensor

from longseq.model.memory.context import CacheContext, RingContext
from longseq.model.memory.policy import MaskInputs, StepInputs, StepOutput, sink_keys
from longseq.model.memory.state import KVMemory, LayerState, Memory, RingMemory
from longseq.model.memory.truncate import keep_recent


class KeyValueStep:
    """One forward pass over a key/value or ring memory (the :class:`~longseq.model.memory.policy.MemoryStep`
    protocol)."""

    caches_keys = True  # the memory holds keys and values

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
        mem_len, sinks = self.recurrence.mem_len, self.recurrence.sinks
        rings = [layer.ring if isinstance(layer, RingMemory) else None for layer in self.memory.layers]
        if not rings:
            rings = [RingKV(mem_len + self.qlen, mem_len, sinks) if attends else None for attends in self.attends]
        live = [r for r in rings if r is not None]
        if live and (live[0].mem_len, live[0].sinks) != (mem_len, sinks):
            raise ValueError(
                f"this ring memory keeps mem_len={live[0].mem_len} and sinks={live[0].sinks}, the call asks for "
                f"mem_len={mem_len} and sinks={sinks}: read the stream with one recurrence (or use KVMemory)"
            )
        if live and live[0].keys.capacity < live[0].recent + self.qlen:
            rings = [None if r is None else r.grown(live[0].recent + self.qlen + mem_len) for r in rings]
        return rings

    def wrap(self, hidden: Tensor) -> Tensor:
        return hidden

    def wrap_flags(self, flags: Tensor) -> Tensor:
        return flags

    def mask_inputs(self) -> MaskInputs:
        span = self.recurrence.mem_len if self.recurrence.same_length else None
        return MaskInputs(
            self.qlen, self.mlen, span, None, None, None, *sink_keys(self.recurrence, self.memory, self.klen)
        )

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
            return StepOutput(hidden, Memory(layers, RingMemory, table=self.table, position=self.position))
        mem_len, sinks = self.recurrence.mem_len, self.recurrence.sinks
        with torch.no_grad():
            layers = tuple(
                KVMemory(*(keep_recent(x, None, mem_len, sinks=sinks, dim=2) for x in kv)) if attends else states[i]
                for i, (attends, kv) in enumerate(zip(self.attends, self.presents))
            )
        return StepOutput(hidden, Memory(layers, KVMemory, table=self.table, position=self.position))

    @property
    def position(self) -> int:
        """Positions of the stream read after this pass."""
        return self.memory.position + self.qlen


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
    """One layer's key/value memory: the recent positions in two ring buffers of capacity ``mem_len`` + the longest
    segment, and with ``sinks`` > 0 the stream's first ``sinks`` positions beside them (attention sinks: a few
    positions, copied before the ring's view when a pass reads them)."""

    def __init__(self, capacity: int, mem_len: int, sinks: int = 0) -> None:
        self.keys, self.values = RingBuffer(capacity, dim=2), RingBuffer(capacity, dim=2)
        self.mem_len, self.sinks = mem_len, sinks
        self.sink_keys: Tensor | None = None  # (B, H, S', D): the stream's first S' <= sinks positions
        self.sink_values: Tensor | None = None
        self.recent = 0  # positions in the ring (before the next segment)
        self.version = 0  # writes so far: a memory made at an older version is stale

    @property
    def n_sinks(self) -> int:
        return 0 if self.sink_keys is None else self.sink_keys.size(2)

    @property
    def length(self) -> int:
        """Positions of memory before the next segment: the sinks and the recent ones."""
        return self.n_sinks + self.recent

    def extend(self, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        """Append the segment's (B, H, T, D) keys and values; return those of [sinks; memory; segment] (views of the
        ring when there are no sinks)."""
        key, value = key.detach(), value.detach()
        take = min(self.sinks - self.n_sinks, key.size(2))  # the stream's first positions become sinks
        if take > 0:
            head = (key[:, :, :take], value[:, :, :take])
            held = self.sink_keys is not None
            self.sink_keys = torch.cat([self.sink_keys, head[0]], 2) if held else head[0].clone()
            self.sink_values = torch.cat([self.sink_values, head[1]], 2) if held else head[1].clone()
            key, value = key[:, :, take:], value[:, :, take:]
        total = self.recent + key.size(2)
        if total > self.keys.capacity:
            raise ValueError(f"ring capacity {self.keys.capacity} is below memory + segment = {total}")
        if key.size(2):
            self.keys.append(key)
            self.values.append(value)
        self.recent = min(total, self.mem_len)
        self.version += 1
        if not total:  # every position went to the sinks
            return self.sink_keys, self.sink_values
        keys, values = self.keys.view(total), self.values.view(total)
        if self.sink_keys is None:
            return keys, values
        return torch.cat([self.sink_keys, keys], 2), torch.cat([self.sink_values, values], 2)

    def held(self) -> tuple[Tensor, Tensor] | tuple[()]:
        """Copies of the keys and values of the memory (B, H, M, D), [sinks; recent], or () when empty."""
        if not self.length:
            return ()
        parts = [(self.keys.view(self.recent), self.values.view(self.recent))] if self.recent else []
        if self.sink_keys is not None:
            parts.insert(0, (self.sink_keys, self.sink_values))
        return tuple(torch.cat([p[i] for p in parts], dim=2) for i in (0, 1))

    def _copy(self, capacity: int, rows: Tensor | None = None) -> RingKV:
        """A new ring of ``capacity`` holding this one's positions (of the streams ``rows``, or all)."""

        def pick(x: Tensor) -> Tensor:
            return x if rows is None else x.index_select(0, rows)

        ring = RingKV(capacity, self.mem_len, self.sinks)
        if self.sink_keys is not None:
            ring.sink_keys, ring.sink_values = pick(self.sink_keys).clone(), pick(self.sink_values).clone()
        if self.recent:
            ring.keys.append(pick(self.keys.view(self.recent)))
            ring.values.append(pick(self.values.view(self.recent)))
            ring.recent = self.recent
        return ring

    def selected(self, rows: Tensor) -> tuple[RingKV, int]:
        """A new ring holding the streams ``rows`` (B',) of this one, and its version (beam search)."""
        ring = self._copy(self.keys.capacity, rows)
        return ring, ring.version

    def grown(self, capacity: int) -> RingKV:
        """A copy with more capacity (only when a longer segment than ever before arrives)."""
        return self._copy(capacity)
