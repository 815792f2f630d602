"""Position encodings, a small registry chosen by ``ModelConfig.positions.pos``.

* ``sinusoidal``: the relative encoding of Transformer-XL (Dai et al., 2019, section 3.3): a sinusoidal R
  (Vaswani et al., 2017) of every distance, projected per layer by W_{k,R} (``r_net``), with the learned
  biases u and v.
* ``shaw``: the clipped learned relative table of Shaw et al. (2018), one key per distance in
  [-max, max] per layer (``rel_table``), without u and v.
* ``absolute``: the vanilla Transformer (Al-Rfou et al., 2018): sinusoidal absolute positions added to the
  embeddings, no relative term and no memory (a memory would repeat absolute positions).

An encoding creates its parameters on each attention module (``setup``), so checkpoints keep the paper's
tensor names, and turns the forward pass's :class:`RelativePositions` into that layer's relative table.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn


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


@dataclass(frozen=True)
class RelativePositions:
    """The relative positions of one forward pass, shared by all layers; each layer projects them with its own
    weights inside its own forward (so a sharded layer, FSDP, has gathered those weights when it reads them).

    ``distances`` (R,) are the distances of the table's rows; ``pos_emb`` (R, E) their sinusoidal embedding
    (None when the encoding does not use it); ``dtype`` the table's dtype."""

    distances: Tensor
    pos_emb: Tensor | None
    dtype: torch.dtype


def _exact(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


class SinusoidalRelative:
    """Transformer-XL's R with W_{k,R} per layer and the learned u, v."""

    learned_biases = True  # u and v (``r_w_bias``, ``r_r_bias``)
    relative = True  # a relative term in every score, so the memory can be reused across segments
    unread = ("positions.max_relative_distance",)  # the model options this encoding has no use for

    def setup(self, attention: nn.Module, d_model: int, max_relative_distance: int) -> None:
        attention.r_net = nn.Linear(d_model, attention.n_head * attention.d_head, bias=False)  # W_{k,R}

    def positions(self, distances: Tensor, d_model: int, dtype: torch.dtype, dropout: nn.Module) -> RelativePositions:
        pos_emb = dropout(sinusoidal_embedding(distances, d_model, _exact(dtype)).to(dtype))  # (R, E)
        return RelativePositions(distances, pos_emb, dtype)

    def relative_keys(self, attention: nn.Module, positions: RelativePositions) -> Tensor:
        """W_R R for every row, as (H, R, D)."""
        return attention.r_net(positions.pos_emb).view(-1, attention.n_head, attention.d_head).transpose(0, 1)

    def embed(self, hidden: Tensor) -> Tensor:
        return hidden


class ShawRelative(SinusoidalRelative):
    """Shaw et al.'s clipped learned table: terms (a) and (b) of the score, no u and v."""

    learned_biases = False
    unread = ("untie_r", "uv_init", "dropout_r")

    def setup(self, attention: nn.Module, d_model: int, max_relative_distance: int) -> None:
        attention.max_relative_distance = max_relative_distance
        width = attention.n_head * attention.d_head
        attention.rel_table = nn.Parameter(torch.zeros(2 * max_relative_distance + 1, width))

    def positions(self, distances: Tensor, d_model: int, dtype: torch.dtype, dropout: nn.Module) -> RelativePositions:
        return RelativePositions(distances, None, dtype)

    def relative_keys(self, attention: nn.Module, positions: RelativePositions) -> Tensor:
        """The learned keys a_{clip(d)} for every distance, as (H, R, D)."""
        rows = attention.rel_table[clipped_index(positions.distances, attention.max_relative_distance)]  # (R, H*D)
        return rows.view(-1, attention.n_head, attention.d_head).transpose(0, 1).to(positions.dtype)


class AbsolutePositions(ShawRelative):
    """The vanilla Transformer: sinusoidal positions 0 .. T-1 added to the input; content scores only."""

    relative = False
    unread = ("positions.clamp_len", "positions.max_relative_distance", "untie_r", "uv_init", "dropout_r")

    def setup(self, attention: nn.Module, d_model: int, max_relative_distance: int) -> None:
        pass

    def relative_keys(self, attention: nn.Module, positions: RelativePositions) -> None:
        return None

    def embed(self, hidden: Tensor) -> Tensor:
        positions = torch.arange(hidden.size(1), device=hidden.device, dtype=torch.float32)
        return hidden + sinusoidal_embedding(positions, hidden.size(-1), _exact(hidden.dtype)).to(hidden.dtype)


POSITION_ENCODINGS = {"sinusoidal": SinusoidalRelative(), "shaw": ShawRelative(), "absolute": AbsolutePositions()}


def position_encoding(name: str) -> SinusoidalRelative:
    """The encoding registered under ``name`` (``ModelConfig.positions.pos``)."""
    return POSITION_ENCODINGS[name]
