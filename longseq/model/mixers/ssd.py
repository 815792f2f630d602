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
    """Outputs (B, T, H, P) and the final state (B, H, P, N), one position at a time (``b``, ``c`` may have one
    group shared by the heads)."""
    batch, length, heads, p = x.shape
    b, c = b.expand(batch, length, heads, b.size(-1)), c.expand(batch, length, heads, c.size(-1))
    h = x.new_zeros(batch, heads, p, b.size(-1)) if state is None else state
    ys = []
    for t in range(length):
        decay = torch.exp(a[:, t])[:, :, None, None]  # (B, H, 1, 1)
        h = decay * h + x[:, t, :, :, None] * b[:, t, :, None, :]  # (B, H, P, N)
        ys.append((h * c[:, t, :, None, :]).sum(-1))  # (B, H, P)
    return torch.stack(ys, dim=1), h


def segsum(a: Tensor, boundaries: bool = False) -> Tensor:
    """out[..., i, j] = a[..., j+1] + ... + a[..., i] for j <= i, -inf above the diagonal.

    Without -inf entries (``boundaries`` False: no document boundary) it is a difference of cumulative sums, one
    pass over the (T, T) result; with them each entry is summed directly (no difference of infinities, so no NaN).
    The caller says which (it knows whether it tracks documents): the data is never read on the host."""
    length = a.size(-1)
    causal = torch.ones(length, length, dtype=torch.bool, device=a.device).tril()
    if not boundaries:
        total = a.cumsum(dim=-1)
        return (total[..., :, None] - total[..., None, :]).masked_fill(~causal, float("-inf"))
    strict = causal.tril(-1)
    sums = a[..., None].expand(*a.shape, length).masked_fill(~strict, 0).cumsum(dim=-2)  # [i, e] = sum e < d <= i
    return sums.masked_fill(~causal, float("-inf"))


def ssd_chunked(
    x: Tensor, a: Tensor, b: Tensor, c: Tensor, chunk: int, state: Tensor | None = None, boundaries: bool = False
):
    """:func:`ssd_reference` in chunks (see the module docstring); the same outputs and final state.  ``b`` and
    ``c`` may have one group (B, T, 1, N) shared by every head, which is computed once.  ``boundaries``: ``a`` may
    hold -inf (a document boundary resets the scan)."""
    batch, length, heads, p = x.shape
    pad = (-length) % chunk
    if pad:  # zero inputs and zero decay at the end change neither outputs nor the final state
        x, b, c = (F.pad(t, (0, 0, 0, 0, 0, pad)) for t in (x, b, c))
        a = F.pad(a, (0, 0, 0, pad))
    n = x.size(1) // chunk
    x = x.reshape(batch, n, chunk, heads, p).permute(0, 1, 3, 2, 4)  # (B, n, H, L, P)
    b, c = (t.reshape(batch, n, chunk, t.size(2), -1).permute(0, 1, 3, 2, 4) for t in (b, c))  # (B, n, G, L, N)
    a = a.reshape(batch, n, chunk, heads).permute(0, 1, 3, 2)  # (B, n, H, L)
    within = segsum(a, boundaries)  # (B, n, H, L, L): log-decay from position s to l inside a chunk
    scores = (c @ b.transpose(-1, -2)) * within.exp()  # (B, n, H, L, L): C_l . B_s, decayed
    y = scores @ x  # (B, n, H, L, P): the outputs from inside each chunk
    to_end = within[..., -1, :].exp()  # (B, n, H, L): decay from each position to the chunk's end
    states = (x * to_end[..., None]).transpose(-1, -2) @ b  # (B, n, H, P, N): each chunk's own state
    first = x.new_zeros(batch, 1, heads, p, b.size(-1)) if state is None else state[:, None]
    states = torch.cat([first, states], dim=1)  # (B, n + 1, H, P, N)
    totals = F.pad((within[..., -1, 0] + a[..., 0]).transpose(1, 2), (1, 0))  # (B, H, n + 1): each chunk's decay
    decay = segsum(totals, boundaries).exp()  # (B, H, n + 1, n + 1)
    flat = states.permute(0, 2, 1, 3, 4).reshape(batch, heads, n + 1, -1)  # (B, H, n + 1, P * N)
    carried = (decay @ flat).view(batch, heads, n + 1, p, -1).permute(0, 2, 1, 3, 4)  # (B, n + 1, H, P, N)
    from_start = torch.cumsum(a, dim=-1).exp()  # (B, n, H, L): decay from the chunk's start (no difference taken)
    y = y + (c @ carried[:, :-1].transpose(-1, -2)) * from_start[..., None]  # (B, n, H, L, P): the carried state
    y = y.permute(0, 1, 3, 2, 4).reshape(batch, n * chunk, heads, p)[:, :length]
    return y, carried[:, -1]
