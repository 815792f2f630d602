"""The ``rel_shift`` kernel (:func:`rel_shift_attention`, the default relative kernel) and the building blocks every
relative-attention kernel shares: the rel-shift view, in-place masking, the fused probabilities and scores of the two
relative terms, bands of keys and rows of the relative table.

See :mod:`longseq.model.attention` for the dimension glossary and the kernel contract (row ``T - i + j`` of the
relative table holds W_R R for the distance of pair (i, j)).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from longseq.model.attention.reference import dense_mask
from longseq.model.block import dropout, masked_softcap
from longseq.model.block import softcap as capped


def rel_shift(position_scores: Tensor, qlen: int, klen: int | None = None) -> Tensor:
    """Turn (B, H, T, R) scores indexed by relative row into (B, H, T, K) scores indexed by key.

    Row r of R is distance K - r (causal: R = K + 1 rows, distances K .. 0; bidirectional: R = K + T rows,
    down to -(T - 1)), and key j of query i is distance M + i - j, so out[..., i, j] = in[..., i, T - i + j].
    That is a strided view (offset T, row stride R - 1): no padding, no copy.  Entries past the last row
    (future keys of a causal table) read neighbouring rows and must be masked.  ``klen`` defaults to R - 1.

    Built from view operations only: flatten each (T, R) matrix, skip T entries, read the rest as (T, R - 1) and
    keep its first K columns.  So ``torch.compile`` traces it with symbolic lengths, and writing into it (the
    backward) writes the matrix.
    """
    *lead, rows, n_rel = position_scores.shape
    klen = n_rel - 1 if klen is None else klen
    if rows == 1:  # one query (generation): row 0 starts one entry in, as the flattened view below reads it
        return position_scores.narrow(-1, 1, klen)
    flat = position_scores.contiguous().flatten(-2)  # (..., T * R)
    return flat.narrow(-1, qlen, rows * (n_rel - 1)).unflatten(-1, (rows, n_rel - 1))[..., :klen]  # (..., T, K)


def fill_forbidden_(scores: Tensor, mask: Tensor, first: int = 0) -> Tensor:
    """``scores.masked_fill_(mask, -inf)``, touching only the key columns from ``first`` on, when the caller knows
    that no pair before that column is forbidden (:meth:`~longseq.model.attention.patterns.PatternMask.
    first_forbidden`: with memory and causal attention no memory column is, and broadcasting a (T, K) mask over
    every head costs more than the softmax).  ``first`` is host arithmetic: nothing is read from the mask."""
    scores[..., first:].masked_fill_(mask[..., first:], float("-inf"))
    return scores


def _heads_first(q_position: Tensor, rel_key: Tensor) -> bool:
    """Whether the table varies over heads only, as (H, [1, ...,] R, D) against (B, H, ..., T, D) queries: then the
    position term is one product per head over all the query rows (:func:`position_scores`)."""
    return (
        rel_key.dim() == q_position.dim() - 1
        and rel_key.size(0) == q_position.size(1)
        and all(size == 1 for size in rel_key.shape[1:-2])
    )


def _query_rows(q_position: Tensor) -> Tensor:
    """(B, H, ..., T, D) queries as (H, N, D), every head's rows together (a copy of the queries)."""
    return q_position.movedim(1, 0).reshape(q_position.size(1), -1, q_position.size(-1))


def position_scores(q_position: Tensor, rel_key: Tensor, klen: int) -> Tensor:
    """rel_shift(q_p R^T): the position term (..., T, K) of queries (..., T, D) over ``klen`` keys.

    With a table that varies over heads only (H, R, D) (or (H, 1, ..., R, D)), each head's rows of every batch row
    and block are one (N, D) x (D, R) product into an (H, ..., T, R) buffer, which the returned view reads with the
    heads moved back to dimension 1.  A broadcast matmul would copy the table once per batch row and block, and sum
    its gradient back over them.  Other shapes broadcast."""
    qlen = q_position.size(-2)
    if not _heads_first(q_position, rel_key):
        return rel_shift(torch.matmul(q_position, rel_key.transpose(-1, -2)), qlen, klen)
    heads, n_rel, d_head = rel_key.size(0), rel_key.size(-2), rel_key.size(-1)
    table = rel_key.reshape(heads, n_rel, d_head)
    lead = (q_position.size(0), *q_position.shape[2:-1])  # (B, ..., T)
    position = torch.bmm(_query_rows(q_position), table.transpose(1, 2)).view(heads, *lead, n_rel)
    return rel_shift(position, qlen, klen).movedim(0, 1)  # (B, H, ..., T, K)


def _position_backward(grad_scores: Tensor, q_position: Tensor, rel_key: Tensor, needs_qp: bool, needs_rel: bool):
    """Gradients of rel_shift(q_p R^T) for (..., T, K) ``grad_scores``, back through the same strided view."""
    *lead, qlen, klen = grad_scores.shape
    if _heads_first(q_position, rel_key) and grad_scores.shape[:-1] == q_position.shape[:-1]:
        return _heads_first_backward(grad_scores, q_position, rel_key, needs_qp, needs_rel)
    grad_position = grad_scores.new_zeros(*lead, qlen, rel_key.size(-2))  # (..., T, R)
    rel_shift(grad_position, qlen, klen).copy_(grad_scores)
    grad_qp = torch.matmul(grad_position, rel_key).sum_to_size(q_position.shape) if needs_qp else None
    grad_rel = None
    if needs_rel:
        grad_rel = torch.matmul(grad_position.transpose(-1, -2), q_position).sum_to_size(rel_key.shape)
    return grad_qp, grad_rel


def _heads_first_backward(grad_scores: Tensor, q_position: Tensor, rel_key: Tensor, needs_qp: bool, needs_rel: bool):
    """:func:`_position_backward` for the layout of :func:`position_scores`: the gradient written into an
    (H, B, ..., T, R) buffer, then one product per head for each operand (no sum over the batch)."""
    qlen, klen = grad_scores.shape[-2:]
    heads, n_rel, d_head = rel_key.size(0), rel_key.size(-2), rel_key.size(-1)
    grad_position = grad_scores.new_zeros(heads, *grad_scores.shape[:1], *grad_scores.shape[2:-1], n_rel)
    rel_shift(grad_position, qlen, klen).copy_(grad_scores.movedim(1, 0))
    flat = grad_position.view(heads, -1, n_rel)  # (H, N, R)
    grad_qp = grad_rel = None
    if needs_qp:
        table = rel_key.reshape(heads, n_rel, d_head)
        grad_qp = torch.bmm(flat, table).view(heads, *grad_position.shape[1:-1], d_head).movedim(0, 1)
    if needs_rel:
        grad_rel = torch.bmm(flat.transpose(1, 2), _query_rows(q_position)).view(rel_key.shape)
    return grad_qp, grad_rel


def _relative_backward(ctx, grad_scores: Tensor, q_content, key, q_position, rel_key):
    """Gradients of q_c k^T + rel_shift(q_p R^T) for (..., T, K) ``grad_scores``; inputs may broadcast.  The saved
    tensors come as arguments: ``ctx.saved_tensors`` may be unpacked only once (activation checkpointing)."""
    grad_qc = grad_key = None
    if ctx.needs_input_grad[0]:
        grad_qc = torch.matmul(grad_scores, key).sum_to_size(q_content.shape)
    if ctx.needs_input_grad[1]:
        grad_key = torch.matmul(grad_scores.transpose(-1, -2), q_content).sum_to_size(key.shape)
    needs = ctx.needs_input_grad
    return (grad_qc, grad_key, *_position_backward(grad_scores, q_position, rel_key, needs[2], needs[3]))


def _relative_scores(q_content: Tensor, key: Tensor, q_position: Tensor, rel_key: Tensor) -> Tensor:
    scores = torch.matmul(q_content, key.transpose(-1, -2))  # (..., T, K)
    scores += position_scores(q_position, rel_key, key.size(-2))
    return scores


class RelativeProbs(torch.autograd.Function):
    """probs = softmax(mask(q_c k^T + rel_shift(q_p R^T))) with a hand-written backward.

    The forward accumulates and masks the scores in place and saves only the probabilities.  The
    backward needs no mask: the softmax gradient is already zero wherever a probability is zero.
    The position gradient goes back through the same strided view into a (T, R) buffer.  Any leading
    dimensions work (the banded kernel adds one for blocks; its ``rel_key`` is then (H, 1, R, D)).
    """

    @staticmethod
    def forward(ctx, q_content, key, q_position, rel_key, mask, first_forbidden=0):
        scores = _relative_scores(q_content, key, q_position, rel_key)  # (B, H, T, K)
        fill_forbidden_(scores, mask, first_forbidden)
        probs = torch.softmax(scores, dim=-1)
        ctx.save_for_backward(q_content, key, q_position, rel_key, probs)
        return probs

    @staticmethod
    def backward(ctx, grad_probs):
        *inputs, probs = ctx.saved_tensors
        grad_scores = torch._softmax_backward_data(grad_probs, probs, -1, probs.dtype)  # (B, H, T, K)
        return (*_relative_backward(ctx, grad_scores, *inputs), None, None)


def relative_probs(q_content, key, q_position, rel_key, mask, first_forbidden: int = 0, cap: float = 0.0) -> Tensor:
    """:class:`RelativeProbs`, or with a ``cap`` > 0 the scores of :class:`RelativeScores` capped at
    cap * tanh(score / cap) before one softmax (autograd keeps the capped scores for the backward: one more (T, K)
    buffer than the uncapped path)."""
    if not cap:
        return RelativeProbs.apply(q_content, key, q_position, rel_key, mask, first_forbidden)
    scores = RelativeScores.apply(q_content, key, q_position, rel_key, mask)  # -inf where forbidden
    return torch.softmax(masked_softcap(scores, cap), dim=-1)


class RelativeScores(torch.autograd.Function):
    """scores = mask(q_c k^T + rel_shift(q_p R^T)), -inf where forbidden, before any softmax: for kernels that
    join several pieces of a query's keys under one softmax.  Saves only the inputs; any leading dimensions,
    broadcast between the operands (the gradients are summed back to each operand's shape)."""

    @staticmethod
    def forward(ctx, q_content, key, q_position, rel_key, mask):
        scores = _relative_scores(q_content, key, q_position, rel_key)  # (..., T, K)
        scores.masked_fill_(mask, float("-inf"))
        ctx.save_for_backward(q_content, key, q_position, rel_key)
        return scores

    @staticmethod
    def backward(ctx, grad_scores):
        return (*_relative_backward(ctx, grad_scores, *ctx.saved_tensors), None)


def rel_shift_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    rel_key: Tensor,
    r_w_bias: Tensor,
    r_r_bias: Tensor,
    mask: Tensor,
    dropatt: float,
    training: bool,
    first_forbidden: int = 0,
    softcap: float = 0.0,
) -> Tensor:
    """Fast path: one matmul per term, the position term shifted by a strided view, fused softmax backward.
    Without gradients (evaluation, generation) the shifted position term becomes an additive bias of PyTorch's
    fused ``scaled_dot_product_attention``, which never writes the probabilities out (not with a ``softcap``: the
    capped scores are written out).  ``mask`` may be a :class:`~longseq.model.attention.patterns.PatternMask` (the
    whole problem in one block): it is made dense here."""
    if not isinstance(mask, Tensor):  # a PatternMask: made dense below, where a key is forbidden
        first_forbidden = mask.first_forbidden(0, 0)
    scale = 1.0 / math.sqrt(query.size(-1))
    q_position = (query + r_r_bias[:, None]) * scale
    full_precision = query.dtype in (torch.float32, torch.float64)
    needs_grad = any(t.requires_grad for t in (query, key, value, rel_key, r_w_bias, r_r_bias))
    inference = not (torch.is_grad_enabled() and needs_grad)
    if full_precision and inference and not (training and dropatt > 0) and not softcap:
        position = torch.matmul(q_position, rel_key.transpose(-1, -2))  # (B, H, T, R)
        bias = rel_shift(position, query.size(2), key.size(2))  # (B, H, T, K): its rows do not overlap
        if first_forbidden < key.size(2):  # else no key is (generation's one query): no mask is made
            fill_forbidden_(bias, dense_mask(mask), first_forbidden)  # in place, in the buffer of ``position``
        return F.scaled_dot_product_attention(query + r_w_bias[:, None], key, value, attn_mask=bias)
    mask = dense_mask(mask)
    q_content = (query + r_w_bias[:, None]) * scale  # (B, H, T, D)
    if full_precision:  # fused scores and softmax (capped: through the scores, relative_probs)
        fused = (q_content, key, q_position, rel_key, mask, first_forbidden)
        probs = relative_probs(*fused, softcap) if softcap else RelativeProbs.apply(*fused)
    else:  # half precision: logits and softmax in float32 (autograd tracks the steps), probabilities cast back
        with torch.autocast(query.device.type, enabled=False):
            content = torch.matmul(q_content.float(), key.float().transpose(-1, -2))
            position = torch.matmul(q_position.float(), rel_key.float().transpose(-1, -2))
            scores = capped(content + rel_shift(position, query.size(2), key.size(2)), softcap)
            probs = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1).to(value.dtype)
    probs = dropout(probs, dropatt, training)
    return torch.matmul(probs, value)  # (B, H, T, D)


class PositionScores(torch.autograd.Function):
    """scores = mask(rel_shift(q_p R^T)) over ``klen`` keys, -inf where forbidden: the position term alone, for a
    piece whose content term is a plain matmul in another layout.  Inputs may broadcast."""

    @staticmethod
    def forward(ctx, q_position, rel_key, mask, klen):
        scores = position_scores(q_position, rel_key, klen).masked_fill_(mask, float("-inf"))  # (..., T, K)
        ctx.save_for_backward(q_position, rel_key)
        return scores

    @staticmethod
    def backward(ctx, grad_scores):
        q_position, rel_key = ctx.saved_tensors
        needs = ctx.needs_input_grad
        return (*_position_backward(grad_scores, q_position, rel_key, needs[0], needs[1]), None, None)


def key_window(states: Tensor, start: int, stop: int) -> Tensor:
    """Positions [start, stop) of (B, H, K, D) states, zeros outside [0, K)."""
    klen = states.size(2)
    inner = states[:, :, max(start, 0) : min(stop, klen)]
    return F.pad(inner, (0, 0, max(0, -start), max(0, stop - max(klen, start))))


def key_bands(states: Tensor, mlen: int, n_blocks: int, block: int, before: int, width: int) -> Tensor:
    """Block b's band of keys [M + b * block - before, M + b * block - before + width) for every block at once:
    (B, H, K, D) -> (B, H, n, W, D), from ``block``-long slices of the padded keys (``width`` a multiple of
    ``block``), so the gradients of overlapping bands add up through plain slicing."""
    batch, heads, _, d_head = states.shape
    padded = key_window(states, mlen - before, mlen - before + (n_blocks - 1) * block + width)
    parts = [padded[:, :, t * block : (t + n_blocks) * block] for t in range(width // block)]
    return torch.stack([p.reshape(batch, heads, n_blocks, block, d_head) for p in parts], dim=3).flatten(3, 4)


def table_rows(rel_key: Tensor, rows: Tensor) -> Tensor:
    """Rows ``rows`` (any shape S) of the (H, R, D) relative table, as (H, *S, D).  Rows outside the table are
    only read for forbidden pairs (keys before the window, or later than a causal table reaches), so they are
    clamped to its ends.  ``index_select``: its backward adds the rows up with ``index_add_``, which is much faster
    on CPU than the accumulating ``index_put_`` of advanced indexing when rows repeat."""
    flat = rows.clamp(0, rel_key.size(1) - 1).flatten()
    return rel_key.index_select(1, flat).unflatten(1, rows.shape)


class DiagonalScores(torch.autograd.Function):
    """scores[b, h, i, g] = q[b, h, i] . rel_key[h, T - i + columns[b, g]]: the position term of a few key columns
    (global tokens) for every query, (B, H, T, G).  For one column j the rows T - i + j, i = 0 .. T-1, are one
    reversed slice of the table, so neither pass gathers a (B, H, T, G, D) tensor: each column is a product of two
    (H, T, D) slices, summed over D."""

    @staticmethod
    def forward(ctx, q_position: Tensor, rel_key: Tensor, columns: list[list[int]]) -> Tensor:
        qlen, n_rows = q_position.size(2), rel_key.size(1)
        flipped = F.pad(rel_key, (0, 0, 0, qlen)).flip(1)  # (H, R + T, D): row R - 1 - j + i is row T - i + j
        starts = [[n_rows - 1 - column for column in row] for row in columns]  # (B, G), host arithmetic
        out = q_position.new_empty(*q_position.shape[:3], len(columns[0]))  # (B, H, T, G)
        for b, row in enumerate(starts):
            for g, s in enumerate(row):
                out[b, :, :, g] = (q_position[b] * flipped[:, s : s + qlen]).sum(-1)
        ctx.save_for_backward(q_position, flipped)
        ctx.starts, ctx.n_rows = starts, n_rows
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        q_position, flipped = ctx.saved_tensors
        qlen = q_position.size(2)
        grad_q, grad_flipped = torch.zeros_like(q_position), torch.zeros_like(flipped)
        for b, row in enumerate(ctx.starts):
            for g, s in enumerate(row):
                weight = grad[b, :, :, g, None]  # (H, T, 1)
                grad_q[b] += weight * flipped[:, s : s + qlen]
                grad_flipped[:, s : s + qlen] += weight * q_position[b]
        return grad_q, grad_flipped.flip(1)[:, : ctx.n_rows], None
