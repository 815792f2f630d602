"""Relative multi-head attention of Transformer-XL (Dai et al., 2019, section 3.3).

Dimension glossary (batch-first everywhere):

    B  batch (parallel streams)         T  query length (the current segment)
    M  memory length                    K  key length, M + T
    H  heads                            D  head dimension (d_head)
    E  model width (d_model)            R  relative positions, K + 1 (distances K .. 0)

For query i (absolute position M + i) and key j the score is

    A_ij = (q_i + u) . k_j  +  (q_i + v) . W_R R_{M+i-j}          (terms (a)+(c) and (b)+(d))

scaled by 1/sqrt(D) (and with ``attn_softcap`` c capped at c tanh(A / c) before the mask and the softmax).
Paper symbols map to parameters as u -> ``r_w_bias``,
v -> ``r_r_bias``, W_R -> ``r_net``; W_q, W_k, W_v are the three blocks of ``qkv_net``.

Kernels are chosen by name from :data:`ATTENTION_KERNELS`: ``reference`` gathers R for every
(i, j) pair and is meant to be read; ``rel_shift`` computes one (T, R) matrix for the position
term and shifts it with a strided view, the path used in training.

Kernel contract: a kernel gets queries (B, H, T, D), keys and values (B, H, K, D), a relative table
``rel_key`` (H, R, D) whose row ``T - i + j`` holds W_R R for the distance of pair (i, j) (R >= K + 1;
rows past the end are only read for forbidden pairs), u, v, a bool mask broadcastable to
(B, H, T, K), True where forbidden, and the keyword ``softcap`` (0: no cap).  :func:`blocked_attention` cuts a
problem into blocks of queries, each with only the keys its attention pattern can reach, and hands every block to
a kernel as a smaller instance of the same contract: that is what makes local patterns linear in length.  Sparse
patterns (strided, block_sparse, global tokens, random blocks) run as disjoint pieces of their allowed pairs under
one softmax (:mod:`longseq.model.attention.sparse`), so they cost what they allow.
"""

from longseq.model.attention.kernels import (
    ATTENTION_KERNELS,
    banded_attention,
    blocked_attention,
    key_mass,
    rel_shift,
    rel_shift_attention,
)
from longseq.model.attention.module import RelativeMultiHeadAttention, RelativePositions
from longseq.model.attention.patterns import AttentionPattern, PatternError, PatternMask
from longseq.model.attention.reference import attention_probs, causal_mask, dense_mask, reference_attention

__all__ = [
    "ATTENTION_KERNELS",
    "AttentionPattern",
    "PatternError",
    "PatternMask",
    "RelativeMultiHeadAttention",
    "RelativePositions",
    "attention_probs",
    "banded_attention",
    "blocked_attention",
    "causal_mask",
    "dense_mask",
    "key_mass",
    "reference_attention",
    "rel_shift",
    "rel_shift_attention",
]
