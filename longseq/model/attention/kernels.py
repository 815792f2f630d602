"""Fast attention kernels, chosen by name from :data:`ATTENTION_KERNELS`, beside the readable reference.

``rel_shift`` (:func:`~longseq.model.attention.shift.rel_shift_attention`, beside the pieces it is made of) computes
one (T, R) matrix for the position term and shifts it with a strided view (the training path; without gradients it
runs inside PyTorch's fused SDPA).  :func:`blocked_attention` cuts a problem into
blocks of queries, each with only the keys its pattern can reach, and :func:`banded_attention` runs every block
of a local pattern in one batched matmul: what makes local patterns linear in length.  ``content_attention`` is
the vanilla Transformer's (no relative term).

Kernel contract: a kernel gets queries (B, H, T, D), keys and values (B, H, K, D), a relative table
``rel_key`` (H, R, D) whose row ``T - i + j`` holds W_R R for the distance of pair (i, j) (R >= K + 1;
rows past the end are only read for forbidden pairs), u, v, a bool mask broadcastable to (B, H, T, K), True
where forbidden, the attention dropout and the training flag, and ``first_forbidden``: a key column before which
no pair is forbidden (0: no such bound), which a kernel may use to mask less; and the keyword ``softcap``: c > 0
caps every score at c tanh(score / c) before the mask (a kernel without a hook on the scores, listed in
:data:`UNCAPPED_KERNELS`, refuses it).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from longseq.model.attention.flex import flex_available, flex_relative_attention
from longseq.model.attention.patterns import PatternMask
from longseq.model.attention.reference import (
    dense_mask,
    distance_bias,
    reference_attention,
    reference_content_attention,
)
from longseq.model.attention.shift import key_bands, rel_shift_attention, relative_probs
from longseq.model.attention.shift import rel_shift as rel_shift  # re-exported: part of the kernels' interface
from longseq.model.attention.sparse import sparse_attention
from longseq.model.block import dropout
from longseq.model.block import softcap as capped

AttentionKernel = Callable[..., Tensor]


@torch.no_grad()
def key_mass(query, key, rel_key, r_w_bias, r_r_bias, mask, softcap: float = 0.0) -> Tensor:
    """Attention mass each key receives, summed over heads and queries: (B, K).  For memory pruning."""
    scale = 1.0 / math.sqrt(query.size(-1))
    scores = torch.matmul((query + r_w_bias[:, None]) * scale, key.transpose(-1, -2))  # (B, H, T, K)
    position = torch.matmul((query + r_r_bias[:, None]) * scale, rel_key.transpose(-1, -2))
    scores += rel_shift(position, query.size(2), key.size(2))
    scores = capped(scores, softcap)
    scores.masked_fill_(mask, float("-inf"))
    return torch.softmax(scores, dim=-1).sum(dim=(1, 2))


def banded_attention(
    query, key, value, rel_key, r_w_bias, r_r_bias, mask: PatternMask, block, band, dropatt, training, softcap=0.0
):
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

    forbidden = mask.banded(n_blocks, block, before, width)  # (B or 1, H or 1, n, block, W)
    key_band, value_band = (key_bands(x, mlen, n_blocks, block, before, width) for x in (key, value))  # (B, H, n, W, D)
    probs = relative_probs(q_content, key_band, q_position, local_rel, forbidden, cap=softcap)  # (B, H, n, block, W)
    probs = dropout(probs, dropatt, training)
    out = torch.matmul(probs, value_band)  # (B, H, n, block, D)
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
    softcap: float = 0.0,
) -> Tensor:
    """Run ``kernel`` on blocks of ``chunk`` queries, each over the keys [lo, hi) its pattern can reach.

    Exact: every score a query is allowed is computed by the same operations, and the keys left out
    are forbidden.  A block is a smaller instance of the kernel contract: queries [q0, q1) sit at
    M' = M + q0 - lo over keys [lo, hi), and the relative table rows they need start at T - q1 + lo
    (row T - i + j of the whole problem is row T' - i' + j' of the block).  For a local pattern the
    key range is the block plus the pattern's reach, so time and saved activations grow linearly with T.
    Local patterns run every block at once (:func:`banded_attention`); sparse ones (strided, block_sparse, global
    tokens, random blocks) as pieces of the allowed pairs under one softmax (:func:`sparse_attention`).
    A dense ``mask`` tensor (T, K) or (B, 1|H, T, K) must be causal; blocks then skip only future keys.
    ``chunk`` = 0 means one block; ``softcap`` is passed on to every kernel and piece.
    """
    qlen, klen = query.size(2), key.size(2)
    step = chunk if 0 < chunk < qlen else qlen
    if kernel is rel_shift_attention and isinstance(mask, PatternMask) and step < qlen:
        band = mask.band(step)
        if band is None and mask.pattern.local_reach is not None and not mask.sinks:  # a sparse pattern's pieces
            return sparse_attention(
                query, key, value, rel_key, r_w_bias, r_r_bias, mask, step, dropatt, training, softcap
            )
        if band is not None and query.dtype in (torch.float32, torch.float64):
            out = banded_attention(
                query, key, value, rel_key, r_w_bias, r_r_bias, mask, step, band, dropatt, training, softcap
            )
            if out is not None:
                return out
    if kernel is rel_shift_attention and step < qlen:  # slices of contiguous keys and values reach the matmuls as
        key, value = key.contiguous(), value.contiguous()  # views; of the projection's (B, L, H, D) layout, a copy each
    blocks = [_block(mask, q0, min(qlen, q0 + step), step < qlen, qlen, klen) for q0 in range(0, qlen, step)]
    queries = torch.split(query, step, dim=2)
    keys, values = (Ranges.apply(x, 2, [(b.lo, b.hi) for b in blocks]) for x in (key, value))
    tables = [None] * len(blocks)
    if rel_key is not None:
        tables = Ranges.apply(rel_key, 1, [(b.first_row, b.first_row + b.hi - b.lo + b.q1 - b.q0) for b in blocks])
    outs = [
        kernel(q, k, v, table, r_w_bias, r_r_bias, b.mask, dropatt, training, first_forbidden=b.first, softcap=softcap)
        for b, q, k, v, table in zip(blocks, queries, keys, values, tables)
    ]
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)  # (B, H, T, D)


class Block(NamedTuple):
    """Queries [q0, q1) over keys [lo, hi): their forbidden pairs, a key column before which none is (0: none known),
    and the first row of the relative table they read."""

    q0: int
    q1: int
    lo: int
    hi: int
    mask: Tensor
    first: int
    first_row: int


def _block(mask: PatternMask | Tensor, q0: int, q1: int, several: bool, qlen: int, klen: int) -> Block:
    if isinstance(mask, Tensor):  # a dense mask: skip only the future
        lo, hi = 0, (klen - qlen + q1 if several else klen)
        return Block(q0, q1, lo, hi, mask[..., q0:q1, lo:hi], 0, qlen - q1 + lo)
    lo, hi = mask.key_range(q0, q1)
    return Block(q0, q1, lo, hi, mask.forbidden(q0, q1, lo, hi), mask.first_forbidden(q0, lo), qlen - q1 + lo)


class Ranges(torch.autograd.Function):
    """Views ``x[lo:hi]`` along ``dim`` for every (lo, hi) of ``ranges`` (cut at x's end, as slicing is), whose
    gradients add up in one buffer of x's size (a slice per block would give each block a zero gradient of x's size
    of its own, added up after)."""

    @staticmethod
    def forward(ctx, x: Tensor, dim: int, ranges: list[tuple[int, int]]):
        ranges = [(lo, min(hi, x.size(dim))) for lo, hi in ranges]
        ctx.dim, ctx.ranges, ctx.shape = dim, ranges, x.shape
        ctx.set_materialize_grads(False)
        return tuple(x.narrow(dim, lo, hi - lo) for lo, hi in ranges)

    @staticmethod
    def backward(ctx, *grads):
        present = [(lo, hi, g) for (lo, hi), g in zip(ctx.ranges, grads) if g is not None]
        if not present:
            return None, None, None
        grad = present[0][2].new_zeros(ctx.shape)
        for lo, hi, g in present:
            grad.narrow(ctx.dim, lo, hi - lo).add_(g)
        return grad, None, None


def sdpa_attention(
    query: Tensor,  # (B, H, T, D)
    key: Tensor,  # (B, H, K, D)
    value: Tensor,  # (B, H, K, D)
    bias: Tensor | None,  # (H, R): the bias of every distance row (alibi, t5), or None (rope, nope, absolute)
    r_w_bias: Tensor,  # unread: the content family has no u and v
    r_r_bias: Tensor,
    mask: PatternMask | Tensor,
    dropatt: float,
    training: bool,
    first_forbidden: int = 0,
    softcap: float = 0.0,  # always 0: kernel_for refuses SDPA for a layer that caps (no hook for the scores)
) -> Tensor:
    """The content family's kernel: softmax(q.k / sqrt(D) + bias) on PyTorch's ``scaled_dot_product_attention``,
    so FlashAttention or the memory-efficient kernel serves it on a GPU and the fused kernel on a CPU.  Keys and
    values may have fewer heads than the queries (grouped-query attention): SDPA shares them (``enable_gqa``;
    before PyTorch 2.5 they are repeated here).  The plain
    causal mask without a bias is a lower-right causal mask (``causal_lower_right``: query i of T over K keys sees
    keys up to K - T + i), which those kernels take without a (T, K) tensor (on a CPU, where PyTorch makes it a
    dense mask, that mask is made here: ``torch.nn.attention.bias`` imports dynamo, 0.7 s on a first call; one
    query sees every key, no mask); anything else is one additive
    (T, K) mask, -inf where forbidden.  It cannot cap the scores (``softcap``): a layer that caps them is given
    another kernel when it is built (:func:`kernel_for`, :data:`UNCAPPED_KERNELS`)."""
    qlen, klen = query.size(2), key.size(2)
    dropout = dropatt if training else 0.0
    sdpa = F.scaled_dot_product_attention
    if key.size(1) != query.size(1):  # grouped-query attention
        if SDPA_GROUPS:
            sdpa = partial(F.scaled_dot_product_attention, enable_gqa=True)
        else:
            group = query.size(1) // key.size(1)
            key, value = key.repeat_interleave(group, dim=1), value.repeat_interleave(group, dim=1)
    plain = isinstance(mask, PatternMask) and mask.is_causal_full and mask.span is None and mask.mlen == klen - qlen
    if bias is None and plain:
        if qlen == klen:
            return sdpa(query, key, value, dropout_p=dropout, is_causal=True)
        if qlen == 1:  # one query after its keys (generation): it sees them all
            return sdpa(query, key, value, dropout_p=dropout)
        if query.device.type == "cpu":  # causal_lower_right would make this same dense mask, after importing dynamo
            allowed = torch.ones(qlen, klen, dtype=torch.bool, device=query.device).tril_(klen - qlen)
            return sdpa(query, key, value, attn_mask=allowed, dropout_p=dropout)
        from torch.nn.attention.bias import causal_lower_right

        lower_right = causal_lower_right(qlen, klen)
        return sdpa(query, key, value, attn_mask=lower_right, dropout_p=dropout)
    forbidden = dense_mask(mask)
    if bias is None:
        return sdpa(query, key, value, attn_mask=~forbidden, dropout_p=dropout)
    additive = distance_bias(bias, qlen, klen).to(query.dtype).masked_fill(forbidden, float("-inf"))
    return sdpa(query, key, value, attn_mask=additive, dropout_p=dropout)


ATTENTION_KERNELS: dict[str, AttentionKernel] = {  # the relative family: a (H, R, D) table of keys
    "reference": reference_attention,
    "rel_shift": rel_shift_attention,
    "flex": flex_relative_attention,
}
CONTENT_KERNELS: dict[str, AttentionKernel] = {  # the content family: q.k plus an optional (H, R) bias
    "reference": reference_content_attention,
    "sdpa": sdpa_attention,
    "rel_shift": sdpa_attention,  # the name of each family's fast eager path (run configs of absolute positions)
}
KERNEL_NAMES = ("auto", *dict.fromkeys([*ATTENTION_KERNELS, *CONTENT_KERNELS]))  # what attn_impl may name


UNCAPPED_KERNELS = (sdpa_attention,)  # kernels that never see the scores: no attn_softcap
GROUPED_KERNELS = (sdpa_attention,)  # kernels that take n_kv_head key/value heads and share them themselves
SDPA_GROUPS = torch.__version__ >= (2, 5)  # scaled_dot_product_attention(enable_gqa=True)


def kernel_for(name: str, family: str, softcap: bool = False) -> AttentionKernel:
    """The kernel ``attn_impl`` names for an encoding of ``family`` (``relative`` or ``content``), or a
    ``ValueError`` saying which names that family has, or that the kernel cannot cap the scores (``softcap``)."""
    kernels = ATTENTION_KERNELS if family == "relative" else CONTENT_KERNELS
    if name not in kernels:
        raise ValueError(
            f"attn_impl={name} does not run the {family} position family; it has {', '.join(['auto', *kernels])}"
        )
    if softcap and kernels[name] in UNCAPPED_KERNELS:
        capped_names = [n for n, k in kernels.items() if k not in UNCAPPED_KERNELS]
        raise ValueError(
            f"attn_impl={name} runs {kernels[name].__name__}, which has no hook for the scores, so it cannot apply "
            f"attn_softcap; the {family} family caps them with {', '.join(['auto', *capped_names])}"
        )
    return kernels[name]


def resolve_kernel(
    name: str, device_type: str, pattern, dropout: bool, family: str = "relative", softcap: bool = False
) -> str:
    """The kernel ``attn_impl`` names for a layer of ``pattern`` (an AttentionPattern; None: full) on a device, when
    it is built or moved: for the content family ``auto`` is ``sdpa``, or ``reference`` when the layer caps its
    scores (``softcap``: SDPA has no hook for them); for the relative family it is ``flex`` on
    CUDA for patterns without sparse pieces (full attention, window, dilated) when this PyTorch has FlexAttention and
    the layer has no attention dropout (``dropout``), and ``rel_shift`` otherwise.  Why not Flex for the sparse
    patterns: its block mask visits every 128 x 128 block that holds one allowed pair (stride columns and block
    summaries reach every block), and their relative term needs a (T, K) bias; the sparse pieces of ``rel_shift``
    cost what the pattern allows."""
    if name != "auto":
        return name
    if family == "content":
        return "reference" if softcap else "sdpa"
    local = pattern is None or not pattern.pieces  # full, or a band (global tokens: their rows run everywhere)
    if device_type == "cuda" and local and not dropout and flex_available():
        return "flex"
    return "rel_shift"
