"""Relative positions: the sinusoidal R of Transformer-XL (Vaswani et al., 2017; Dai et al., 2019, section 3.3)
and the clipped learned table of Shaw et al. (2018)."""

from __future__ import annotations

import torch
from torch import Tensor


def relative_distances(klen: int, clamp_len: int, device: torch.device | None = None, bottom: int = 0) -> Tensor:
    """Distances ``klen, klen-1, ..., bottom`` (length ``klen - bottom + 1``), clamped to ``clamp_len`` in
    absolute value when it is > 0.

    Row ``r`` of the relative embedding table is distance ``klen - r``.  A causal model needs
    ``bottom = 0``; a bidirectional one needs ``bottom = -(T - 1)`` for the later keys of the segment.
    The extra row for distance ``klen`` is never read by an unmasked score; it makes the rel-shift view
    non-overlapping (see :func:`longseq.model.attention.rel_shift`).
    """
    distances = torch.arange(klen, bottom - 1, -1, device=device, dtype=torch.float32)  # (R,)
    if clamp_len > 0:
        distances = distances.clamp(min=-clamp_len, max=clamp_len)
    return distances


def sinusoidal_embedding(distances: Tensor, d_model: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """R_d = [sin(d * w_0), ..., sin(d * w_{E/2-1}), cos(d * w_0), ...] with w_k = 10000^(-2k/E).

    Returns ``(len(distances), d_model)``.  The sin/cos halves are concatenated, not interleaved,
    matching the original Transformer-XL code so that converted checkpoints agree.  Computed in
    ``dtype`` (float32 unless the model runs in float64).
    """
    inv_freq = 1.0 / (10000 ** (torch.arange(0.0, d_model, 2.0, device=distances.device, dtype=dtype) / d_model))
    angles = torch.outer(distances.to(dtype), inv_freq)  # (R, E/2)
    return torch.cat([angles.sin(), angles.cos()], dim=-1)  # (R, E)


def clipped_index(distances: Tensor, max_distance: int) -> Tensor:
    """Row of a learned relative table (Shaw et al., 2018) for each distance: clip(d, -max, max) + max."""
    return distances.round().long().clamp(-max_distance, max_distance) + max_distance
