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

  * ``rope``: rotary positions (Su et al., 2021) on queries and keys, ``rope_theta``, with a scaling by
    ``rope_factor`` (:data:`ROPE_SCALINGS`): ``linear`` (position interpolation) or ``ntk`` (base rescaled) for
    longer evaluation memories, and transformers' ``dynamic``, ``llama3`` and ``yarn`` as pretrained models set
    them (their formulas are those of transformers' ``modeling_rope_utils.py``);
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
Compressive Transformer, which also indexes it so), a memory token one position before the segment.  Attention
sinks (``sinks``) are the first keys of the pass, [sinks; memory; segment]: at their slot there
(``sink_positions=cache``, StreamingLLM's), or rotary positions put them at their positions in the text (``text``).

Rope over a hidden-state memory rotates every key of [memory; segment] at its index in every pass.  A key/value
memory holds each key rotated once, at its position in the stream (as transformers' cache does: a pass turns its
segment alone, not the whole memory again), and sinks at their slot are turned to it every pass (a few keys); only
``rope_scaling=dynamic``, whose frequencies depend on the keys a pass reads, keeps keys before rotation and turns
them all every pass.  Positions differ by a constant between the two, so a cached key and a key recomputed from a
hidden-state memory give the same score up to rounding (the tests check the logits agree); angles are computed in
float64, so a key far into a stream keeps its distance exactly.
``clamp_len`` clamps the distances of the tables (sinusoidal, shaw, alibi, t5); rope and nope do not read it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, ClassVar, NamedTuple

import torch
from torch import Tensor, nn

ROPE_OPTIONS = (
    "positions.rope_theta",
    "positions.rope_scaling",
    "positions.rope_factor",
    "positions.rope_original_len",
    "positions.rope_low_freq_factor",
    "positions.rope_high_freq_factor",
    "positions.rope_beta_fast",
    "positions.rope_beta_slow",
    "positions.rope_attention_factor",
    "positions.rope_truncate",
)
COMMON_UNREAD = (*ROPE_OPTIONS, "positions.t5_buckets")
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
    rope_original_len: int = 0  # the scalings' other options (PositionConfig's, same names)
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_beta_fast: float = 32.0
    rope_beta_slow: float = 1.0
    rope_attention_factor: float = 0.0
    rope_truncate: bool = True


SHAPE_OPTIONS = tuple(f.name for f in fields(Shape) if f.name not in ("d_model", "n_head", "d_head", "bidirectional"))
# the PositionConfig fields a Shape takes, under the same names


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
    extrapolates: ClassVar[bool] = True  # scores at distances longer than training's stay as good (rope's break)

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

    @classmethod
    def unread_options(cls, positions) -> set[str]:
        """The option paths this encoding does not read under ``positions`` (a PositionConfig)."""
        return set(cls.unread)

    rotation = None  # what an encoding that rotates queries and keys computes once per pass (rope: Rotation)

    def rotate(self, query: Tensor, key: Tensor, rotation=None) -> tuple[Tensor, Tensor]:
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


def default_frequencies(theta: float, d: int, device, dtype: torch.dtype) -> Tensor:
    """theta^(-2k/D) for k < D/2, computed as transformers does (so that float32 frequencies agree bit for bit)."""
    return 1.0 / theta ** (torch.arange(0, d, 2, device=device, dtype=dtype) / d)


def _ntk(shape: Shape, klen: int, device, dtype) -> Tensor:
    """The base rescaled by ``factor^(D / (D - 2))`` (NTK-aware scaling) for every length."""
    d, factor = shape.d_head, shape.rope_factor
    return default_frequencies(shape.rope_theta * (factor ** (d / (d - 2)) if d > 2 else 1.0), d, device, dtype)


def _dynamic(shape: Shape, klen: int, device, dtype) -> Tensor:
    """transformers' ``dynamic`` (dynamic NTK): for a window of ``klen`` keys beyond ``rope_original_len`` the base
    is theta (factor klen / original - (factor - 1))^(D / (D - 2)); within it, theta."""
    d, factor, original = shape.d_head, shape.rope_factor, shape.rope_original_len
    length = max(klen, original)
    theta = shape.rope_theta * ((factor * length / original) - (factor - 1)) ** (d / (d - 2))
    return default_frequencies(theta, d, device, dtype)


def _llama3(shape: Shape, klen: int, device, dtype) -> Tensor:
    """Llama 3.1's bands: wavelengths below original / high_freq_factor kept, above original / low_freq_factor
    divided by ``factor``, and between the two a smooth interpolation."""
    inv_freq = default_frequencies(shape.rope_theta, shape.d_head, device, dtype)
    factor, low, high, original = (
        shape.rope_factor,
        shape.rope_low_freq_factor,
        shape.rope_high_freq_factor,
        shape.rope_original_len,
    )
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > original / low, inv_freq / factor, inv_freq)
    smooth = (original / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < original / high) * ~(wavelen > original / low)
    return torch.where(medium, smoothed, scaled)


def _yarn(shape: Shape, klen: int, device, dtype) -> Tensor:
    """YaRN (Peng et al., 2023): each frequency between extrapolation (theta^(-2k/D)) and interpolation (divided by
    ``factor``), by a linear ramp over the dimensions that turn between ``beta_fast`` and ``beta_slow`` times in
    ``rope_original_len`` positions (its ends rounded outwards with ``rope_truncate``)."""
    d, theta, factor = shape.d_head, shape.rope_theta, shape.rope_factor

    def dimension(rotations: float) -> float:  # the dimension that turns ``rotations`` times in the original context
        return (d * math.log(shape.rope_original_len / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = dimension(shape.rope_beta_fast), dimension(shape.rope_beta_slow)
    if shape.rope_truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    high = high + 0.001 if low == high else high  # no division by zero
    pos_freqs = theta ** (torch.arange(0, d, 2, device=device, dtype=dtype) / d)
    ramp = ((torch.arange(d // 2, device=device, dtype=dtype) - low) / (high - low)).clamp(0, 1)
    extrapolation = 1 - ramp
    return (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation


def yarn_attention_factor(shape: Shape) -> float:
    """What YaRN multiplies cos and sin by: ``rope_attention_factor``, or 0.1 ln(factor) + 1 (the paper's
    sqrt(1/t)) when it is 0."""
    if shape.rope_attention_factor:
        return shape.rope_attention_factor
    return 0.1 * math.log(shape.rope_factor) + 1.0 if shape.rope_factor > 1 else 1.0


class RopeScaling(NamedTuple):
    """A rope scaling: the frequencies ``(shape, klen, device, dtype) -> (D/2,)`` for a window of ``klen`` keys,
    what multiplies cos and sin (``(shape) -> float``), and the options it reads."""

    frequencies: Callable[[Shape, int, Any, torch.dtype], Tensor]
    attention_factor: Callable[[Shape], float] = lambda shape: 1.0
    reads: tuple[str, ...] = ()


ROPE_SCALINGS: dict[str, RopeScaling] = {
    "none": RopeScaling(lambda s, k, device, dtype: default_frequencies(s.rope_theta, s.d_head, device, dtype)),
    "linear": RopeScaling(
        lambda s, k, device, dtype: default_frequencies(s.rope_theta, s.d_head, device, dtype) / s.rope_factor,
        reads=("rope_factor",),
    ),
    "ntk": RopeScaling(_ntk, reads=("rope_factor",)),
    "dynamic": RopeScaling(_dynamic, reads=("rope_factor", "rope_original_len")),
    "llama3": RopeScaling(
        _llama3, reads=("rope_factor", "rope_original_len", "rope_low_freq_factor", "rope_high_freq_factor")
    ),
    "yarn": RopeScaling(
        _yarn,
        yarn_attention_factor,
        (
            "rope_factor",
            "rope_original_len",
            "rope_beta_fast",
            "rope_beta_slow",
            "rope_attention_factor",
            "rope_truncate",
        ),
    ),
}


def rope_unread(scaling: str) -> set[str]:
    """The rope options a scaling does not read (``rope_theta`` and ``rope_scaling`` are read by all)."""
    read = {f"positions.{name}" for name in ROPE_SCALINGS[scaling].reads}
    return set(ROPE_OPTIONS[2:]) - read


def rotary_frequencies(shape: Shape, device, dtype: torch.dtype, klen: int = 0) -> Tensor:
    """The (D/2,) frequencies of ``shape``'s rope scaling (:data:`ROPE_SCALINGS`) for a window of ``klen`` keys:
    theta^(-2k/D) for k < D/2 unscaled; ``linear`` divides them by ``factor`` (position interpolation: positions /
    factor); ``ntk`` rescales the base by ``factor^(D / (D - 2))``; ``dynamic``, ``llama3`` and ``yarn`` as
    transformers computes them."""
    return ROPE_SCALINGS[shape.rope_scaling].frequencies(shape, klen, device, dtype)


def rotate_half(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x rotated pairwise: channels k and k + D/2 form the pair (the GPT-NeoX and Llama layout)."""
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-second, first], dim=-1) * sin


def _turned(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """``x`` (..., L, D) rotated by ``cos`` and ``sin`` (L or 1, D), computed in their precision."""
    return rotate_half(x.to(cos.dtype), cos, sin).to(x.dtype)


class Rotation(NamedTuple):
    """How one pass's queries and keys turn, computed once for every layer (:meth:`Rotary.rotation`): the cos and
    sin of its queries (T, D) and of the keys a layer turns (n, D), float32 (float64 for a float64 model).

    * ``cached`` False: the keys are every key of [memory; segment] (K rows), at their index in it (the memory holds
      layer inputs, or keys before rotation where the rotation depends on the pass: ``rope_scaling=dynamic``);
    * ``cached`` True: they are the segment's alone (T rows), at their positions in the stream: a key/value memory
      holds every key turned at its stream position once, as transformers' cache does, and ``turn`` (1, D) brings
      the first ``sinks`` of them from the stream's first positions to their slots in the cache (attention sinks at
      their slot, ``sink_positions=cache``; None: where they are)."""

    query_cos: Tensor
    query_sin: Tensor
    key_cos: Tensor
    key_sin: Tensor
    cached: bool = False
    turn: tuple[Tensor, Tensor] | None = None
    sinks: int = 0

    def queries(self, query: Tensor) -> Tensor:
        """The segment's queries (B, H, T, D) turned."""
        return _turned(query, self.query_cos, self.query_sin)

    def stored(self, key: Tensor) -> Tensor:
        """The segment's keys (B, H, T, D) as a key/value memory holds them: turned when ``cached``."""
        return _turned(key, self.key_cos, self.key_sin) if self.cached else key

    def scored(self, key: Tensor) -> Tensor:
        """The keys of [memory; segment] (B, H, K, D), as the memory and :meth:`stored` hold them, as the scores see
        them."""
        if not self.cached:
            return _turned(key, self.key_cos, self.key_sin)
        if self.turn is None:
            return key
        return torch.cat([_turned(key[:, :, : self.sinks], *self.turn), key[:, :, self.sinks :]], dim=2)


class Rotary(PositionEncoding):
    """RoPE: queries and keys rotated by their positions, so each score depends on their distance: a key at its index
    in [memory; segment] and query i of T at K - T + i, or (a key/value memory) every key at its position in the
    stream, turned once.  Attention sinks sit at their slots in the cache (``sink_positions=cache``) or at their
    positions in the text (``text``)."""

    unread = ("positions.clamp_len", "positions.max_relative_distance", "positions.t5_buckets", *UV)
    extrapolates = False  # rotations never seen in training: char PTB 2.03 -> 3.38 bpc at twice the memory

    def __init__(self, shape: Shape) -> None:
        super().__init__(shape)
        if shape.d_head % 2:
            raise ValueError(f"pos=rope needs an even d_head, got {shape.d_head}")
        self.shape = shape
        self.attention_factor = ROPE_SCALINGS[shape.rope_scaling].attention_factor(shape)  # YaRN's: cos, sin times it

    @classmethod
    def unread_options(cls, positions) -> set[str]:
        return set(cls.unread) | rope_unread(positions.rope_scaling)

    @staticmethod
    def caches_turned_keys(shape: Shape) -> bool:
        """Whether a key's rotation is the same in every pass (so a key/value memory may hold it turned): not with
        ``dynamic``, whose frequencies depend on the keys a pass reads."""
        return shape.rope_scaling != "dynamic"

    @staticmethod
    def rotation(shape: Shape, qlen: int, klen: int, dtype: torch.dtype, device, **where) -> Rotation:
        """The pass's :class:`Rotation` for ``qlen`` queries over ``klen`` keys.  ``where``: ``cached`` (a key/value
        memory of turned keys), ``sinks``, ``gap`` (the stream's positions evicted between the sinks and the
        memory), ``position`` (where the segment starts in the stream), ``sink_positions`` (cache or text).  Angles
        are position x frequency in float64 (exact far into a stream), the frequencies transformers' own."""
        exact = _exact(dtype)
        frequencies = rotary_frequencies(shape, device, exact, klen).double()
        factor = ROPE_SCALINGS[shape.rope_scaling].attention_factor(shape)

        def table(positions: Tensor, scale: float = factor) -> tuple[Tensor, Tensor]:
            angles = torch.outer(positions, frequencies)  # (L, D/2)
            angles = torch.cat([angles, angles], dim=-1)
            return (angles.cos() * scale).to(exact), (angles.sin() * scale).to(exact)  # YaRN: scores times factor^2

        sinks, gap, text = where.get("sinks", 0), where.get("gap", 0), where.get("sink_positions") == "text"
        if where.get("cached"):
            cos, sin = table(where.get("position", 0) + torch.arange(qlen, device=device, dtype=torch.float64))
            turn = table(torch.tensor([float(gap)], device=device, dtype=torch.float64), 1.0)
            return Rotation(cos, sin, cos, sin, True, turn if sinks and gap and not text else None, sinks)
        positions = torch.arange(klen, device=device, dtype=torch.float64)
        if sinks and gap and text:
            positions[:sinks] -= gap
        cos, sin = table(positions)
        return Rotation(cos[klen - qlen :], sin[klen - qlen :], cos, sin)

    def rotate(self, query: Tensor, key: Tensor, rotation: Rotation | None = None) -> tuple[Tensor, Tensor]:
        """Queries and keys of [memory; segment] turned by ``rotation``, or at key j's index j and query i's
        K - T + i when none is given."""
        if rotation is None:
            rotation = self.rotation(self.shape, query.size(2), key.size(2), query.dtype, query.device)
        return rotation.queries(query), rotation.scored(key)


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
    unread = (*UV, *ROPE_OPTIONS)

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
