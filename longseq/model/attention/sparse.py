"""Sparse patterns at sparse cost: ``strided``, ``block_sparse``, ``global`` (with global tokens) and ``bigbird``
(with random blocks) score only the pairs they allow, in pieces, under one softmax.

A query's keys are split into disjoint pieces, each a dense problem in a layout of its own:

* the band, the pattern's local part (the window of strided, global and bigbird; the own block of block_sparse):
  blocks of ``block`` queries, each over the same-width band of keys, as in the banded kernel;
* periodic columns: the keys at distances that are multiples of ``stride`` (strided), or the summary columns of
  every block (block_sparse).  Grouped by window position modulo the period P, either becomes dense attention of
  T/P queries over K/P keys, whose relative rows are every P-th row of the table: the rel-shift view applies.  The
  summary columns are the same for every query, so only their position term needs that layout;
* global columns: the few global tokens every query reads; the position term of one column over all queries is one
  reversed slice of the relative table;
* random blocks (bigbird): each query block with its r key blocks, the relative rows sliced per block pair;
* global rows: a global token's own query attends to everything; those few rows run over the whole key range and
  replace what the pieces gave them.

Every piece also masks the pairs an earlier piece holds, so each allowed pair is scored exactly once.  The scores of
all pieces are joined per query, pass one softmax, and each piece multiplies its share of the probabilities with
its own values.  Per query the cost is the band (``block`` + reach keys, rounded up to blocks) plus
ceil(K / stride), block_summary * ceil(K / block_size), the number of global tokens, or r * block_size keys; a
global token's own row costs K, which is why global tokens should be few.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from longseq.model.attention.patterns import PatternError, PatternMask, in_random_blocks, picks_table
from longseq.model.attention.shift import (
    DiagonalScores,
    PositionScores,
    RelativeScores,
    key_bands,
    relative_probs,
    table_rows,
)
from longseq.model.block import masked_softcap


def relative_scores(q_content: Tensor, key: Tensor, q_position: Tensor, rel_key: Tensor, forbidden: Tensor) -> Tensor:
    """The masked scores of one piece: q_c k^T + rel_shift(q_p R^T), -inf where forbidden (every piece's scores
    pass here, so tests can count the pairs a kernel visits)."""
    return RelativeScores.apply(q_content, key, q_position, rel_key, forbidden)


def _pad_rows(x: Tensor, front: int, total: int) -> Tensor:
    """(B, H, T, X) -> (B, H, total, X): ``front`` zero rows before, the rest after."""
    return F.pad(x, (0, 0, front, total - front - x.size(2)))


class Band:
    """The local part: blocks of ``block`` queries, block b over keys [M + b * block - before, ... + width)."""

    def __init__(self, mask: PatternMask, block: int) -> None:
        self.mask, self.block = mask, block
        self.before = -(-mask.pattern.local_reach // block) * block
        self.after = 0 if mask.pattern.causal else self.before
        self.width = self.before + block + self.after  # W
        self.n_blocks = -(-mask.qlen // block)
        self.forbidden = mask.banded(self.n_blocks, block, self.before, self.width)  # (B|1, H|1, n, block, W)

    def covers(self, query: Tensor, key: Tensor) -> Tensor:
        """True where key position ``key`` lies in the band of query position ``query`` (broadcastable)."""
        start = self.mask.mlen + (query - self.mask.mlen) // self.block * self.block
        return (key >= start - self.before) & (key < start + self.block + self.after)

    def scores(self, q_content: Tensor, q_position: Tensor, key: Tensor, rel_key: Tensor) -> Tensor:
        m = self.mask
        top = m.klen - (self.before + self.block)  # the table row of distance before + block
        n_rows = self.width + (1 if m.pattern.causal else self.block)  # later keys of the band reach lower rows
        rows = torch.arange(top, top + n_rows, device=key.device)
        table = table_rows(rel_key, rows)[:, None]  # (H, 1, R', D): every band has the same distances
        keys = key_bands(key, m.mlen, self.n_blocks, self.block, self.before, self.width)  # (B, H, n, W, D)
        scores = relative_scores(self._blocks(q_content), keys, self._blocks(q_position), table, self.forbidden)
        return scores.flatten(2, 3)[:, :, : m.qlen]  # (B, H, n, block, W) -> (B, H, T, W)

    def output(self, probs: Tensor, value: Tensor) -> Tensor:  # (B, H, T, W) -> (B, H, T, D)
        m = self.mask
        values = key_bands(value, m.mlen, self.n_blocks, self.block, self.before, self.width)  # (B, H, n, W, D)
        return torch.matmul(self._blocks(probs), values).flatten(2, 3)[:, :, : m.qlen]

    def _blocks(self, x: Tensor) -> Tensor:  # (B, H, T, X) -> (B, H, n, block, X)
        return _pad_rows(x, 0, self.n_blocks * self.block).unflatten(2, (self.n_blocks, self.block))


class Periodic:
    """Keys in classes modulo a period P: the query's own class (strided: distances that are multiples of the
    stride) or fixed classes (block_sparse: the last ``block_summary`` positions of every block).

    Window position p = a P + r is query a of class r; key class t holds keys b P + t.  Pair (a, b) of classes (r, t)
    has distance (a - b) P + r - t, so with x = na - a' + b', the rel-shift index of an (na x nb) problem, its
    relative row is K - r + t - (a0 + na) P + x P: every P-th row of the table.  Layout (B, H, P, S, na, nb) for S
    key classes per query class."""

    def __init__(self, mask: PatternMask, period: int, classes: Tensor | None, earlier: list) -> None:
        m, device = mask, mask.device
        self.mask, self.period, self.classes = m, period, classes
        self.a0 = m.mlen // period  # the first query's row
        self.na = (m.klen - 1) // period + 1 - self.a0  # query rows per class
        self.nb = -(-m.klen // period)  # key rows per class
        self.front = m.mlen - self.a0 * period  # queries before the segment in the first row (padding)
        r = torch.arange(period, device=device).view(-1, 1, 1, 1)  # (P, 1, 1, 1) query classes
        t = r if classes is None else classes.view(1, -1, 1, 1)  # (P or 1, S, 1, 1) key classes
        query = (self.a0 + torch.arange(self.na, device=device)).view(1, 1, -1, 1) * period + r  # (P, 1, na, 1)
        key = torch.arange(self.nb, device=device).view(1, 1, 1, -1) * period + t  # (P or 1, S, 1, nb)
        self.forbidden = m.forbidden_at(query, key)  # (B|1, H|1, P, S, na, nb)
        for piece in earlier:
            self.forbidden = self.forbidden | piece.covers(query, key)
        n_rows = self.nb + 1 if m.pattern.causal else self.na + self.nb
        base = m.klen - r[..., 0] + t[..., 0] - (self.a0 + self.na) * period  # (P or 1, S, 1)
        self.rows = base + torch.arange(n_rows, device=device) * period  # (P or 1, S, R')
        self.width = self.nb * (1 if classes is None else classes.numel())

    def _query_classes(self, x: Tensor) -> Tensor:  # (B, H, T, X) -> (B, H, P, na, X)
        rows = _pad_rows(x, self.front, self.na * self.period).unflatten(2, (self.na, self.period))
        return rows.transpose(2, 3)

    def _natural(self, x: Tensor) -> Tensor:  # (B, H, P, na, X) -> (B, H, T, X)
        return x.transpose(2, 3).flatten(2, 3)[:, :, self.front : self.front + self.mask.qlen]

    def _key_classes(self, x: Tensor) -> Tensor:  # (B, H, K, D) -> (B, H, P, nb, D)
        return _pad_rows(x, 0, self.nb * self.period).unflatten(2, (self.nb, self.period)).transpose(2, 3)


class StrideColumns(Periodic):
    """strided: query class r reads key class r, a dense (na x nb) problem per class in layout (B, H, P, na, nb)."""

    def __init__(self, mask: PatternMask, earlier: list) -> None:
        super().__init__(mask, mask.pattern.config.stride, None, earlier)
        self.forbidden = self.forbidden[..., 0, :, :]  # (B|1, H|1, P, na, nb): one key class per query class
        self.rows = self.rows[0]  # (1, R'): the same distances for every class

    def covers(self, query: Tensor, key: Tensor) -> Tensor:
        """True where ``key`` is at a multiple of the stride from ``query`` (this piece holds the pair)."""
        return (query - key) % self.period == 0

    def scores(self, q_content: Tensor, q_position: Tensor, key: Tensor, rel_key: Tensor) -> Tensor:
        qc, qp = self._query_classes(q_content), self._query_classes(q_position)  # (B, H, P, na, D)
        table = table_rows(rel_key, self.rows)  # (H, 1, R', D)
        scores = relative_scores(qc, self._key_classes(key), qp, table, self.forbidden)  # (B, H, P, na, nb)
        return self._natural(scores)  # (B, H, T, nb)

    def output(self, probs: Tensor, value: Tensor) -> Tensor:  # (B, H, T, nb) -> (B, H, T, D)
        return self._natural(torch.matmul(self._query_classes(probs), self._key_classes(value)))


class SummaryColumns(Periodic):
    """block_sparse: the same S * nb summary columns for every query, so the content term and the output are plain
    matmuls in query order; only the position term needs the class layout (one table per (r, t))."""

    def __init__(self, mask: PatternMask, earlier: list) -> None:
        size, summary = mask.pattern.config.block_size, mask.pattern.config.block_summary
        super().__init__(mask, size, torch.arange(size - summary, size, device=mask.device), earlier)
        blocks = torch.arange(self.nb, device=mask.device) * size
        self.columns = (self.classes[:, None] + blocks).flatten()  # (S * nb,) column t * nb + b is key b P + t

    def covers(self, query: Tensor, key: Tensor) -> Tensor:
        """True where ``key`` is a summary column (this piece holds it for every query)."""
        return key % self.period >= self.period - self.classes.numel()

    def scores(self, q_content: Tensor, q_position: Tensor, key: Tensor, rel_key: Tensor) -> Tensor:
        content = torch.matmul(q_content, self._columns(key).transpose(-1, -2))  # (B, H, T, S * nb)
        qp = self._query_classes(q_position)[:, :, :, None]  # (B, H, P, 1, na, D)
        table = table_rows(rel_key, self.rows)  # (H, P, S, R', D)
        position = PositionScores.apply(qp, table, self.forbidden, self.nb)  # (B, H, P, S, na, nb)
        position = position.permute(0, 1, 4, 2, 3, 5).flatten(2, 3).flatten(3, 4)  # (B, H, na * P, S * nb), one copy
        return content.add_(position[:, :, self.front : self.front + self.mask.qlen])  # in place: one buffer less

    def output(self, probs: Tensor, value: Tensor) -> Tensor:  # (B, H, T, S * nb) -> (B, H, T, D)
        return torch.matmul(probs, self._columns(value))

    def _columns(self, states: Tensor) -> Tensor:  # (B, H, K, D) -> (B, H, S * nb, D)
        return _pad_rows(states, 0, self.nb * self.period).index_select(2, self.columns)


class GlobalColumns:
    """The global tokens' keys, read by every query: (B, H, T, G) for the most global tokens G of a batch row
    (rows with fewer are padded with masked columns)."""

    def __init__(self, mask: PatternMask, earlier: list) -> None:
        m = self.mask = mask
        positions = m.global_positions  # host: the layout is known without reading the flags
        self.width = max(1, max(len(row) for row in positions))  # G
        self.host_columns = [list(row) + [0] * (self.width - len(row)) for row in positions]  # padding: masked
        self.columns = torch.tensor(self.host_columns, dtype=torch.long, device=m.device)  # (B, G)
        query = m.mlen + torch.arange(m.qlen, device=m.device)[:, None]  # (T, 1)
        rows = []
        for b in range(len(positions)):
            block = m.forbidden_at(query, self.columns[b][None, :])  # (B|1, H|1, T, G)
            rows.append(block[b if block.size(0) > 1 else 0])
        counts = torch.tensor([len(row) for row in positions], device=m.device)
        padding = torch.arange(self.width, device=m.device) >= counts[:, None]  # (B, G)
        self.forbidden = torch.stack(rows) | padding[:, None, None, :]  # (B, H|1, T, G)
        for piece in earlier:
            self.forbidden = self.forbidden | piece.covers(query, self.columns[:, None, :])[:, None]

    def covers(self, query: Tensor, key: Tensor) -> Tensor:
        """True where ``key`` is a global token (these columns hold it for every query): (B, 1, ...)."""
        return self.mask.global_keys[:, key.clamp(0, self.mask.klen - 1)][:, None]

    def scores(self, q_content: Tensor, q_position: Tensor, key: Tensor, rel_key: Tensor) -> Tensor:
        content = torch.matmul(q_content, self._gather(key).transpose(-1, -2))  # (B, H, T, G)
        position = DiagonalScores.apply(q_position, rel_key, self.host_columns)  # (B, H, T, G)
        return (content + position).masked_fill(self.forbidden, float("-inf"))

    def output(self, probs: Tensor, value: Tensor) -> Tensor:  # (B, H, T, G) -> (B, H, T, D)
        return torch.matmul(probs, self._gather(value))

    def _gather(self, states: Tensor) -> Tensor:  # (B, H, K, D) -> (B, H, G, D)
        batch, heads, _, d_head = states.shape
        return states.gather(2, self.columns[:, None, :, None].expand(batch, heads, -1, d_head))


class RandomBlocks:
    """BigBird's random key blocks: query block a (window positions [a s, a s + s)) with its r picked key blocks,
    layout (B, H, na, r, s, s).  Pair (a, b) of blocks has distances (a - b) s + i' - j', so its 2s relative rows
    start at K - (a - b + 1) s: one slice of the table per block pair."""

    def __init__(self, mask: PatternMask, earlier: list) -> None:
        m, device = mask, mask.device
        size = self.size = m.pattern.config.block_size
        picks, valid = m.pattern.random_picks(m.klen, device)  # (n, r) for every block of the window
        self.mask, self.n_blocks = m, picks.size(0)
        self.table = picks_table(picks, valid)  # (n, n): for covers
        self.a0 = m.mlen // size
        self.na = (m.klen - 1) // size + 1 - self.a0
        self.front = m.mlen - self.a0 * size
        self.picks, valid = picks[self.a0 : self.a0 + self.na], valid[self.a0 : self.a0 + self.na]  # (na, r)
        offsets = torch.arange(size, device=device)
        blocks = self.a0 + torch.arange(self.na, device=device)  # (na,) query blocks
        query = (blocks * size).view(-1, 1, 1, 1) + offsets.view(1, 1, -1, 1)  # (na, 1, s, 1)
        key = (self.picks * size)[:, :, None, None] + offsets  # (na, r, 1, s)
        self.forbidden = m.forbidden_at(query, key) | ~valid[:, :, None, None]  # (B|1, H|1, na, r, s, s)
        for piece in earlier:
            self.forbidden = self.forbidden | piece.covers(query, key)
        start = m.klen - (blocks[:, None] - self.picks + 1) * size  # (na, r)
        self.rows = start[:, :, None] + torch.arange(2 * size, device=device)  # (na, r, 2s)
        self.width = self.picks.size(1) * size

    def covers(self, query: Tensor, key: Tensor) -> Tensor:
        """True where ``key`` lies in one of the random blocks of ``query``'s block (this piece holds the pair)."""
        return in_random_blocks(self.mask.pattern.config, query, key, self.table)

    def scores(self, q_content: Tensor, q_position: Tensor, key: Tensor, rel_key: Tensor) -> Tensor:
        qc, qp = (self._query_blocks(x)[:, :, :, None] for x in (q_content, q_position))  # (B, H, na, 1, s, D)
        scores = relative_scores(qc, self._picked(key), qp, table_rows(rel_key, self.rows), self.forbidden)
        scores = scores.transpose(3, 4).flatten(2, 3).flatten(3, 4)  # (B, H, na, r, s, s) -> (B, H, na * s, r * s)
        return scores[:, :, self.front : self.front + self.mask.qlen]

    def output(self, probs: Tensor, value: Tensor) -> Tensor:  # (B, H, T, r * s) -> (B, H, T, D)
        out = torch.matmul(self._query_blocks(probs), self._picked(value).flatten(3, 4))  # (B, H, na, s, D)
        return out.flatten(2, 3)[:, :, self.front : self.front + self.mask.qlen]

    def _query_blocks(self, x: Tensor) -> Tensor:  # (B, H, T, X) -> (B, H, na, s, X)
        return _pad_rows(x, self.front, self.na * self.size).unflatten(2, (self.na, self.size))

    def _picked(self, states: Tensor) -> Tensor:  # (B, H, K, D) -> (B, H, na, r, s, D)
        blocks = _pad_rows(states, 0, self.n_blocks * self.size).unflatten(2, (self.n_blocks, self.size))
        return blocks.index_select(2, self.picks.flatten()).unflatten(2, self.picks.shape)  # see table_rows


PIECES: dict[str, type] = {  # what a pattern's ``pieces`` name (:class:`~longseq.model.attention.patterns.PatternKind`)
    "stride": StrideColumns,
    "summary": SummaryColumns,
    "random": RandomBlocks,
}


def sparse_pieces(mask: PatternMask, block: int) -> list:
    """The pieces of ``mask``'s pattern for query blocks of ``block``: its band, the global tokens' columns when
    the mask has global tokens, then the pieces the pattern names; built once per forward for every layer that
    shares the mask."""

    def make() -> list:
        pieces: list = [Band(mask, block)]
        if mask.has_global_tokens:
            pieces.append(GlobalColumns(mask, list(pieces)))
        for name in mask.pattern.pieces:
            if name not in PIECES:
                raise PatternError(f"pattern {mask.pattern.name} names the piece {name!r}; pieces: {', '.join(PIECES)}")
            pieces.append(PIECES[name](mask, list(pieces)))
        return pieces

    return mask.shared(("sparse", block), make)


def sparse_attention(
    query, key, value, rel_key, r_w_bias, r_r_bias, mask: PatternMask, block, dropatt, training, softcap=0.0
):
    """Attention of a sparse pattern from its pieces (see the module docstring); exact, the kernel contract's
    arguments plus the query ``block`` of the band.  Half precision runs in float32 (scores and softmax).  With a
    ``softcap`` the joined scores are capped before the one softmax."""
    if query.dtype not in (torch.float32, torch.float64):
        with torch.autocast(query.device.type, enabled=False):
            full = (t.float() for t in (query, key, value, rel_key, r_w_bias, r_r_bias))
            return sparse_attention(*full, mask, block, dropatt, training, softcap).to(value.dtype)
    scale = 1.0 / math.sqrt(query.size(-1))
    q_content = (query + r_w_bias[:, None]) * scale  # (B, H, T, D)
    q_position = (query + r_r_bias[:, None]) * scale
    pieces = sparse_pieces(mask, block)
    scores = torch.cat([p.scores(q_content, q_position, key, rel_key) for p in pieces], dim=-1)  # (B, H, T, N)
    scores = masked_softcap(scores, softcap)  # the forbidden pairs stay -inf
    probs = F.dropout(torch.softmax(scores, dim=-1), p=dropatt, training=training)
    out = None
    for piece, share in zip(pieces, probs.split([p.width for p in pieces], dim=-1)):
        part = piece.output(share, value)  # (B, H, T, D)
        out = part if out is None else out + part
    if mask.has_global_tokens:
        _global_rows_(out, q_content, q_position, key, value, rel_key, mask, dropatt, training, softcap)
    return out


def _global_rows_(out, q_content, q_position, key, value, rel_key, mask: PatternMask, dropatt, training, cap) -> None:
    """Overwrite, in ``out`` (B, H, T, D), the rows of global tokens with their attention over every key they may
    see: each run of consecutive global queries of a batch row is one block of the rel-shift kernel."""
    qlen = q_content.size(2)
    flags = [[False] * qlen for _ in mask.global_positions]  # (B, T) on the host: which queries are global
    for b, positions in enumerate(mask.global_positions):
        for p in positions:
            if p >= mask.mlen:
                flags[b][p - mask.mlen] = True
    for b, row in enumerate(flags):
        i = 0
        while i < qlen:
            if not row[i]:
                i += 1
                continue
            i0 = i
            while i < qlen and row[i]:
                i += 1
            lo, hi = mask.key_range(i0, i)
            forbidden = mask.forbidden(i0, i, lo, hi)
            forbidden = forbidden[b : b + 1] if forbidden.size(0) > 1 else forbidden  # (1, H|1, n, hi - lo)
            first = qlen - i + lo
            table = rel_key[:, first : first + (hi - lo) + (i - i0)]
            queries = (x[b : b + 1, :, i0:i] for x in (q_content, q_position))
            probs = relative_probs(next(queries), key[b : b + 1, :, lo:hi], next(queries), table, forbidden, cap=cap)
            probs = F.dropout(probs, p=dropatt, training=training)
            out[b : b + 1, :, i0:i] = torch.matmul(probs, value[b : b + 1, :, lo:hi])
