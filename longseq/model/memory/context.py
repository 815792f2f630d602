"""What a layer receives from the memory for one segment: one small object per kind of layer.

An attention layer gets an attention context, whose one method :meth:`project` turns the segment into queries of
the segment and keys and values of [memory; segment], as ``cache.update`` does in transformers; with the pass's
rotary :class:`~longseq.model.positions.Rotation`, queries and keys turned as the scores see them, and the keys as
the memory keeps them.  It is written three times, once per kind of attention memory:

* :class:`HiddenContext`: project the hidden-state memory (keys and values) and the segment, keys and values of
  the memory before the segment's, and turn them all;
* :class:`CacheContext`: project the segment alone, turn it, and put the cached keys and values before it;
* :class:`RingContext`: project the segment alone, turn it, and append it to the ring buffers in place.

A recurrent layer (ssm, conv, rnn; an hourglass block) gets a :class:`StateContext`: its own state and the
documents of the segment.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

from longseq.config.model import Recurrence
from longseq.model.memory.state import LayerState

# (B, L, E) -> q, k, v, each (B, H, L, D); with queries=False, None for q
Project = Callable[..., tuple[Tensor | None, Tensor, Tensor]]
Norm = Callable[[Tensor], Tensor] | None  # the pre-LayerNorm, applied to the attention input; None for post-LN
Projected = tuple[Tensor, Tensor, Tensor, Tensor]  # queries (B, H, T, D); keys, values, kept keys (B, H, K, D)


class HiddenContext(NamedTuple):
    """An attention layer over a hidden-state memory (B, C + M, E) (compressed states first), or none; with
    ``with_mass`` the layer also returns the attention mass of every key (memory pruning)."""

    memory: Tensor | None = None
    with_mass: bool = False

    def project(self, project: Project, norm: Norm, hidden: Tensor, rotation=None) -> Projected:
        """Queries (B, H, T, D) of the segment ``hidden`` (B, T, E); keys and values (B, H, K, D) of
        [memory; segment] (the memory normalised as the segment is under pre-LN), turned by ``rotation`` (every
        key); and the keys again (nothing keeps them: the memory holds layer inputs).  The memory is projected apart
        from the segment: its positions ask no queries, and a memory held without gradient (a detached one) costs
        no gradient of its own in the backward pass."""
        memory = self.memory
        if memory is None or memory.size(1) == 0:
            query, key, value = project(norm(hidden) if norm is not None else hidden)
        else:
            _, memory_key, memory_value = project(norm(memory) if norm is not None else memory, queries=False)
            query, key, value = project(norm(hidden) if norm is not None else hidden)  # (B, H, T, D) each
            key, value = torch.cat([memory_key, key], dim=2), torch.cat([memory_value, value], dim=2)  # (B, H, K, D)
        if rotation is not None:
            query, key = rotation.queries(query), rotation.scored(key)
        return query, key, value, key


class CacheContext(NamedTuple):
    """An attention layer over cached keys and values (B, H, M, D) (None: nothing cached yet)."""

    keys: Tensor | None = None
    values: Tensor | None = None
    with_mass = False

    def project(self, project: Project, norm: Norm, hidden: Tensor, rotation=None) -> Projected:
        """As :meth:`HiddenContext.project`; the keys kept are the cache's and the segment's as the memory holds them
        (:meth:`~longseq.model.positions.Rotation.stored`)."""
        query, key, value = project(norm(hidden) if norm is not None else hidden)  # (B, H, T, D) each
        if rotation is not None:
            query, key = rotation.queries(query), rotation.stored(key)
        if self.keys is not None and self.keys.size(2):
            key = torch.cat([self.keys, key], dim=2)  # (B, H, K, D)
            value = torch.cat([self.values, value], dim=2)
        return query, key if rotation is None else rotation.scored(key), value, key


class RingContext(NamedTuple):
    """An attention layer over a :class:`~longseq.model.memory.cache.RingKV`: the segment's keys and values are
    appended in place, and those of [memory; segment] read as views (no copy per token)."""

    ring: object
    with_mass = False

    def project(self, project: Project, norm: Norm, hidden: Tensor, rotation=None) -> Projected:
        """As :meth:`CacheContext.project`, the segment appended to the ring."""
        query, key, value = project(norm(hidden) if norm is not None else hidden)
        if rotation is not None:
            query, key = rotation.queries(query), rotation.stored(key)
        key, value = self.ring.extend(key, value)  # (B, H, K, D)
        return query, key if rotation is None else rotation.scored(key), value, key


class StateContext(NamedTuple):
    """A recurrent layer's part of the memory: its own state (None at the start of a stream), and with documents
    tracked ``docs`` = (document of every position (B, T), document of the last position before the segment
    (B,)); ``recurrence`` is the call's (an hourglass derives its shortened layers' from it); ``tokens`` the
    segment's token ids (B, T) when the stack was given them (an entropy boundary predictor learns from them)."""

    state: LayerState | None
    docs: tuple[Tensor, Tensor] | None
    recurrence: Recurrence
    tokens: Tensor | None = None
