"""Position encodings, a small registry chosen by ``ModelConfig.positions.pos``: one module per attention layer,
owning its parameters.

Two families, which decide the kernel (:func:`longseq.model.attention.kernels.build_attention`):

* a **relative table** of keys, one row per distance, multiplied with the queries (a per-pair content term, run by
  the rel-shift, banded, sparse and Flex kernels):

  * ``sinusoidal``: the relative encoding of Transformer-XL (Dai et al., 2019, section 3.3): a sinusoidal R
    (Vaswani et al., 2017) of every distance, projected per layer by W_{k,R} (``rel.r_net``), with the learned
    biases u and v;
  * ``shaw``: the clipped learned relative table of Shaw et al. (2018), one key per distance in [-max, max] per
    layer (``rel.rel_table``), without u and v;

* **content scores** with at most an additive bias per (head, distance), run by PyTorch's
  ``scaled_dot_product_attention`` (FlashAttention and memory-efficient kernels on a GPU, the fused CPU kernel):

  * ``rope``: rotary positions (Su et al., 2021) on queries and keys, ``rope_theta``, with a ``linear`` (position
    interpolation) or ``ntk`` (base rescaled) scaling by ``rope_factor`` for longer evaluation memories;
  * ``alibi``: ALiBi (Press et al., 2022), -slope_h * distance, the paper's geometric slopes;
  * ``t5``: T5's bucketed relative bias (Raffel et al., 2020), ``t5_buckets`` learned scalars per head and layer,
    log-spaced buckets up to ``max_relative_distance``;
  * ``nope``: no positions (the causal mask alone orders the keys; Kazemnejad et al., 2023);
  * ``absolute``: the vanilla Transformer (Al-Rfou et al., 2018): sinusoidal absolute positions added to the
    embeddings, no memory (a memory would repeat absolute positions).

**Positions of memory slots.** Every encoding sees the keys of one pass as [compressed memory; memory; memory
tokens; segment], in that order, and a key's position is its index in it; query i of a segment of T over K keys
sits at index K - T + i.  Only differences of positions enter a score, so a memory slot keeps its distance to a
query whichever memory holds it: a compressed slot is one position (it stands for ``cmem_rate`` states, as in the
Compressive Transformer, which also indexes it so), a memory token one position before the segment.  A key/value
memory stores keys *before* rotation: rope rotates [memory; segment] at their indices in every pass, so a cached
key and a key recomputed from a hidden-state memory give the same score (the tests check the logits agree).
``clamp_len`` clamps the distances of the tables (sinusoidal, shaw, alibi, t5); rope and nope do not read it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn

COMMON_UNREAD = ("positions.rope_theta", "positions.rope_scaling", "positions.rope_factor", "positions.t5_buckets")
UV = ("untie_r", "uv_init", "dropout_r")  # the options of u, v and the dropout on R, read by sinusoidal only


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
    """The relative positions of one forward pass, shared by all layers; each layer turns them into its table with
    its own weights inside its own forward (so a sharded layer, FSDP, has gathered those weights when it reads them).

    ``distances`` (R,) are the distances of the table's rows; ``pos_emb`` (R, E) their sinusoidal embedding
    (None when the encoding does not use it); ``dtype`` the table's dtype."""

    distances: Tensor
    pos_emb: Tensor | None
    dtype: torch.dtype


def _exact(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


@dataclass(frozen=True)
class Shape:
    """What an encoding is built for: the model width and one attention layer's heads."""

    d_model: int
    n_head: int
    d_head: int
    max_relative_distance: int = 64
    rope_theta: float = 10000.0
    rope_scaling: str = "none"
    rope_factor: float = 1.0
    t5_buckets: int = 32
    bidirectional: bool = False  # a pattern that sees later keys (distances below 0)


class PositionEncoding(nn.Module):
    """One attention layer's position encoding.  The class says what the stack needs to know (whether u and v are
    learned, whether a memory can be reused, which options are unread, the embedding of absolute positions, the
    shared positions of a pass); the instance owns the layer's parameters and turns the pass's positions into:

    * :meth:`table`: the layer's relative keys (H, R, D) for the ``relative`` family, a bias (H, R) per distance
      row for the ``content`` family with a bias, or None;
    * :meth:`rotate`: the queries and keys as the scores see them (rope rotates them, the others return them)."""

    family: ClassVar[str] = "content"  # "relative": a (H, R, D) table of keys; "content": q.k plus a bias
    learned_biases: ClassVar[bool] = False  # u and v (``r_w_bias``, ``r_r_bias``)
    relative: ClassVar[bool] = True  # positions enter only as differences, so the memory can be reused
    unread: ClassVar[tuple[str, ...]] = ()  # the model options this encoding has no use for
    scores_distances: ClassVar[bool] = False  # a term per query-key distance (a table of keys or a bias)

    def __init__(self, shape: Shape) -> None:
        super().__init__()
        self.n_head, self.d_head = shape.n_head, shape.d_head

    @staticmethod
    def positions(distances: Tensor, d_model: int, dtype: torch.dtype, dropout: nn.Module) -> RelativePositions:
        return RelativePositions(distances, None, dtype)

    @staticmethod
    def embed(hidden: Tensor) -> Tensor:
        return hidden

    def table(self, positions: RelativePositions) -> Tensor | None:
        return None

    def rotate(self, query: Tensor, key: Tensor) -> tuple[Tensor, Tensor]:
        return query, key


class SinusoidalRelative(PositionEncoding):
    """Transformer-XL's R with W_{k,R} per layer and the learned u, v."""

    family = "relative"
    learned_biases = True
    scores_distances = True
    unread = ("positions.max_relative_distance", *COMMON_UNREAD)

    def __init__(self, shape: Shape) -> None:
        super().__init__(shape)
        self.r_net = nn.Linear(shape.d_model, shape.n_head * shape.d_head, bias=False)  # W_{k,R}

    @staticmethod
    def positions(distances: Tensor, d_model: int, dtype: torch.dtype, dropout: nn.Module) -> RelativePositions:
        pos_emb = dropout(sinusoidal_embedding(distances, d_model, _exact(dtype)).to(dtype))  # (R, E)
        return RelativePositions(distances, pos_emb, dtype)

    def table(self, positions: RelativePositions) -> Tensor:
        """W_R R for every row, as (H, R, D)."""
        return self.r_net(positions.pos_emb).view(-1, self.n_head, self.d_head).transpose(0, 1)


class ShawRelative(PositionEncoding):
    """Shaw et al.'s clipped learned table: terms (a) and (b) of the score, no u and v."""

    family = "relative"
    scores_distances = True
    unread = (*UV, *COMMON_UNREAD)

    def __init__(self, shape: Shape) -> None:
        super().__init__(shape)
        self.max_relative_distance = shape.max_relative_distance
        self.rel_table = nn.Parameter(torch.zeros(2 * shape.max_relative_distance + 1, shape.n_head * shape.d_head))

    def table(self, positions: RelativePositions) -> Tensor:
        """The learned keys a_{clip(d)} for every distance, as (H, R, D)."""
        rows = self.rel_table[clipped_index(positions.distances, self.max_relative_distance)]  # (R, H*D)
        return rows.view(-1, self.n_head, self.d_head).transpose(0, 1).to(positions.dtype)


class AbsolutePositions(PositionEncoding):
    """The vanilla Transformer: sinusoidal positions 0 .. T-1 added to the input; content scores only."""

    relative = False
    unread = ("positions.clamp_len", "positions.max_relative_distance", *UV, *COMMON_UNREAD)

    @staticmethod
    def embed(hidden: Tensor) -> Tensor:
        positions = torch.arange(hidden.size(1), device=hidden.device, dtype=torch.float32)
        return hidden + sinusoidal_embedding(positions, hidden.size(-1), _exact(hidden.dtype)).to(hidden.dtype)


class NoPositions(PositionEncoding):
    """NoPE: content scores, no position information beyond the causal mask."""

    unread = ("positions.clamp_len", "positions.max_relative_distance", *UV, *COMMON_UNREAD)


def rotary_frequencies(shape: Shape, device, dtype: torch.dtype) -> Tensor:
    """theta^(-2k/D) for k < D/2, with the base rescaled by ``factor^(D / (D - 2))`` for ``ntk`` (the NTK-aware
    scaling), and divided by ``factor`` for ``linear`` (position interpolation: positions / factor)."""
    d, theta, factor = shape.d_head, shape.rope_theta, shape.rope_factor
    if shape.rope_scaling == "ntk" and d > 2:
        theta = theta * factor ** (d / (d - 2))
    inv_freq = 1.0 / theta ** (torch.arange(0, d, 2, device=device, dtype=dtype) / d)
    return inv_freq / factor if shape.rope_scaling == "linear" else inv_freq


def rotate_half(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x rotated pairwise: channels k and k + D/2 form the pair (the GPT-NeoX and Llama layout)."""
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-second, first], dim=-1) * sin


class Rotary(PositionEncoding):
    """RoPE: queries and keys rotated by their index in [memory; segment], so each score depends on the distance."""

    unread = ("positions.clamp_len", "positions.max_relative_distance", "positions.t5_buckets", *UV)

    def __init__(self, shape: Shape) -> None:
        super().__init__(shape)
        if shape.d_head % 2:
            raise ValueError(f"pos=rope needs an even d_head, got {shape.d_head}")
        self.shape = shape

    def rotate(self, query: Tensor, key: Tensor) -> tuple[Tensor, Tensor]:
        """Key j at position j, query i at K - T + i (rotation in float32, float64 for a float64 model)."""
        qlen, klen = query.size(2), key.size(2)
        exact = _exact(query.dtype)
        positions = torch.arange(klen, device=query.device, dtype=exact)
        angles = torch.outer(positions, rotary_frequencies(self.shape, query.device, exact))  # (K, D/2)
        angles = torch.cat([angles, angles], dim=-1)
        cos, sin = angles.cos(), angles.sin()
        rotated_key = rotate_half(key.to(exact), cos, sin).to(key.dtype)
        rotated_query = rotate_half(query.to(exact), cos[klen - qlen :], sin[klen - qlen :]).to(query.dtype)
        return rotated_query, rotated_key


def alibi_slopes(n_head: int) -> list[float]:
    """The ALiBi paper's slopes: 2^(-8/n), 2^(-16/n), ... for n heads a power of 2; otherwise those of the nearest
    smaller power of 2, then every other slope of the next one (the authors' code).  Plain floats: a model built
    on the meta device (transformers' ``from_pretrained``) still has them."""
    if n_head & (n_head - 1) == 0:
        return [2.0 ** (-8.0 * (h + 1) / n_head) for h in range(n_head)]
    lower = 2 ** math.floor(math.log2(n_head))
    return alibi_slopes(lower) + alibi_slopes(2 * lower)[0::2][: n_head - lower]


class ALiBi(PositionEncoding):
    """ALiBi: -slope_h * |distance| added to every score of head h (no parameters)."""

    scores_distances = True
    unread = ("positions.max_relative_distance", *UV, *COMMON_UNREAD)

    def __init__(self, shape: Shape) -> None:
        super().__init__(shape)
        self.slopes = tuple(alibi_slopes(shape.n_head))  # not a buffer: from_pretrained builds on the meta device
        # and would leave a buffer that is not saved uninitialised

    def table(self, positions: RelativePositions) -> Tensor:
        """(H, R): the bias of every distance row."""
        distances = positions.distances
        slopes = torch.tensor(self.slopes, dtype=positions.dtype, device=distances.device)
        return -slopes[:, None] * distances.abs().to(positions.dtype)


def t5_buckets(distances: Tensor, n_buckets: int, max_distance: int, bidirectional: bool) -> Tensor:
    """T5's bucket of every distance (query - key): half the buckets exact (distances 0 .. n/2 - 1), the rest
    log-spaced up to ``max_distance``, beyond which distances share the last; a bidirectional model spends half the
    buckets on the later keys (negative distances)."""
    distance = distances.round().long()
    bucket = torch.zeros_like(distance)
    if bidirectional:
        n_buckets //= 2
        bucket = bucket + (distance < 0).long() * n_buckets
        distance = distance.abs()
    else:
        distance = distance.clamp(min=0)
    exact = n_buckets // 2
    scaled = torch.log(distance.clamp(min=1).float() / exact) / math.log(max(max_distance, exact + 1) / exact)
    large = (exact + (scaled * (n_buckets - exact)).long()).clamp(max=n_buckets - 1)
    return bucket + torch.where(distance < exact, distance, large)


class T5Bias(PositionEncoding):
    """T5's relative bias: one learned scalar per (bucket, head) in each layer (T5 shares the first layer's)."""

    scores_distances = True
    unread = (*UV, "positions.rope_theta", "positions.rope_scaling", "positions.rope_factor")

    def __init__(self, shape: Shape) -> None:
        super().__init__(shape)
        self.n_buckets, self.max_distance, self.bidirectional = (
            shape.t5_buckets,
            shape.max_relative_distance,
            shape.bidirectional,
        )
        self.rel_bias = nn.Parameter(torch.zeros(shape.t5_buckets, shape.n_head))

    def table(self, positions: RelativePositions) -> Tensor:
        """(H, R): the learned bias of every distance row's bucket."""
        buckets = t5_buckets(positions.distances, self.n_buckets, self.max_distance, self.bidirectional)
        return self.rel_bias[buckets].transpose(0, 1).to(positions.dtype)


POSITION_ENCODINGS: dict[str, type[PositionEncoding]] = {
    "sinusoidal": SinusoidalRelative,
    "shaw": ShawRelative,
    "absolute": AbsolutePositions,
    "rope": Rotary,
    "alibi": ALiBi,
    "t5": T5Bias,
    "nope": NoPositions,
}


def position_encoding(name: str) -> type[PositionEncoding]:
    """The encoding registered under ``name`` (``ModelConfig.positions.pos``)."""
    return POSITION_ENCODINGS[name]
