"""The decayed outer-product recurrence behind linear attention, retention and gated linear attention, in three
forms that give the same numbers.

For every head, with a log-decay g_t <= 0 (one scalar per head, or one per key channel) and a state S (K, V)::

    S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T          o_t = S_t^T q_t
        = sum_{s <= t} (q_t * exp(G_t - G_s)) . k_s  v_s      (G the cumulative sum of g; + the carried state)

* :func:`scan_quadratic`: the masked (T, T) form, the whole sequence at once: the readable float64 reference.
* :func:`scan_chunked`: chunks of ``chunk`` positions, for training: inside a chunk the masked form (its decays
  built pairwise, or factored between sub-chunks, so no exponent is positive and none overflows), between chunks
  only the state travels.
* :func:`scan_recurrent`: one position at a time, for generation (a segment of one token costs one update).

A document start (``starts`` (B, T) bool) resets the state: a position of a new document sees nothing from
before its start.  The masks implement it (no -inf decays, so no difference of infinities).  Shapes: q, k
(B, T, H, K); v (B, T, H, V); g None (no decay), (B, T, H) or (B, T, H, K); state (B, H, K, V).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def _log_decay(g: Tensor | None, q: Tensor) -> Tensor:
    """g as (B, T, H, 1) or (B, T, H, K); zeros without decay."""
    if g is None:
        return q.new_zeros(*q.shape[:3], 1)
    return g[..., None] if g.dim() == 3 else g


def segments(starts: Tensor | None, shape: tuple[int, int], device) -> Tensor:
    """(B, T) number of document starts at or before each position (0: the position continues the carried state)."""
    if starts is None:
        return torch.zeros(shape, dtype=torch.long, device=device)
    return starts.long().cumsum(dim=1)


def scan_quadratic(q: Tensor, k: Tensor, v: Tensor, g: Tensor | None = None, state: Tensor | None = None,
                   starts: Tensor | None = None) -> tuple[Tensor, Tensor]:  # fmt: skip
    """Outputs (B, T, H, V) and the final state (B, H, K, V): scores q_t . (k_s * exp(G_t - G_s)) for s <= t in the
    same document, times the values, plus the carried state read through exp(G_t) until the first start."""
    batch, length = q.shape[:2]
    G = _log_decay(g, q).cumsum(dim=1).transpose(1, 2)  # (B, H, T, K or 1): log-decay from the start to t
    seg = segments(starts, (batch, length), q.device)  # (B, T)
    q, k, v = (x.transpose(1, 2) for x in (q, k, v))  # (B, H, T, .)
    causal = torch.ones(length, length, dtype=torch.bool, device=q.device).tril()
    allowed = (causal & (seg[:, :, None] == seg[:, None, :]))[:, None, :, :, None]  # (B, 1, T, S, 1)
    decay = (G[:, :, :, None] - G[:, :, None]).masked_fill(~allowed, float("-inf")).exp()  # (B, H, T, S, K or 1)
    scores = torch.einsum("bhtk,bhsk,bhtsk->bhts", q, k, decay.expand(*decay.shape[:-1], q.size(-1)))
    out = scores @ v  # (B, H, T, V)
    in_last = (seg == seg[:, -1:])[:, None, :, None]  # (B, 1, T, 1): positions of the last document
    to_end = (G[:, :, -1:] - G).masked_fill(~in_last, float("-inf")).exp()  # (B, H, T, K or 1)
    final = (k * to_end).transpose(-1, -2) @ v  # (B, H, K, V)
    if state is not None:
        fresh = (seg == 0)[:, None, :, None].to(q.dtype)  # (B, 1, T, 1): before the first start
        out = out + ((q * G.exp()) @ state) * fresh
        survives = (seg[:, -1] == 0).to(q.dtype)[:, None, None, None]
        final = final + G[:, :, -1, :, None].exp() * state * survives
    return out.transpose(1, 2), final


def scan_recurrent(q: Tensor, k: Tensor, v: Tensor, g: Tensor | None = None, state: Tensor | None = None,
                   starts: Tensor | None = None) -> tuple[Tensor, Tensor]:  # fmt: skip
    """The recurrence itself, one position at a time: reset (a start), decay, write k v^T, read with q."""
    batch, length, heads, width = q.shape
    g = _log_decay(g, q)
    s = q.new_zeros(batch, heads, width, v.size(-1)) if state is None else state
    outs = []
    for t in range(length):
        if starts is not None:
            s = s * (~starts[:, t]).to(q.dtype)[:, None, None, None]
        s = g[:, t, :, :, None].exp() * s + k[:, t, :, :, None] * v[:, t, :, None, :]  # (B, H, K, V)
        outs.append((q[:, t, :, :, None] * s).sum(-2))  # (B, H, V)
    return torch.stack(outs, dim=1), s


SUB = 16  # with a decay per key channel, only sub-chunks of this many positions build their (L, S, K) decays


def inside_decays(G: Tensor) -> Tensor:
    """exp(G_l - G_s) for s <= l and 0 above the diagonal, (..., c, c, K), from G (..., c, K)."""
    causal = torch.ones(G.size(-2), G.size(-2), dtype=torch.bool, device=G.device).tril()
    return (G[..., :, None, :] - G[..., None, :, :]).masked_fill(~causal[..., None], float("-inf")).exp()


class InsideScores(torch.autograd.Function):
    """q_l . (k_s * exp(G_l - G_s)) inside blocks (..., c, K), whose pairwise decays (c, c, K) per block are the
    largest tensors of a per-channel scan.  Autograd would keep four of that size for the backward; this keeps q, k
    and G and rebuilds the decays E there, with the gradients written out (W = dS * E):

        dq_l = sum_s W_ls k_s      dk_s = sum_l W_ls q_l      dG = q * dq - k * dk

    Differentiable once (a second derivative through the scan, ``create_graph=True``, is refused)."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, G: Tensor) -> Tensor:
        ctx.save_for_backward(q, k, G)
        return (inside_decays(G).mul_(q[..., :, None, :]).mul_(k[..., None, :, :])).sum(-1)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        q, k, G = ctx.saved_tensors
        weights = inside_decays(G).mul_(grad[..., None])  # (..., c, c, K)
        dq = (weights * k[..., None, :, :]).sum(-2)
        dk = weights.mul_(q[..., :, None, :]).sum(-3)
        return dq.to(q.dtype), dk.to(k.dtype), (q * dq - k * dk).to(G.dtype)


def channel_scores(q: Tensor, k: Tensor, G: Tensor) -> Tensor:
    """q_l . (k_s * exp(G_l - G_s)) for s <= l inside blocks (..., L, K) (0 above the diagonal), with a log-decay
    G (..., L, K) per key channel that never increases.  Inside sub-chunks of ``SUB`` positions the decays are built
    pairwise; between sub-chunks j < i the product factors through r, the last position of sub-chunk j, as
    (q_l * exp(G_l - G_r)) . (k_s * exp(G_r - G_s)): two matrices, both exponents <= 0, so nothing overflows and
    memory per position is ``SUB`` + L / ``SUB`` decays per channel instead of L."""
    *lead, length, width = q.shape
    c = SUB if length % SUB == 0 else length
    m = length // c
    qs, ks, Gs = (x.reshape(*lead, m, c, width) for x in (q, k, G))  # (..., m, c, K)
    inside = InsideScores.apply(qs, ks, Gs)  # (..., m, c, c)
    ends = Gs[..., -1, :]  # (..., m, K): G at each sub-chunk's last position
    block = torch.arange(length, device=q.device) // c  # (L,): each position's sub-chunk
    earlier = block[:, None] > torch.arange(m, device=q.device)  # (L, m): sub-chunk j ends before position l
    to_query = (G[..., :, None, :] - ends[..., None, :, :]).masked_fill(~earlier[..., None], float("-inf")).exp()
    from_key = ks * (ends[..., None, :] - Gs).exp()  # (..., m, c, K)
    rows = (q[..., :, None, :] * to_query).transpose(-3, -2)  # (..., m, L, K): q_l * exp(G_l - G_r) per sub-chunk j
    between = (rows @ from_key.transpose(-1, -2)).transpose(-3, -2).reshape(*lead, length, length)  # a matmul per j
    same = block[:, None] == block[None, :]  # (L, S)
    inside = inside[..., :, :, None, :].expand(*lead, m, c, m, c).reshape(*lead, length, length)
    return torch.where(same, inside, between)  # inside is 0 above the diagonal


def scan_chunked(q: Tensor, k: Tensor, v: Tensor, g: Tensor | None, chunk: int, state: Tensor | None = None,
                 starts: Tensor | None = None) -> tuple[Tensor, Tensor]:  # fmt: skip
    """:func:`scan_quadratic` in chunks: the same outputs and final state.  Memory per position: ``chunk`` scores
    (and ``SUB`` + ``chunk`` / ``SUB`` decays per key channel with a decay per channel: :func:`channel_scores`)
    and the state entering its chunk."""
    batch, length, heads, width = q.shape
    g = _log_decay(g, q)
    pad = (-length) % chunk
    if pad:  # zero keys and values, no decay: nothing written, nothing forgotten
        q, k, v, g = (F.pad(x, (0, 0, 0, 0, 0, pad)) for x in (q, k, v, g))
        starts = None if starts is None else F.pad(starts, (0, pad))
    n = q.size(1) // chunk
    q, k, v, g = (x.reshape(batch, n, chunk, heads, -1).permute(0, 3, 1, 2, 4) for x in (q, k, v, g))  # (B,H,n,L,.)
    G = g.cumsum(dim=3)  # (B, H, n, L, K or 1): log-decay from the chunk's start to each position
    seg = segments(None if starts is None else starts.view(batch * n, chunk), (batch * n, chunk), q.device)
    seg = seg.view(batch, 1, n, chunk)  # starts counted inside each chunk
    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    allowed = causal & (seg[..., :, None] == seg[..., None, :])  # (B, 1, n, L, S)
    if G.size(-1) == 1:  # one decay per head: (L, S) decays
        decay = (G - G.transpose(-1, -2)).masked_fill(~allowed, float("-inf")).exp()
        scores = (q @ k.transpose(-1, -2)) * decay  # (B, H, n, L, S)
    else:  # a decay per key channel
        scores = channel_scores(q, k, G).masked_fill(~allowed, 0)
    out = scores @ v  # (B, H, n, L, V): from inside each chunk
    in_last = (seg == seg[..., -1:])[..., None]  # (B, 1, n, L, 1)
    to_end = (G[..., -1:, :] - G).masked_fill(~in_last, float("-inf")).exp()  # (B, H, n, L, K or 1)
    own = (k * to_end).transpose(-1, -2) @ v  # (B, H, n, K, V): each chunk's own state
    through = G[..., -1, :].exp() * (seg[..., -1] == 0).to(q.dtype)[..., None]  # (B, H, n, K or 1)
    s = q.new_zeros(batch, heads, width, v.size(-1)) if state is None else state
    entering = []
    # unbound once: indexing chunk c of the whole (..., n, ...) tensor would make its gradient a zero tensor of n
    # chunks per chunk (quadratic in the length), where unbind's backward stacks the n gradients once
    for decay, written in zip(through.unsqueeze(-1).unbind(2), own.unbind(2)):  # the states travel chunk to chunk
        entering.append(s)
        s = decay * s + written
    fresh = (seg == 0)[..., None].to(q.dtype)  # (B, 1, n, L, 1)
    out = out + ((q * G.exp()) @ torch.stack(entering, dim=2)) * fresh  # the carried state
    out = out.permute(0, 2, 3, 1, 4).reshape(batch, n * chunk, heads, -1)[:, :length]
    return out, s
