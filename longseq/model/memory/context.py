"""What a layer receives from the memory for one segment: one small object per kind of layer.

An attention layer gets an attention context, whose one method :meth:`project` turns the segment into queries of
the segment and keys and values of [memory; segment], as ``cache.update`` does in transformers.  It is written
three times, once per kind of attention memory:

* :class:`HiddenContext`: prefix the hidden-state memory to the segment, then project both;
* :class:`CacheContext`: project the segment alone and put the cached keys and values before it;
* :class:`RingContext`: project the segment alone and append it to the ring buffers in place.

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

Project = Callable[[Tensor], tuple[Tensor, Tensor, Tensor]]  # (B, L, E) -> q, k, v, each (B, H, L, D)
Norm = Callable[[Tensor], Tensor] | None  # the pre-LayerNorm, applied to the attention input; None for post-LN


class HiddenContext(NamedTuple):
    """An attention layer over a hidden-state memory (B, C + M, E) (compressed states first), or none; with
    ``with_mass`` the layer also returns the attention mass of every key (memory pruning)."""

    memory: Tensor | None = None
    with_mass: bool = False

    def project(self, project: Project, norm: Norm, hidden: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Queries (B, H, T, D) of the segment ``hidden`` (B, T, E); keys and values (B, H, K, D) of
        [memory; segment], projected together (the memory is normalised with the segment under pre-LN)."""
        memory = self.memory
        context = hidden if memory is None or memory.size(1) == 0 else torch.cat([memory, hidden], dim=1)  # (B, K, E)
        query, key, value = project(norm(context) if norm is not None else context)
        return query[:, :, -hidden.size(1) :], key, value


class CacheContext(NamedTuple):
    """An attention layer over cached keys and values (B, H, M, D) (None: nothing cached yet)."""

    keys: Tensor | None = None
    values: Tensor | None = None
    with_mass = False

    def project(self, project: Project, norm: Norm, hidden: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        query, key, value = project(norm(hidden) if norm is not None else hidden)  # (B, H, T, D) each
        if self.keys is not None and self.keys.size(2):
            key = torch.cat([self.keys, key], dim=2)  # (B, H, K, D)
            value = torch.cat([self.values, value], dim=2)
        return query, key, value


class RingContext(NamedTuple):
    """An attention layer over a :class:`~longseq.model.memory.cache.RingKV`: the segment's keys and values are
    appended in place, and those of [memory; segment] read as views (no copy per token)."""

    ring: object
    with_mass = False

    def project(self, project: Project, norm: Norm, hidden: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        query, key, value = project(norm(hidden) if norm is not None else hidden)
        key, value = self.ring.extend(key, value)  # (B, H, K, D)
        return query, key, value


class StateContext(NamedTuple):
    """A recurrent layer's part of the memory: its own state (None at the start of a stream), and with documents
    tracked ``docs`` = (document of every position (B, T), document of the last position before the segment
    (B,)); ``recurrence`` is the call's (an hourglass derives its shortened layers' from it); ``tokens`` the
    segment's token ids (B, T) when the stack was given them (an entropy boundary predictor learns from them)."""

    state: LayerState | None
    docs: tuple[Tensor, Tensor] | None
    recurrence: Recurrence
    tokens: Tensor | None = None
