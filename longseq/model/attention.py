"""Relative multi-head attention of Transformer-XL (Dai et al., 2019, section 3.3).

Dimension glossary (batch-first everywhere):

    B  batch (parallel streams)         T  query length (the current segment)
    M  memory length                    K  key length, M + T
    H  heads                            D  head dimension (d_head)
    E  model width (d_model)            R  relative positions, K + 1 (distances K .. 0)

For query i (absolute position M + i) and key j the score is

    A_ij = (q_i + u) . k_j  +  (q_i + v) . W_R R_{M+i-j}          (terms (a)+(c) and (b)+(d))

scaled by 1/sqrt(D).  Paper symbols map to parameters as u -> ``r_w_bias``,
v -> ``r_r_bias``, W_R -> ``r_net``; W_q, W_k, W_v are the three blocks of ``qkv_net``.

Kernels are chosen by name from :data:`ATTENTION_KERNELS`: ``reference`` gathers R for every
(i, j) pair and is meant to be read; ``rel_shift`` computes one (T, R) matrix for the position
term and shifts it with a strided view, the path used in training.

Kernel contract: a kernel gets queries (B, H, T, D), keys and values (B, H, K, D), a relative table
``rel_key`` (H, R, D) whose row ``T - i + j`` holds W_R R for the distance of pair (i, j) (R >= K + 1;
rows past the end are only read for forbidden pairs), u, v and a bool mask broadcastable to
(B, H, T, K), True where forbidden.  :func:`blocked_attention` cuts a problem into blocks of queries,
each with only the keys its attention pattern can reach, and hands every block to a kernel as a
smaller instance of the same contract: that is what makes local patterns linear in length.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from longseq.model.patterns import PatternMask
from longseq.model.positions import clipped_index


def causal_mask(qlen: int, mlen: int, span: int | None, device: torch.device | None = None) -> Tensor:
    """Boolean (T, K) mask, True where attention is forbidden.

    Query i sits at absolute position ``mlen + i`` and sees keys at distance 0 .. mlen + i.
    With ``span`` (``same_length``) it sees only the last ``span`` keys, so every query has
    the same context length once the memory is full.
    """
    query = torch.arange(qlen, device=device)[:, None] + mlen  # (T, 1)
    key = torch.arange(mlen + qlen, device=device)[None, :]  # (1, K)
    distance = query - key  # (T, K)
    masked = distance < 0
    if span is not None:
        masked = masked | (distance >= span)
    return masked


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


def _softmax(scores: Tensor) -> Tensor:
    if scores.dtype in (torch.float16, torch.bfloat16):
        return torch.softmax(scores.float(), dim=-1).to(scores.dtype)
    return torch.softmax(scores, dim=-1)


def reference_attention(
    query: Tensor,  # (B, H, T, D)
    key: Tensor,  # (B, H, K, D)
    value: Tensor,  # (B, H, K, D)
    rel_key: Tensor,  # (H, R, D): W_R R for distances K .. 0
    r_w_bias: Tensor,  # (H, D): u
    r_r_bias: Tensor,  # (H, D): v
    mask: Tensor,  # (T, K) bool
    dropatt: float,
    training: bool,
) -> Tensor:
    """Readable reference: gather W_R R_{i-j} for every (i, j) and add the two terms."""
    probs = F.dropout(attention_probs(query, key, rel_key, r_w_bias, r_r_bias, mask), p=dropatt, training=training)
    return probs @ value  # (B, H, T, D)


def attention_probs(query, key, rel_key, r_w_bias, r_r_bias, mask) -> Tensor:
    """The attention probabilities (B, H, T, K) of the reference, without dropout (``rel_key`` None: content only)."""
    qlen, klen = query.size(2), key.size(2)
    content = torch.einsum("bhtd,bhkd->bhtk", query + r_w_bias[:, None], key)  # (a) + (c)
    scores = content
    if rel_key is not None:
        rows = qlen - torch.arange(qlen, device=query.device)[:, None] + torch.arange(klen, device=query.device)
        rows = rows.clamp(max=rel_key.size(1) - 1)  # (T, K) row of R for each pair; rows past the end are masked
        rel_pairs = rel_key[:, rows]  # (H, T, K, D)
        scores = content + torch.einsum("bhtd,htkd->bhtk", query + r_r_bias[:, None], rel_pairs)  # (b) + (d)
    scores = scores / math.sqrt(query.size(-1))
    return _softmax(scores.masked_fill(mask, float("-inf")))


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


def dense_mask(mask: PatternMask | Tensor) -> Tensor:
    """The whole (T, K)-shaped forbidden mask, from a :class:`PatternMask` or as given."""
    return mask if isinstance(mask, Tensor) else mask.forbidden()


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


ATTENTION_KERNELS: dict[str, AttentionKernel] = {
    "reference": reference_attention,
    "rel_shift": rel_shift_attention,
}


@dataclass(frozen=True)
class RelativePositions:
    """The relative positions of one forward pass, shared by all layers; each layer projects them with its own
    weights inside its own forward (so a sharded layer, FSDP, has gathered those weights when it reads them).

    ``distances`` (R,) are the distances of the table's rows; ``pos_emb`` (R, E) their sinusoidal embedding
    (None with Shaw's or absolute positions); ``dtype`` the table's dtype."""

    distances: Tensor
    pos_emb: Tensor | None
    dtype: torch.dtype


class RelativeMultiHeadAttention(nn.Module):
    """Multi-head attention over [memory; segment] with relative positions and a residual + LayerNorm.

    ``pre_lnorm`` normalises the attention input (memory included); otherwise the residual sum is
    normalised (post-LN), as in the paper.
    """

    def __init__(
        self,
        d_model: int,
        n_head: int,
        d_head: int,
        dropout: float,
        dropatt: float,
        pre_lnorm: bool,
        eps: float,
        kernel: str,
        chunk: int = 0,
        pos: str = "sinusoidal",
        max_relative_distance: int = 0,
    ) -> None:
        super().__init__()
        self.chunk = chunk
        self.n_head, self.d_head = n_head, d_head
        self.pre_lnorm = pre_lnorm
        self.dropatt = dropatt
        self.kernel = kernel
        self.qkv_net = nn.Linear(d_model, 3 * n_head * d_head, bias=False)  # W_q, W_{k,E}, W_v
        self.pos = pos
        self.max_relative_distance = max_relative_distance
        if pos == "shaw":  # Shaw et al. (2018): one learned key per clipped distance, both directions
            self.rel_table = nn.Parameter(torch.zeros(2 * max_relative_distance + 1, n_head * d_head))
        elif pos != "absolute":  # absolute positions are added to the input: no position term here
            self.r_net = nn.Linear(d_model, n_head * d_head, bias=False)  # W_{k,R}
        self.o_net = nn.Linear(n_head * d_head, d_model, bias=False)
        self.layer_norm = nn.LayerNorm(d_model, eps=eps)
        self.drop = nn.Dropout(dropout)

    def rel_keys(self, pos_emb: Tensor) -> Tensor:
        """W_R R for every row of ``pos_emb`` (R, E), as (H, R, D)."""
        return self.r_net(pos_emb).view(-1, self.n_head, self.d_head).transpose(0, 1)

    def relative_keys(self, positions: RelativePositions | Tensor | None) -> Tensor | None:
        """This layer's relative table (H, R, D) for ``positions``; a tensor is taken as an already projected
        table (the evaluation cache), and absolute positions have none."""
        if not isinstance(positions, RelativePositions):
            return positions
        if self.pos == "shaw":
            return self.shaw_keys(positions.distances).to(positions.dtype)
        if self.pos == "absolute":
            return None
        return self.rel_keys(positions.pos_emb)

    def shaw_keys(self, distances: Tensor) -> Tensor:
        """The learned relative keys a_{clip(d)} of Shaw et al. for every distance (R,), as (H, R, D)."""
        rows = self.rel_table[clipped_index(distances, self.max_relative_distance)]  # (R, H*D)
        return rows.view(-1, self.n_head, self.d_head).transpose(0, 1)

    def _project(self, hidden: Tensor, memory: Tensor | None, cache) -> tuple[Tensor, Tensor, Tensor]:
        """Queries (B, H, T, D) of the segment; keys and values (B, H, K, D) of [memory; segment]."""
        batch, qlen, _ = hidden.shape
        width = self.n_head * self.d_head
        if cache is not None:
            source = self.layer_norm(hidden) if self.pre_lnorm else hidden
            query, key, value = self.qkv_net(source).split(width, dim=-1)  # (B, T, H*D) each
            key = key.view(batch, qlen, self.n_head, self.d_head).transpose(1, 2)
            value = value.view(batch, qlen, self.n_head, self.d_head).transpose(1, 2)
            if hasattr(cache, "extend"):  # ring storage: append in place, read a view
                key, value = cache.extend(key, value)  # (B, H, K, D)
            elif cache[0].size(2):
                key = torch.cat([cache[0], key], dim=2)  # (B, H, K, D)
                value = torch.cat([cache[1], value], dim=2)
        else:
            context = (
                hidden if memory is None or memory.size(1) == 0 else torch.cat([memory, hidden], dim=1)
            )  # (B, K, E)
            if self.pre_lnorm:
                context = self.layer_norm(context)
            query, key, value = self.qkv_net(context).split(width, dim=-1)  # (B, K, H*D) each
            query = query[:, -qlen:]
            key = key.view(batch, -1, self.n_head, self.d_head).transpose(1, 2)  # (B, H, K, D)
            value = value.view(batch, -1, self.n_head, self.d_head).transpose(1, 2)  # (B, H, K, D)
        query = query.reshape(batch, qlen, self.n_head, self.d_head).transpose(1, 2)  # (B, H, T, D)
        return query, key, value

    @torch.no_grad()
    def probs(self, hidden, rel_key, r_w_bias, r_r_bias, mask, memory=None, cache=None, with_mass=False) -> Tensor:
        """The attention probabilities (B, H, T, K) this layer uses for these inputs (the reference, no dropout;
        same arguments as :meth:`forward`, for diagnostics).  A ring cache must not be passed: it would grow."""
        query, key, _ = self._project(hidden, memory, cache)
        return attention_probs(query, key, self.relative_keys(rel_key), r_w_bias, r_r_bias, dense_mask(mask))

    def forward(
        self,
        hidden: Tensor,  # (B, T, E)
        rel_key: RelativePositions | Tensor | None,  # positions, or the (H, R, D) table W_R R of distances K .. 0
        r_w_bias: Tensor,  # (H, D)
        r_r_bias: Tensor,  # (H, D)
        mask: PatternMask | Tensor,  # the layer's pattern, or a dense causal (T, K) mask
        memory: Tensor | None = None,  # (B, M, E) hidden-state memory
        cache=None,  # (keys, values) (B, H, M, D) of the memory, or a RingKV
        with_mass: bool = False,
    ) -> tuple[Tensor, tuple[Tensor, Tensor], Tensor | None]:
        """Returns the layer output (B, T, E), the keys and values of [memory; segment] (B, H, K, D), and with
        ``with_mass`` the attention mass every key received (B, K), else None.

        With ``cache`` the memory's keys and values are reused instead of being projected again
        (identical results: the projection is per position, LayerNorm included).
        """
        batch, qlen, _ = hidden.shape
        width = self.n_head * self.d_head
        rel_key = self.relative_keys(rel_key)  # (H, R, D)
        query, key, value = self._project(hidden, memory, cache)  # (B, H, T, D), (B, H, K, D) x 2

        if self.pos == "absolute":  # the vanilla Transformer: content scores only, PyTorch's fused attention
            causal = isinstance(mask, PatternMask) and mask.is_causal_full and mask.mlen == 0 and mask.span is None
            attn = F.scaled_dot_product_attention(
                query, key, value, attn_mask=None if causal else ~dense_mask(mask),
                dropout_p=self.dropatt if self.training else 0.0, is_causal=causal,
            )  # fmt: skip
        else:
            kernel = ATTENTION_KERNELS[self.kernel]
            attn = blocked_attention(
                kernel, self.chunk, query, key, value, rel_key, r_w_bias, r_r_bias, mask, self.dropatt, self.training
            )  # (B, H, T, D)
        attn = attn.transpose(1, 2).reshape(batch, qlen, width)  # (B, T, H*D)
        out = self.drop(self.o_net(attn))  # (B, T, E)
        out = hidden + out if self.pre_lnorm else self.layer_norm(hidden + out)
        mass = key_mass(query, key, rel_key, r_w_bias, r_r_bias, dense_mask(mask)) if with_mass else None
        return out, (key, value), mass
