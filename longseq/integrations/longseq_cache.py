"""``generate``'s cache for longseq models in transformers: the recurrence memory, kept per group of rows.

A batch whose rows have read the same number of tokens holds one :class:`~longseq.model.Memory`.  A padded batch
does not: each row reads only its own tokens (padding is skipped), so rows that read different numbers of tokens
have memories of different lengths, which no tensor holds together.  The cache then keeps one :class:`RowGroup` per
set of rows whose memories have the same shapes (and the same host-side state, an hourglass's phase), each a
``Memory`` of those rows; the model runs once per group.  Groups whose memories come to the same shapes (a
key/value memory that has filled up to its ``mem_len``) are joined again (:func:`merged`).

Rows are reordered, repeated and selected (beam search: ``reorder_cache``, ``batch_repeat_interleave``,
``batch_select_indices``) with :meth:`Memory.select <longseq.model.Memory.select>`, group by group.

As a pytree (``torch.export``) the cache is its memories' tensors, with their structure, the groups' rows and the
recurrence settings as context; ``seen`` is not carried (a cache rebuilt from its leaves has ``seen=None``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch.utils import _pytree as pytree

from longseq.config.model import Recurrence
from longseq.model import Memory, RingMemory

__all__ = ["LongseqCache", "RowGroup", "merged", "row_groups", "selected"]


@dataclass(frozen=True)
class RowGroup:
    """The memory of some rows of the batch: ``rows`` (their indices, in the memory's order; None: every row, in
    order) and their ``memory`` (None: nothing read yet)."""

    rows: tuple[int, ...] | None
    memory: Memory | None


class LongseqCache:
    """``generate``'s cache (see the module docstring): the rows' memories and the
    :class:`~longseq.config.model.Recurrence` they were made with (None: the model's own).  A ring memory is
    written in place: continue from a cache once.

    ``seen`` counts the columns of ``input_ids`` read into it, padding included (generate's bookkeeping, on the
    host)."""

    is_compileable = False
    is_croppable = False

    def __init__(
        self,
        memory: Memory | None = None,
        recurrence: Recurrence | None = None,
        seen: int | None = 0,
        groups: Sequence[RowGroup] | None = None,
    ) -> None:
        self.groups: tuple[RowGroup, ...] = tuple(groups) if groups is not None else (RowGroup(None, memory),)
        self.recurrence = recurrence
        self.seen = seen

    @property
    def memory(self) -> Memory | None:
        """The memory of the whole batch; an error when the rows' memories differ in shape (a padded batch)."""
        if not self.whole:
            raise ValueError(
                f"this cache holds the memories of {len(self.groups)} groups of rows of different lengths (a padded "
                "batch: each row read its own tokens); read cache.groups"
            )
        return self.groups[0].memory

    @property
    def whole(self) -> bool:
        """Whether one memory holds every row, in order."""
        return len(self.groups) == 1 and self.groups[0].rows is None

    @property
    def is_linear(self) -> list[bool]:
        return [True]  # what it holds is not one entry per token: generate must not slice inputs by its length

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.seen or 0

    def after(self, groups: Sequence[RowGroup], tokens: int) -> LongseqCache:
        """The cache holding ``groups``, made by reading ``tokens`` more columns into this one."""
        return LongseqCache(None, self.recurrence, None if self.seen is None else self.seen + tokens, groups)

    # -- transformers' row operations (in place, as transformers' caches do them) --------------------------------
    def reorder_cache(self, beam_idx: Tensor) -> None:
        """Row i becomes the old row ``beam_idx[i]`` (beam search, after every step)."""
        self.groups = selected(self.groups, beam_idx)

    def batch_select_indices(self, indices: Tensor) -> None:
        """Keep the rows ``indices``, in that order."""
        self.groups = selected(self.groups, indices)

    def batch_repeat_interleave(self, repeats: int) -> None:
        """Every row ``repeats`` times, one after another (row i becomes rows i * repeats ... i * repeats + r - 1)."""
        rows = self.batch_size
        if rows is None:
            return  # nothing read: no row to repeat
        self.groups = selected(self.groups, torch.arange(rows).repeat_interleave(repeats))

    @property
    def batch_size(self) -> int | None:
        """Rows held (None when one empty memory holds them all)."""
        if self.whole:
            memory = self.groups[0].memory
            return None if memory is None else memory.batch_size
        return sum(len(g.rows) for g in self.groups)


def selected(groups: Sequence[RowGroup], sources: Tensor) -> tuple[RowGroup, ...]:
    """The groups of a batch whose row i is the old row ``sources[i]`` (reordered, repeated or a subset)."""
    sources = sources.detach().to("cpu", torch.long)
    if len(groups) == 1 and groups[0].rows is None:
        memory = groups[0].memory
        return (RowGroup(None, None if memory is None else memory.select(sources)),)
    out = []
    wanted = sources.tolist()
    for group in groups:
        where = {row: i for i, row in enumerate(group.rows)}
        new = [i for i, source in enumerate(wanted) if source in where]
        if new:
            local = torch.tensor([where[wanted[i]] for i in new])
            out.append(RowGroup(tuple(new), None if group.memory is None else group.memory.select(local)))
    covered = sum(len(g.rows) for g in out)
    if covered != len(wanted):
        raise ValueError(f"rows {sorted(set(wanted))} select rows the cache does not hold ({covered} of {len(wanted)})")
    return merged(out)


def row_groups(groups: Sequence[RowGroup], counts: Tensor) -> Iterator[tuple[Tensor, Memory | None, int]]:
    """(rows (g,), their memory, n) for every set of rows that share a memory and read ``n`` tokens now
    (``counts`` (B,): tokens per row); each row once."""
    for group in groups:
        rows = torch.arange(counts.size(0)) if group.rows is None else torch.tensor(group.rows)
        for n in sorted(set(counts[rows].tolist())):
            local = (counts[rows] == n).nonzero().flatten()
            memory = group.memory
            if memory is not None and local.numel() != rows.numel():
                memory = memory.select(local)
            yield rows[local], memory, int(n)


def merged(groups: Sequence[RowGroup]) -> tuple[RowGroup, ...]:
    """The groups with those whose memories have the same shapes joined; one group of every row in order when
    they all join (a ring memory, written in place, is never joined)."""
    out: list[tuple[Any, list[RowGroup]]] = []
    for group in groups:
        key = signature(group.memory)
        match = next((parts for k, parts in out if key is not None and k == key), None)
        if match is not None:
            match.append(group)
        else:
            out.append((key, [group]))
    joined = [parts[0] if len(parts) == 1 else _join(parts) for _, parts in out]
    if len(joined) == 1 and joined[0].rows is not None:
        return (_in_order(joined[0]),)
    return tuple(joined)


def _join(parts: list[RowGroup]) -> RowGroup:
    rows = tuple(r for p in parts for r in p.rows)
    return RowGroup(rows, Memory.join([p.memory for p in parts]))


def _in_order(group: RowGroup) -> RowGroup:
    """The group of every row as one memory in row order (rows None)."""
    if list(group.rows) != list(range(len(group.rows))):
        order = torch.tensor(group.rows).argsort()
        return RowGroup(None, None if group.memory is None else group.memory.select(order))
    return RowGroup(None, group.memory)


def signature(memory: Memory | None):
    """What two memories must share to be joined along the batch: their structure (every host-side field, an
    hourglass's phase included; the carried relative table aside) and every tensor's shape but the batch's, dtype
    and device.  None for a ring memory (never joined)."""
    if memory is None:
        return ("nothing read",)
    leaves: list[Tensor] = []
    try:
        skeleton = _skeleton(dataclasses.replace(memory, table=None), leaves)
    except ValueError:
        return None
    return skeleton, tuple((tuple(t.shape[1:]), t.dtype, t.device) for t in leaves)


# -- the cache as a pytree: the memories' tensors are the leaves, their structure (with a marker where each tensor
# was), the groups' rows and the recurrence settings the context.  The memory and its layer states are frozen
# dataclasses.
class _Leaf:
    """Where a tensor was in the memory's structure."""

    def __repr__(self) -> str:
        return "<tensor>"


LEAF = _Leaf()


def _skeleton(value, leaves: list):
    if isinstance(value, Tensor):
        leaves.append(value)
        return LEAF
    if value is None or isinstance(value, (bool, int, float, str, type)):  # a type: the memory's kind
        return value
    if isinstance(value, (tuple, list)):
        return type(value)(_skeleton(v, leaves) for v in value)
    if isinstance(value, RingMemory):
        raise ValueError(
            "a ring memory (generate's: written in place) cannot be flattened for torch.export; export a step over "
            "a cache that forward returned (hidden-state memory)"
        )
    if dataclasses.is_dataclass(value):
        fields = {f.name: _skeleton(getattr(value, f.name), leaves) for f in dataclasses.fields(value) if f.init}
        return dataclasses.replace(value, **fields)
    raise ValueError(f"a {type(value).__name__} in the cache's memory cannot be flattened")


def _fill(value, leaves):
    if value is LEAF:
        return next(leaves)
    if isinstance(value, (tuple, list)):
        return type(value)(_fill(v, leaves) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.replace(
            value, **{f.name: _fill(getattr(value, f.name), leaves) for f in dataclasses.fields(value) if f.init}
        )
    return value


def _flatten_cache(cache: LongseqCache) -> tuple[list[Tensor], tuple]:
    leaves: list[Tensor] = []
    skeleton = tuple((g.rows, _skeleton(g.memory, leaves)) for g in cache.groups)
    return leaves, (skeleton, cache.recurrence)


def _unflatten_cache(leaves, context: tuple) -> LongseqCache:
    skeleton, recurrence = context
    leaves = iter(leaves)
    groups = [RowGroup(rows, _fill(memory, leaves)) for rows, memory in skeleton]
    return LongseqCache(None, recurrence, seen=None, groups=groups)


def _flatten_cache_with_keys(cache: LongseqCache):
    leaves, context = _flatten_cache(cache)
    return [(pytree.SequenceKey(i), leaf) for i, leaf in enumerate(leaves)], context


pytree.register_pytree_node(
    LongseqCache,
    _flatten_cache,
    _unflatten_cache,
    serialized_type_name="longseq.integrations.longseq_cache.LongseqCache",
    flatten_with_keys_fn=_flatten_cache_with_keys,
)
