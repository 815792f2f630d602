"""The readable reference of relative attention: every (query, key) pair's four terms written out, a dense
mask, one softmax.  Kernels in :mod:`longseq.model.attention.kernels` are tested against it.

See :mod:`longseq.model.attention` for the dimension glossary and the score.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from longseq.model.attention.patterns import PatternMask
from longseq.model.block import softcap


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
    first_forbidden: int = 0,  # the kernel contract's hint: the reference masks every column
    softcap: float = 0.0,  # > 0: every score capped at softcap * tanh(score / softcap) before the mask
) -> Tensor:
    """Readable reference: gather W_R R_{i-j} for every (i, j) and add the two terms."""
    probs = attention_probs(query, key, rel_key, r_w_bias, r_r_bias, dense_mask(mask), softcap)
    return F.dropout(probs, p=dropatt, training=training) @ value  # (B, H, T, D)


def distance_bias(bias: Tensor, qlen: int, klen: int) -> Tensor:
    """A bias per distance row (H, R) (row ``T - i + j`` for the pair (i, j), as a relative table) gathered for
    every pair: (H, T, K).  Rows past the end are read only for forbidden pairs."""
    rows = qlen - torch.arange(qlen, device=bias.device)[:, None] + torch.arange(klen, device=bias.device)
    return bias[:, rows.clamp(max=bias.size(1) - 1)]


def reference_content_attention(
    query: Tensor,  # (B, H, T, D)
    key: Tensor,  # (B, H, K, D)
    value: Tensor,  # (B, H, K, D)
    bias: Tensor | None,  # (H, R): a bias per distance row (alibi, t5), or None
    r_w_bias: Tensor,  # unread: no u and v
    r_r_bias: Tensor,
    mask,  # a PatternMask or a bool tensor broadcastable to (B, H, T, K), True where forbidden
    dropatt: float,
    training: bool,
    first_forbidden: int = 0,
    softcap: float = 0.0,
) -> Tensor:
    """The content family's readable reference: softmax(q.k / sqrt(D) + bias_{i-j}) over the allowed keys (each
    score capped first with ``softcap`` > 0)."""
    probs = content_probs(query, key, bias, dense_mask(mask), softcap)
    return F.dropout(probs, p=dropatt, training=training) @ value


def content_probs(query: Tensor, key: Tensor, bias: Tensor | None, mask: Tensor, cap: float = 0.0) -> Tensor:
    """The content family's attention probabilities (B, H, T, K) of the reference, without dropout."""
    scores = torch.einsum("bhtd,bhkd->bhtk", query, key) / math.sqrt(query.size(-1))
    if bias is not None:
        scores = scores + distance_bias(bias, query.size(2), key.size(2)).to(scores.dtype)
    return _softmax(softcap(scores, cap).masked_fill(mask, float("-inf")))


def attention_probs(query, key, rel_key, r_w_bias, r_r_bias, mask, cap: float = 0.0) -> Tensor:
    """The attention probabilities (B, H, T, K) of the reference, without dropout (``rel_key`` None: content only)."""
    qlen, klen = query.size(2), key.size(2)
    content = torch.einsum("bhtd,bhkd->bhtk", query + r_w_bias[:, None], key)  # (a) + (c)
    scores = content
    if rel_key is not None:
        rows = qlen - torch.arange(qlen, device=query.device)[:, None] + torch.arange(klen, device=query.device)
        rows = rows.clamp(max=rel_key.size(1) - 1)  # (T, K) row of R for each pair; rows past the end are masked
        rel_pairs = rel_key[:, rows]  # (H, T, K, D)
        scores = content + torch.einsum("bhtd,htkd->bhtk", query + r_r_bias[:, None], rel_pairs)  # (b) + (d)
    scores = softcap(scores / math.sqrt(query.size(-1)), cap)  # cap * tanh(score / cap) with a cap
    return _softmax(scores.masked_fill(mask, float("-inf")))


def dense_mask(mask: PatternMask | Tensor) -> Tensor:
    """The whole (T, K)-shaped forbidden mask, from a :class:`PatternMask` or as given."""
    return mask if isinstance(mask, Tensor) else mask.forbidden()
