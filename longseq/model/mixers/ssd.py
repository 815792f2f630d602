"""The selective state-space scan of Mamba-2 (Dao and Gu, 2024, "Transformers are SSMs"): state space duality.

For every head, with a scalar decay a_t = dt_t * A (A < 0) and input x_t scaled by dt_t::

    h_t = exp(a_t) h_{t-1} + x_t B_t^T            h: (P, N)    x_t: (P,)    B_t, C_t: (N,)
    y_t = h_t C_t

:func:`ssd_reference` runs it step by step (the readable reference).  :func:`ssd_chunked` computes the same in
chunks of ``chunk`` positions, mostly as matmuls: inside a chunk the outputs are a masked (decay-weighted)
attention C B^T; between chunks only the states travel.  A position whose ``a_t`` is -inf forgets the state
before it (a document boundary).  Shapes: x (B, T, H, P), a (B, T, H), B and C (B, T, H, N), state (B, H, P, N).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def ssd_reference(x: Tensor, a: Tensor, b: Tensor, c: Tensor, state: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Outputs (B, T, H, P) and the final state (B, H, P, N), one position at a time."""
    batch, length, heads, p = x.shape
    h = x.new_zeros(batch, heads, p, b.size(-1)) if state is None else state
    ys = []
    for t in range(length):
        decay = torch.exp(a[:, t])[:, :, None, None]  # (B, H, 1, 1)
        h = decay * h + x[:, t, :, :, None] * b[:, t, :, None, :]  # (B, H, P, N)
        ys.append(torch.einsum("bhpn,bhn->bhp", h, c[:, t]))
    return torch.stack(ys, dim=1), h


def segsum(a: Tensor) -> Tensor:
    """out[..., i, j] = a[..., j+1] + ... + a[..., i] for j <= i, -inf above the diagonal; summed directly (no
    difference of cumulative sums), so it is exact and -inf entries stay -inf without NaN."""
    length = a.size(-1)
    a = a[..., None].expand(*a.shape, length)  # (..., T, T): [d, e] = a_d
    strict = torch.ones(length, length, dtype=torch.bool, device=a.device).tril(-1)
    sums = a.masked_fill(~strict, 0).cumsum(dim=-2)  # [i, e] = sum over e < d <= i
    return sums.masked_fill(~strict.logical_or(torch.eye(length, dtype=torch.bool, device=a.device)), float("-inf"))


def ssd_chunked(x: Tensor, a: Tensor, b: Tensor, c: Tensor, chunk: int, state: Tensor | None = None):
    """:func:`ssd_reference` in chunks (see the module docstring); the same outputs and final state."""
    batch, length, heads, p = x.shape
    pad = (-length) % chunk
    if pad:  # zero inputs and zero decay at the end change neither outputs nor the final state
        x, b, c = (F.pad(t, (0, 0, 0, 0, 0, pad)) for t in (x, b, c))
        a = F.pad(a, (0, 0, 0, pad))
    n = x.size(1) // chunk
    x, b, c = (t.reshape(batch, n, chunk, heads, -1) for t in (x, b, c))  # (B, n, L, H, .)
    a = a.reshape(batch, n, chunk, heads).permute(0, 3, 1, 2)  # (B, H, n, L)
    within = segsum(a)  # (B, H, n, L, L)
    y_diag = torch.einsum("bclhn,bcshn,bhcls,bcshp->bclhp", c, b, within.exp(), x)  # inside each chunk
    to_end = within[..., -1, :].exp()  # (B, H, n, L): decay from each position to the chunk's end
    states = torch.einsum("bclhn,bhcl,bclhp->bchpn", b, to_end, x)  # (B, n, H, P, N): each chunk's own state
    first = x.new_zeros(batch, 1, heads, p, b.size(-1)) if state is None else state[:, None]
    states = torch.cat([first, states], dim=1)  # (B, n + 1, H, P, N)
    totals = F.pad(within[..., -1, 0] + a[..., 0], (1, 0))  # (B, H, n + 1): each chunk's whole decay
    carried = torch.einsum("bhzc,bchpn->bzhpn", segsum(totals).exp(), states)  # states entering chunks, and final
    from_start = torch.cumsum(a, dim=-1).exp()  # (B, H, n, L): decay from the chunk's start (cumsum: no difference)
    y_off = torch.einsum("bclhn,bchpn,bhcl->bclhp", c, carried[:, :-1], from_start)
    y = (y_diag + y_off).reshape(batch, n * chunk, heads, p)[:, :length]
    return y, carried[:, -1]
