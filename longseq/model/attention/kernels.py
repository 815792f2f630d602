"""Fast attention kernels, chosen by name from :data:`ATTENTION_KERNELS`, beside the readable reference.

``rel_shift`` computes one (T, R) matrix for the position term and shifts it with a strided view (the training
path; without gradients it runs inside PyTorch's fused SDPA).  :func:`blocked_attention` cuts a problem into
blocks of queries, each with only the keys its pattern can reach, and :func:`banded_attention` runs every block
of a local pattern in one batched matmul: what makes local patterns linear in length.  ``content_attention`` is
the vanilla Transformer's (no relative term).

Kernel contract: a kernel gets queries (B, H, T, D), keys and values (B, H, K, D), a relative table
``rel_key`` (H, R, D) whose row ``T - i + j`` holds W_R R for the distance of pair (i, j) (R >= K + 1;
rows past the end are only read for forbidden pairs), u, v and a bool mask broadcastable to
(B, H, T, K), True where forbidden.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from longseq.config.model import KERNELS
from longseq.model.attention.patterns import PatternMask
from longseq.model.attention.reference import dense_mask, reference_attention


def rel_shift(position_scores: Tensor, qlen: int, klen: int | None = None) -> Tensor:
    """Turn (B, H, T, R) scores indexed by relative row into (B, H, T, K) scores indexed by key.

    Row r of R is distance K - r (causal: R = K + 1 rows, distances K .. 0; bidirectional: R = K + T rows,
    down to -(T - 1)), and key j of query i is distance M + i - j, so out[..., i, j] = in[..., i, T - i + j].
    That is a strided view (offset T, row stride R - 1): no padding, no copy.  Entries past the last row
    (future keys of a causal table) read neighbouring rows and must be masked.  ``klen`` defaults to R - 1.
    """
    *lead, rows, n_rel = position_scores.shape
    klen = n_rel - 1 if klen is None else klen
    position_scores = position_scores.contiguous()
    *s_lead, s_t, _ = position_scores.stride()
    return position_scores.as_strided(
        (*lead, rows, klen), (*s_lead, s_t - 1, 1), position_scores.storage_offset() + qlen
    )


def fill_forbidden_(scores: Tensor, mask: Tensor) -> Tensor:
    """``scores.masked_fill_(mask, -inf)``, touching only the key columns from the first forbidden one on: with
    memory and causal attention no memory column is forbidden, and broadcasting a (T, K) mask over every head
    costs more than the softmax."""
    columns = mask.reshape(-1, mask.size(-1)).any(0)  # (K,) True where some query may not look
    hits = columns.nonzero()
    if hits.numel():
        first = int(hits[0])
        scores[..., first:].masked_fill_(mask[..., first:], float("-inf"))
    return scores


class _RelativeProbs(torch.autograd.Function):
    """probs = softmax(mask(q_c k^T + rel_shift(q_p R^T))) with a hand-written backward.

    The forward accumulates and masks the scores in place and saves only the probabilities.  The
    backward needs no mask: the softmax gradient is already zero wherever a probability is zero.
    The position gradient goes back through the same strided view into a (T, R) buffer.  Any leading
    dimensions work (the banded kernel adds one for blocks; its ``rel_key`` is then (H, 1, R, D)).
    """

    @staticmethod
    def forward(ctx, q_content, key, q_position, rel_key, mask):
        scores = torch.matmul(q_content, key.transpose(-1, -2))  # (B, H, T, K)
        scores += rel_shift(
            torch.matmul(q_position, rel_key.transpose(-1, -2)), q_content.size(-2), key.size(-2)
        )  # (B, H, T, R) shifted
        fill_forbidden_(scores, mask)
        probs = torch.softmax(scores, dim=-1)
        ctx.save_for_backward(q_content, key, q_position, rel_key, probs)
        return probs

    @staticmethod
    def backward(ctx, grad_probs):
        q_content, key, q_position, rel_key, probs = ctx.saved_tensors
        grad_scores = torch._softmax_backward_data(grad_probs, probs, -1, probs.dtype)  # (B, H, T, K)
        *lead, qlen, klen = grad_scores.shape
        grad_position = grad_scores.new_zeros(*lead, qlen, rel_key.size(-2))  # (B, H, T, R)
        rel_shift(grad_position, qlen, klen).copy_(grad_scores)
        grad_qc = grad_key = grad_qp = grad_rel = None
        if ctx.needs_input_grad[0]:
            grad_qc = torch.matmul(grad_scores, key)
        if ctx.needs_input_grad[1]:
            grad_key = torch.matmul(grad_scores.transpose(-1, -2), q_content)
        if ctx.needs_input_grad[2]:
            grad_qp = torch.matmul(grad_position, rel_key)
        if ctx.needs_input_grad[3]:
            grad_rel = torch.matmul(grad_position.transpose(-1, -2), q_position).sum_to_size(rel_key.shape)
        return grad_qc, grad_key, grad_qp, grad_rel, None


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
) -> Tensor:
    """Fast path: one matmul per term, the position term shifted by a strided view, fused softmax backward.
    Without gradients (evaluation, generation) the shifted position term becomes an additive bias of PyTorch's
    fused ``scaled_dot_product_attention``, which never writes the probabilities out."""
    scale = 1.0 / math.sqrt(query.size(-1))
    q_position = (query + r_r_bias[:, None]) * scale
    full_precision = query.dtype in (torch.float32, torch.float64)
    needs_grad = any(t.requires_grad for t in (query, key, value, rel_key, r_w_bias, r_r_bias))
    inference = not (torch.is_grad_enabled() and needs_grad)
    if full_precision and inference and not (training and dropatt > 0):
        position = torch.matmul(q_position, rel_key.transpose(-1, -2))  # (B, H, T, R)
        bias = rel_shift(position, query.size(2), key.size(2))  # (B, H, T, K): its rows do not overlap
        fill_forbidden_(bias, mask)  # in place, in the buffer of ``position``
        return F.scaled_dot_product_attention(query + r_w_bias[:, None], key, value, attn_mask=bias)
    q_content = (query + r_w_bias[:, None]) * scale  # (B, H, T, D)
    if full_precision:
        probs = _RelativeProbs.apply(q_content, key, q_position, rel_key, mask)
    else:  # half precision: logits and softmax in float32 (autograd tracks the steps), probabilities cast back
        with torch.autocast(query.device.type, enabled=False):
            content = torch.matmul(q_content.float(), key.float().transpose(-1, -2))
            position = torch.matmul(q_position.float(), rel_key.float().transpose(-1, -2))
            scores = content + rel_shift(position, query.size(2), key.size(2))
            probs = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1).to(value.dtype)
    probs = F.dropout(probs, p=dropatt, training=training)
    return torch.matmul(probs, value)  # (B, H, T, D)


AttentionKernel = Callable[..., Tensor]


@torch.no_grad()
def key_mass(query, key, rel_key, r_w_bias, r_r_bias, mask) -> Tensor:
    """Attention mass each key receives, summed over heads and queries: (B, K).  For memory pruning."""
    scale = 1.0 / math.sqrt(query.size(-1))
    scores = torch.matmul((query + r_w_bias[:, None]) * scale, key.transpose(-1, -2))  # (B, H, T, K)
    position = torch.matmul((query + r_r_bias[:, None]) * scale, rel_key.transpose(-1, -2))
    scores += rel_shift(position, query.size(2), key.size(2))
    scores.masked_fill_(mask, float("-inf"))
    return torch.softmax(scores, dim=-1).sum(dim=(1, 2))


def _key_window(states: Tensor, start: int, stop: int) -> Tensor:
    """Positions [start, stop) of (B, H, K, D) states, zeros outside [0, K)."""
    klen = states.size(2)
    inner = states[:, :, max(start, 0) : min(stop, klen)]
    return F.pad(inner, (0, 0, max(0, -start), max(0, stop - max(klen, start))))


def banded_attention(query, key, value, rel_key, r_w_bias, r_r_bias, mask: PatternMask, block, band, dropatt, training):
    """A local pattern with every block of queries at once: block b's keys are a fixed-width band
    [M + b * block - before, M + (b + 1) * block + after), gathered from ``block``-long slices of the padded
    keys, so one batched matmul serves all blocks and the gradients of the overlapping bands add up through
    plain slicing.  Every band has the same relative distances, so all blocks share one (W + 1)-row table.

    Returns None when the relative table is too short for the band (short sequences): the caller then
    visits the blocks one by one.  Shapes: bands (B, H, n, W, D) for n blocks of width W.
    """
    before, after = band
    batch, heads, qlen, d_head = query.shape
    klen = key.size(2)
    mlen = klen - qlen
    n_blocks = -(-qlen // block)
    width = before + block + after  # W, a multiple of block
    top = klen - (before + block)  # the table row of distance before + block
    if top < 0 or top + width + 1 > rel_key.size(1):
        return None
    local_rel = rel_key[:, top : top + width + 1, None].transpose(1, 2)  # (H, 1, W + 1, D)
    scale = 1.0 / math.sqrt(d_head)
    pad = n_blocks * block - qlen
    q_content = F.pad((query + r_w_bias[:, None]) * scale, (0, 0, 0, pad)).view(batch, heads, n_blocks, block, d_head)
    q_position = F.pad((query + r_r_bias[:, None]) * scale, (0, 0, 0, pad)).view(batch, heads, n_blocks, block, d_head)

    def bands(states: Tensor) -> Tensor:  # (B, H, K, D) -> (B, H, n, W, D)
        padded = _key_window(states, mlen - before, mlen + n_blocks * block + after)
        parts = [padded[:, :, t * block : (t + n_blocks) * block] for t in range(width // block)]
        return torch.stack([p.reshape(batch, heads, n_blocks, block, d_head) for p in parts], dim=3).flatten(3, 4)

    forbidden = mask.banded(n_blocks, block, before, width)  # (B or 1, H or 1, n, block, W)
    probs = _RelativeProbs.apply(q_content, bands(key), q_position, local_rel, forbidden)  # (B, H, n, block, W)
    probs = F.dropout(probs, p=dropatt, training=training)
    out = torch.matmul(probs, bands(value))  # (B, H, n, block, D)
    return out.view(batch, heads, n_blocks * block, d_head)[:, :, :qlen]


def blocked_attention(
    kernel: AttentionKernel,
    chunk: int,
    query: Tensor,  # (B, H, T, D)
    key: Tensor,  # (B, H, K, D)
    value: Tensor,  # (B, H, K, D)
    rel_key: Tensor,  # (H, R, D)
    r_w_bias: Tensor,
    r_r_bias: Tensor,
    mask: PatternMask | Tensor,
    dropatt: float,
    training: bool,
) -> Tensor:
    """Run ``kernel`` on blocks of ``chunk`` queries, each over the keys [lo, hi) its pattern can reach.

    Exact: every score a query is allowed is computed by the same operations, and the keys left out
    are forbidden.  A block is a smaller instance of the kernel contract: queries [q0, q1) sit at
    M' = M + q0 - lo over keys [lo, hi), and the relative table rows they need start at T - q1 + lo
    (row T - i + j of the whole problem is row T' - i' + j' of the block).  For a local pattern the
    key range is the block plus the pattern's reach, so time and saved activations grow linearly with T.
    A dense ``mask`` tensor (T, K) or (B, 1|H, T, K) must be causal; blocks then skip only future keys.
    ``chunk`` = 0 means one block.
    """
    qlen, klen = query.size(2), key.size(2)
    step = chunk if 0 < chunk < qlen else qlen
    fused = kernel is rel_shift_attention and query.dtype in (torch.float32, torch.float64)
    if fused and isinstance(mask, PatternMask) and step < qlen and (band := mask.band(step)) is not None:
        out = banded_attention(query, key, value, rel_key, r_w_bias, r_r_bias, mask, step, band, dropatt, training)
        if out is not None:
            return out
    outs = []
    for q0 in range(0, qlen, step):
        q1 = min(qlen, q0 + step)
        if isinstance(mask, Tensor):
            lo, hi = 0, (klen - qlen + q1 if step < qlen else klen)  # a dense mask: skip only the future
            block_mask = mask[..., q0:q1, lo:hi]
        else:
            lo, hi = mask.key_range(q0, q1)
            block_mask = mask.forbidden(q0, q1, lo, hi)
        first_row = qlen - q1 + lo
        outs.append(
            kernel(
                query[:, :, q0:q1],
                key[:, :, lo:hi],
                value[:, :, lo:hi],
                rel_key[:, first_row : first_row + (hi - lo) + (q1 - q0)],
                r_w_bias,
                r_r_bias,
                block_mask,
                dropatt,
                training,
            )
        )
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)  # (B, H, T, D)


def content_attention(query, key, value, mask: PatternMask | Tensor, dropatt: float, training: bool, kernel: str):
    """Content-only attention (the vanilla Transformer, absolute positions): PyTorch's fused SDPA, causal by flag
    when the mask is the plain causal one; ``kernel="reference"`` runs the readable reference instead."""
    if kernel == "reference":
        zeros = query.new_zeros(query.size(1), query.size(-1))  # no u: (H, D)
        return reference_attention(query, key, value, None, zeros, zeros, dense_mask(mask), dropatt, training)
    causal = isinstance(mask, PatternMask) and mask.is_causal_full and mask.mlen == 0 and mask.span is None
    return F.scaled_dot_product_attention(
        query, key, value, attn_mask=None if causal else ~dense_mask(mask),
        dropout_p=dropatt if training else 0.0, is_causal=causal,
    )  # fmt: skip


ATTENTION_KERNELS: dict[str, AttentionKernel] = {
    "reference": reference_attention,
    "rel_shift": rel_shift_attention,
}
assert tuple(ATTENTION_KERNELS) == KERNELS, "the registry must implement every kernel name the config accepts"
