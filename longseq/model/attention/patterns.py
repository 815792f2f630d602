"""Attention patterns as data: a predicate over (query position, key position) plus its parameters.

Positions are positions in the attention window [memory; segment]: key j sits at j (0 <= j < K) and
query i at M + i, so memory positions count as keys like any other.  The distance of a pair is
d = query - key; d >= 0 looks back.  A causal pattern allows only d >= 0; a bidirectional one
(``causal=False``, for encoders) applies the same shape to |d| and lets queries see later keys of the
segment.

==============  ===========================================================================  ==========
pattern         a query attends to                                                           reach
==============  ===========================================================================  ==========
full            every key                                                                    unbounded
window          the ``window`` nearest keys: |d| < window                                    window - 1
dilated         ``window`` keys spaced by the head's dilation: |d| % dil == 0, |d| < window * dil
strided         local ``window`` plus every ``stride``-th key: |d| < window or |d| % stride == 0
block_sparse    its own block of ``block_size`` keys plus the last ``block_summary`` columns of
                every block (Child et al., 2019, the "fixed" pattern)
global          the local window, plus global tokens (Longformer): a global token attends to
                every key and every query attends to it
bigbird         window + global + ``num_random_blocks`` key blocks per query block, drawn with
                a seeded hash (Zaheer et al., 2020)
==============  ===========================================================================  ==========

Blocks (``block_sparse``, ``bigbird``) are counted in window positions, so they line up with the
stream when ``mem_len`` and ``tgt_len`` are multiples of ``block_size``.  ``dilation`` holds one value for
every head or one per head (Longformer gives heads different dilations).

:meth:`AttentionPattern.allowed` is the definition; :class:`PatternMask` adds causality, ``same_length``,
document boundaries and global tokens, and hands kernels either the dense mask or the block of it they
need, together with the range of keys a block of queries can reach (what makes local patterns linear).
:meth:`AttentionPattern.rule` is the predicate elementwise, so the same definition also serves FlexAttention's
``mask_mod`` one pair at a time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from torch import Tensor

from longseq.config.base import ConfigError, check_choice
from longseq.config.model import ModelConfig, PatternConfig


class PatternError(ConfigError):
    """An attention pattern's parameters or inputs are invalid."""


class PatternKind(NamedTuple):
    """A pattern, as data: everything a kernel or the stack asks of it, so a new pattern is one entry of
    :data:`PATTERNS`.  The callables take the model's :class:`~longseq.config.model.PatternConfig` ``c``.

    * ``allows(c, query, key, span, dilation, random) -> bool tensor``: the predicate over window positions
      (``span`` is the distance, made absolute for a bidirectional pattern and clamped at 0; ``dilation`` the
      head's dilation; ``random`` the table of random key blocks, None without the ``random`` piece).
    * ``reads``: the parameters of ``c`` it reads (any other one set by a run is refused as unread).
    * ``local_reach(c)``: the largest |distance| of its local part, the band a kernel computes densely (masked by
      the predicate) before it adds the pattern's other keys; None: no band, every key is a candidate.
    * ``pieces(c)``: the keys it allows beyond the band, as pieces of :mod:`~longseq.model.attention.sparse`
      (``stride``: every ``stride``-th distance; ``summary``: the last ``block_summary`` columns of every block;
      ``random``: ``num_random_blocks`` seeded key blocks per query block).  The predicate must allow no pair that
      the band, the pieces and global tokens leave out.  Without pieces the pattern is local: its reach is the band's.
    * ``fills_band``: the predicate allows every pair inside the band (a plain band; None reach: every pair), so
      its pairs have a closed form.
    * ``has_global``: it has global tokens (``num_global`` and ``global_mask``), read and written by every query.
    * ``causal_keys(c, query)``: optional closed form of the number of keys a causal query at window positions
      ``query`` may attend to (else counted from the predicate, for :meth:`AttentionPattern.allowed_pairs`).
    """

    allows: Callable
    reads: tuple[str, ...]
    local_reach: Callable[[PatternConfig], int] | None = None
    pieces: Callable[[PatternConfig], tuple[str, ...]] = lambda c: ()
    fills_band: bool = True
    has_global: bool = False
    causal_keys: Callable[[PatternConfig, Tensor], Tensor] | None = None


def in_random_blocks(c: PatternConfig, query: Tensor, key: Tensor, random: Tensor | None) -> Tensor | bool:
    """Whether ``key`` lies in one of the random key blocks of ``query``'s block (False without a table)."""
    if random is None:
        return False
    last = random.size(0) - 1  # padding positions outside the window read the edge blocks (and are masked)
    return random[(query // c.block_size).clamp(0, last), (key // c.block_size).clamp(0, last)]


def _block_sparse(c, query, key, span, dilation, random) -> Tensor:
    size = c.block_size
    return (query // size == key // size) | (key % size >= size - c.block_summary)


def _window(c: PatternConfig) -> int:
    """The reach of a window: its ``window`` nearest keys."""
    return c.window - 1


PATTERNS: dict[str, PatternKind] = {  # the registry: the only place a pattern's name meets its behaviour
    "full": PatternKind(lambda c, q, k, span, d, r: torch.ones_like(span, dtype=torch.bool), ()),
    "window": PatternKind(lambda c, q, k, span, d, r: span < c.window, ("window",), local_reach=_window),
    "dilated": PatternKind(
        lambda c, q, k, span, d, r: (span % d == 0) & (span < c.window * d),
        ("window", "dilation"),
        local_reach=lambda c: (c.window - 1) * max(c.dilation),
        fills_band=False,
    ),
    "strided": PatternKind(
        lambda c, q, k, span, d, r: (span < c.window) | (span % c.stride == 0),
        ("window", "stride"),
        local_reach=_window,
        pieces=lambda c: ("stride",),
    ),
    "block_sparse": PatternKind(
        _block_sparse,
        ("block_size", "block_summary"),
        local_reach=lambda c: c.block_size - 1,  # the query's own block
        pieces=lambda c: ("summary",),
        fills_band=False,
        causal_keys=lambda c, q: q % c.block_size + 1 + q // c.block_size * c.block_summary,  # own block, summaries
    ),
    "global": PatternKind(
        lambda c, q, k, span, d, r: span < c.window, ("window", "num_global"), local_reach=_window, has_global=True
    ),
    "bigbird": PatternKind(
        lambda c, q, k, span, d, r: (span < c.window) | in_random_blocks(c, q, k, r),
        ("window", "block_size", "num_global", "num_random_blocks", "pattern_seed"),
        local_reach=_window,
        pieces=lambda c: ("random",) if c.num_random_blocks else (),
        has_global=True,
    ),
}


@dataclass(frozen=True)
class AttentionPattern:
    """One layer's attention pattern: the :class:`PatternKind` that ``name`` registers, with the model's pattern
    parameters ``config`` (:class:`~longseq.config.model.PatternConfig`, shared by the layers; its ``attention``
    list is not read here).  What kernels and the stack ask of the kind is worked out once, when the pattern is
    made (a layer is built), never per call:

    * ``causal``: not ``config.bidirectional``;
    * ``local_reach``, ``pieces`` and ``has_global``: the kind's, for these parameters;
    * ``reach``: the largest |distance| an ordinary (non-global) query attends to; the band's for a pattern without
      pieces, else None (unbounded);
    * ``is_band``: it allows exactly the pairs within ``reach`` (None: every pair); ``is_full``: it allows every
      pair (full attention).
    """

    name: str = "full"
    config: PatternConfig = field(default_factory=PatternConfig, hash=False)
    kind: PatternKind = field(init=False, repr=False, compare=False)
    causal: bool = field(init=False, repr=False, compare=False)
    local_reach: int | None = field(init=False, repr=False, compare=False)
    pieces: tuple[str, ...] = field(init=False, repr=False, compare=False)
    reach: int | None = field(init=False, repr=False, compare=False)
    is_band: bool = field(init=False, repr=False, compare=False)
    is_full: bool = field(init=False, repr=False, compare=False)
    has_global: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        try:
            check_choice("pattern.attention", self.name, tuple(PATTERNS))
        except ConfigError as exc:
            raise PatternError(str(exc)) from None
        kind, c = PATTERNS[self.name], self.config
        local_reach = None if kind.local_reach is None else kind.local_reach(c)
        pieces = tuple(kind.pieces(c))
        derived = {
            "kind": kind,
            "causal": not c.bidirectional,
            "local_reach": local_reach,
            "pieces": pieces,
            "reach": None if pieces else local_reach,
            "is_band": kind.fills_band and not pieces,
            "is_full": kind.fills_band and not pieces and local_reach is None,
            "has_global": kind.has_global,
        }
        for name, value in derived.items():
            object.__setattr__(self, name, value)  # frozen: set once, here

    def allowed(self, query: Tensor, key: Tensor, klen: int) -> Tensor:
        """The pattern's own predicate: True where query position ``query`` (..., Tq, 1) may attend to key
        position ``key`` (..., 1, Tk); returns (H or 1, ..., Tq, Tk).  Causality and global tokens are added by
        :class:`PatternMask`; ``klen`` is the window length, for the random blocks."""
        distance = query - key  # (..., Tq, Tk)
        dilation = torch.tensor(self.config.dilation, device=query.device).view(-1, *[1] * distance.dim())  # (H|1, 1..)
        ok = self.rule(query, key, dilation, self.random_table(klen, query.device))
        return ok if ok.dim() > distance.dim() else ok[None]  # (H or 1, ..., Tq, Tk)

    def rule(self, query: Tensor, key: Tensor, dilation: Tensor, random: Tensor | None) -> Tensor:
        """The predicate, elementwise over broadcastable positions (also the body of FlexAttention's ``mask_mod``,
        one pair at a time): ``dilation`` broadcasts against the pairs, ``random`` is :meth:`random_table`."""
        span = query - key if self.causal else (query - key).abs()
        span = span.clamp(min=0)  # future keys of a causal pattern are removed by the causal mask
        return self.kind.allows(self.config, query, key, span, dilation, random)

    def allows_every_pair(self, qlen: int, klen: int, chunk: int = 256) -> bool:
        """Whether the pattern allows every pair that full attention does (causal: every key up to the query) for
        ``qlen`` queries at the end of a ``klen``-long window, so that it computes full attention at those lengths
        (a ``window`` wider than segment plus memory).  Read in blocks of ``chunk`` queries, stopping at the first
        pair it forbids."""
        if self.is_band:  # every distance up to klen - 1 lies inside it
            return self.reach is None or self.reach >= klen - 1
        key = torch.arange(klen)[None, :]  # (1, K)
        dilation = torch.tensor(self.config.dilation).view(-1, 1, 1)  # (H or 1, 1, 1)
        random = self.random_table(klen)
        for start in range(klen - qlen, klen, chunk):
            query = torch.arange(start, min(start + chunk, klen))[:, None]  # (Tq, 1)
            ok = self.rule(query, key, dilation, random)  # (H or 1, Tq, K)
            if not bool((ok | (key > query) if self.causal else ok).all()):
                return False
        return True

    def allowed_pairs(self, qlen: int, klen: int, chunk: int = 256) -> int:
        """How many (query, key) pairs the pattern allows (causal: up to the query) for ``qlen`` queries at the end of
        a ``klen``-long window, global tokens aside: what the attention's FLOPs scale with (model FLOPs
        utilisation).  Full attention, causal bands and a kind's ``causal_keys`` in closed form, the others counted
        in blocks of ``chunk`` queries."""
        mlen = klen - qlen
        if self.is_full:
            return qlen * mlen + qlen * (qlen + 1) // 2 if self.causal else qlen * klen
        if self.causal and (self.is_band or self.kind.causal_keys is not None):
            query = torch.arange(mlen, klen)
            keys = (query + 1).clamp(max=self.reach + 1) if self.is_band else self.kind.causal_keys(self.config, query)
            return int(keys.sum())
        key = torch.arange(klen)[None, :]  # (1, K)
        dilation = torch.tensor(self.config.dilation).view(-1, 1, 1)  # (H or 1, 1, 1)
        random, total = self.random_table(klen), 0.0
        for start in range(mlen, klen, chunk):
            query = torch.arange(start, min(start + chunk, klen))[:, None]  # (Tq, 1)
            ok = self.rule(query, key, dilation, random)  # (H or 1, Tq, K)
            ok = ok & (key <= query) if self.causal else ok.expand(*ok.shape[:-2], query.size(0), klen)
            total += float(ok.sum()) / (ok.size(0) if ok.dim() == 3 else 1)  # the mean over heads (a dilation each)
        return round(total)

    def random_picks(self, klen: int, device: torch.device | None = None) -> tuple[Tensor, Tensor]:
        """The random key blocks of every query block of a ``klen``-long window: (picks, valid), both (n, r) for
        n = ceil(klen / block_size) blocks and r = min(num_random_blocks, n).  Each (query block, key block) pair
        gets a hash of (seed, qb, kb) and a query block keeps its highest eligible ones, so a block's choice does
        not depend on which other queries are asked; ``valid`` is False where a causal query block early in the
        window has fewer than r eligible blocks."""
        c = self.config
        n = -(-klen // c.block_size)
        rows = torch.arange(n, device=device)[:, None]  # (n, 1) query blocks
        cols = torch.arange(n, device=device)[None, :]  # (1, n) key blocks
        score = _mix(rows * 1_000_003 + cols * 7_919 + c.pattern_seed * 104_729)  # (n, n)
        if self.causal:
            score = score.masked_fill(cols > rows, -1)
        top = score.topk(min(c.num_random_blocks, n), dim=1)  # (n, r)
        return top.indices, top.values >= 0

    def random_table(self, klen: int, device: torch.device | None = None) -> Tensor | None:
        """(n, n) bool: the random key blocks of each query block (see :meth:`random_picks`); None without the
        ``random`` piece."""
        if "random" not in self.pieces:
            return None
        return picks_table(*self.random_picks(klen, device))


def picks_table(picks: Tensor, valid: Tensor) -> Tensor:
    """(n, n) bool: :meth:`AttentionPattern.random_picks`' (picks, valid), both (n, r), as a table of each query
    block's random key blocks."""
    n = picks.size(0)
    return torch.zeros(n, n, dtype=torch.bool, device=picks.device).scatter_(1, picks, valid)


def layer_patterns(config: ModelConfig) -> list[AttentionPattern]:
    """One :class:`AttentionPattern` per layer of ``config`` (``attention`` holds one name or one per layer)."""
    return [AttentionPattern(name, config.pattern) for name in config.layer_pattern_names]


def _mix(x: Tensor) -> Tensor:
    """A small integer hash (xorshift-multiply), non-negative, deterministic on every device."""
    x = x & 0x7FFFFFFF
    x = ((x ^ (x >> 15)) * 0x2C1B3C6D) & 0x7FFFFFFF
    x = ((x ^ (x >> 12)) * 0x297A2D39) & 0x7FFFFFFF
    return x ^ (x >> 15)


@dataclass
class PatternMask:
    """Which (query, key) pairs of one layer's attention are forbidden.

    Combines the pattern with causality, ``same_length`` (``span``: only the last ``span`` keys),
    document ids (B, T) / (B, K), global tokens ``global_keys`` (B, K) and attention sinks (``sinks``: the first
    keys, seen by every query after them).  Kernels ask for :meth:`forbidden` on a block and for the
    :meth:`key_range` a block of queries can reach.
    """

    pattern: AttentionPattern
    qlen: int
    mlen: int
    span: int | None = None
    query_docs: Tensor | None = None  # (B, T)
    key_docs: Tensor | None = None  # (B, K)
    global_keys: Tensor | None = None  # (B, K) bool
    device: torch.device | None = None
    dropped_keys: Tensor | None = None  # (B, K) bool: memory slots that memory dropout hides from every query
    global_rows: tuple[tuple[int, ...], ...] | None = None  # per batch row, the window positions of its global tokens
    sinks: int = 0  # keys [0, sinks) are attention sinks: every later query sees them, whatever the pattern and span
    _blocks: dict = field(default_factory=dict, init=False, repr=False, compare=False)  # layers share the blocks

    @property
    def has_global_tokens(self) -> bool:
        """Whether the mask has global flags (read from no tensor: a flag tensor that happens to be all False
        takes the general path, which is exact too)."""
        return self.global_keys is not None

    @property
    def klen(self) -> int:
        return self.mlen + self.qlen

    @property
    def global_positions(self) -> tuple[tuple[int, ...], ...]:
        """Per batch row, the window positions of its global tokens, on the host: what the sparse kernel lays its
        global columns and rows out by.  Given by the stack (:func:`global_positions`); a mask made with flags
        alone reads them from the flags once."""
        if self.global_rows is None:
            flags = [] if self.global_keys is None else self.global_keys.tolist()
            self.global_rows = tuple(tuple(i for i, flag in enumerate(row) if flag) for row in flags)
        return self.global_rows

    @property
    def is_causal_full(self) -> bool:
        """True when the mask is the plain causal (or same_length) mask shared by every batch row and head."""
        return self.pattern.is_full and self.pattern.causal and self.key_docs is None and self.dropped_keys is None

    def forbidden(self, q0: int = 0, q1: int | None = None, k0: int = 0, k1: int | None = None) -> Tensor:
        """True where attention is forbidden, for queries [q0, q1) and keys [k0, k1): a bool tensor
        broadcastable to (B, H, q1 - q0, k1 - k0).  Computed once per block for all layers sharing the mask."""
        q1 = self.qlen if q1 is None else q1
        k1 = self.klen if k1 is None else k1

        def make() -> Tensor:
            query = torch.arange(q0, q1, device=self.device)[:, None] + self.mlen  # (Tq, 1) window positions
            key = torch.arange(k0, k1, device=self.device)[None, :]  # (1, Tk)
            return self.forbidden_at(query, key)

        return self.shared((q0, q1, k0, k1), make)

    def shared(self, key: tuple, make):
        """``make()``, computed once for all the layers sharing this mask (cached under ``key``); under
        ``torch.compile`` the traced graph computes it where it is used (a key of symbolic lengths cannot be
        hashed without fixing them, which would compile the model again for every memory length)."""
        if torch.compiler.is_compiling():
            return make()
        if key not in self._blocks:
            self._blocks[key] = make()
        return self._blocks[key]

    def first_forbidden(self, q0: int, k0: int) -> int:
        """A key column, counted from key ``k0``, before which no query of a block starting at query ``q0`` is
        forbidden: for the plain causal mask (no documents, dropped slots or ``same_length``) the first future key
        of the block's first query, else 0 (no bound).  Host arithmetic: nothing is read from a tensor."""
        if self.is_causal_full and self.span is None:
            return max(0, self.mlen + q0 + 1 - k0)
        return 0

    def banded(self, n_blocks: int, block: int, before: int, width: int) -> Tensor:
        """:meth:`forbidden` for the banded layout: block b's queries [M + b * block, ...) over keys starting
        ``before`` positions earlier, ``width`` of them; (B or 1, H or 1, n, block, W).  Padded queries past the
        segment attend anywhere (their output is dropped).  Computed once for all layers sharing the mask."""

        def make() -> Tensor:
            starts = self.mlen + torch.arange(n_blocks, device=self.device)[:, None, None] * block  # (n, 1, 1)
            query = starts + torch.arange(block, device=self.device)[:, None]  # (n, block, 1)
            key = starts - before + torch.arange(width, device=self.device)  # (n, 1, W)
            return self.forbidden_at(query, key) & (query < self.klen)

        return self.shared(("banded", n_blocks, block, before, width), make)

    def forbidden_at(self, query: Tensor, key: Tensor) -> Tensor:
        """:meth:`forbidden` for window positions of any broadcastable shapes (..., Tq, 1) and (..., 1, Tk):
        returns (B or 1, H or 1, ..., Tq, Tk).  Keys outside [0, K) (padding) are forbidden."""
        ok = self.pattern.allowed(query, key, self.klen)[None]  # (1, H or 1, ..., Tq, Tk)
        inside = (key >= 0) & (key < self.klen)
        key = key.clamp(0, self.klen - 1)
        if self.global_keys is not None:
            g_query = self.global_keys[:, query.clamp(0, self.klen - 1)]  # (B, ..., Tq, 1)
            g_key = self.global_keys[:, key]  # (B, ..., 1, Tk)
            ok = ok | (g_query | g_key)[:, None]  # (B, H or 1, ..., Tq, Tk)
        distance = query - key
        if self.span is not None:
            ok = ok & (distance < self.span)
        if self.sinks:
            ok = ok | (key < self.sinks)
        ok = ok & inside
        if self.pattern.causal:
            ok = ok & (distance >= 0)
        if self.key_docs is not None:
            q_docs = self.query_docs[:, (query - self.mlen).clamp(0, self.qlen - 1)]  # (B, ..., Tq, 1)
            ok = ok & (q_docs == self.key_docs[:, key])[:, None]
        if self.dropped_keys is not None:
            ok = ok & ~self.dropped_keys[:, key][:, None]
        return ~ok

    def mask_mod(self):
        """This mask as FlexAttention's ``mask_mod(b, h, q_idx, kv_idx) -> allowed``, one pair at a time: the same
        rules as :meth:`forbidden_at` (pattern, global tokens, causality, ``span``, documents), with query ``q_idx``
        of the segment at window position M + q_idx: keys are longer than queries, the memory comes first."""
        pattern, mlen, klen, span, sinks = self.pattern, self.mlen, self.klen, self.span, self.sinks
        dilation = torch.tensor(pattern.config.dilation, device=self.device)
        random = pattern.random_table(klen, self.device)
        flags, query_docs, key_docs, dropped = self.global_keys, self.query_docs, self.key_docs, self.dropped_keys

        def mask_mod(b, h, q_idx, kv_idx):
            query = q_idx + mlen
            ok = pattern.rule(query, kv_idx, dilation[h % dilation.numel()], random)
            if flags is not None:
                ok = ok | flags[b, query] | flags[b, kv_idx]
            distance = query - kv_idx
            if span is not None:
                ok = ok & (distance < span)
            if sinks:
                ok = ok | (kv_idx < sinks)
            if pattern.causal:
                ok = ok & (distance >= 0)
            if key_docs is not None:
                ok = ok & (query_docs[b, q_idx] == key_docs[b, kv_idx])
            if dropped is not None:
                ok = ok & ~dropped[b, kv_idx]
            return ok

        return mask_mod

    def band(self, block: int) -> tuple[int, int] | None:
        """For a local pattern, the keys a block of ``block`` queries needs before and after itself, rounded
        up to whole blocks (so every block has the same band); None when the pattern is not local."""
        reach = self.pattern.reach
        if reach is None or self.has_global_tokens or self.sinks:
            return None
        before = -(-reach // block) * block
        return before, (0 if self.pattern.causal else before)

    def key_range(self, q0: int, q1: int) -> tuple[int, int]:
        """Keys [lo, hi) outside which every query of [q0, q1) is forbidden."""
        first, last = self.mlen + q0, self.mlen + q1 - 1  # window positions of the block's queries
        reach = None if self.has_global_tokens else self.pattern.reach  # global tokens may lie anywhere
        lo = 0 if reach is None else max(0, first - reach)
        if self.span is not None:
            lo = max(lo, first - self.span + 1)
        if self.sinks:  # every query reaches the sinks
            lo = 0
        if self.pattern.causal:
            hi = last + 1
        else:
            hi = self.klen if reach is None else min(self.klen, last + reach + 1)
        return lo, hi


def global_keys(
    global_mask: Tensor | None, num_global: int, batch: int, qlen: int, mlen: int, device: torch.device | None
) -> Tensor | None:
    """Window-position global flags (B, K) from a per-segment ``global_mask`` (B, T) and the first
    ``num_global`` tokens of the segment; memory positions are never global.  None when there are none."""
    if global_mask is None and num_global == 0:
        return None
    if global_mask is not None:
        if not isinstance(global_mask, Tensor) or tuple(global_mask.shape) != (batch, qlen):
            shape = tuple(global_mask.shape) if isinstance(global_mask, Tensor) else type(global_mask).__name__
            raise PatternError(f"global_mask must have the input's shape (batch, time) = {(batch, qlen)}, got {shape}")
        flags = global_mask.to(device=device, dtype=torch.bool)
    else:
        flags = torch.zeros(batch, qlen, dtype=torch.bool, device=device)
    if num_global:
        flags = flags.clone()
        flags[:, :num_global] = True
    return torch.cat([flags.new_zeros(batch, mlen), flags], dim=1)  # (B, K)


def global_positions(
    global_mask: Tensor | None, num_global: int, batch: int, qlen: int, mlen: int
) -> tuple[tuple[int, ...], ...] | None:
    """The window positions of each row's global tokens, on the host, as :func:`global_keys` flags them: the first
    ``num_global`` of the segment (known without reading anything) and those of ``global_mask``, which is read
    once here (a host read: pass it on the CPU, where the data is made, and it costs no device synchronisation)."""
    if global_mask is None and num_global == 0:
        return None
    first = set(range(min(num_global, qlen)))
    if global_mask is None:
        return (tuple(mlen + i for i in sorted(first)),) * batch
    rows = global_mask.to(torch.bool).tolist()
    return tuple(tuple(mlen + i for i in sorted(first | {i for i, flag in enumerate(row) if flag})) for row in rows)
