"""The delta rule (Schlag et al., 2021; DeltaNet as parallelised by Yang et al., 2024) in three forms that give the
same numbers.

For every head, with a write strength beta_t in (0, 1) and a state S (K, V)::

    u_t = beta_t (v_t - S_{t-1}^T k_t)          (the value it writes: what k_t recalls, corrected towards v_t)
    S_t = S_{t-1} + k_t u_t^T                   o_t = S_t^T q_t

Unrolled, S_{t-1} = S_0 + sum_{s < t} k_s u_s^T, so the u of a block solve one unit lower-triangular system,
(I + tril(diag(beta) K K^T, -1)) U = diag(beta) (V - K S_0): the WY/UT form of Yang et al.

* :func:`delta_quadratic`: that system over the whole sequence, then O = Q S_0 + tril(Q K^T) U: the readable
  float64 reference.
* :func:`delta_chunked`: the same per chunk of ``chunk`` positions (the solves of every chunk at once), the state
  carried from chunk to chunk, for training.
* :func:`delta_recurrent`: one position at a time, for generation.

A document start (``starts`` (B, T) bool) resets the state, by masks as in :mod:`.linear_scan`.  In float16 and
bfloat16 the triangular system is built and solved in float32 (PyTorch has no half-precision solve on a CPU) and
its solutions cast back.  Shapes: q, k
(B, T, H, K); v (B, T, H, V); beta (B, T, H); state (B, H, K, V).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from longseq.model.mixers.linear_scan import segments


def _block(q, k, v, beta, seg):
    """For blocks (..., L, .) with document counts ``seg`` (..., L): the masked Q K^T (..., L, L), the system's
    solutions for the values and for the carried state's keys, W = T^-1 (beta K) and U0 = T^-1 (beta V), and
    the masks (before the first start, in the last document)."""
    length = q.size(-2)
    same = seg[..., :, None] == seg[..., None, :]  # (..., L, S)
    causal = torch.ones(length, length, dtype=torch.bool, device=q.device).tril()
    strict = same & causal.tril(-1)
    fresh = (seg == 0)[..., None].to(q.dtype)  # (..., L, 1)
    exact = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype  # no half-precision solve
    k_, v_, beta_ = (x.to(exact) for x in (k, v, beta))
    system = (beta_[..., None] * (k_ @ k_.transpose(-1, -2))).masked_fill(~strict, 0)
    system = system + torch.eye(length, dtype=exact, device=q.device)  # I + tril(diag(beta) K K^T, -1)
    rhs = torch.cat([beta_[..., None] * k_ * fresh.to(exact), beta_[..., None] * v_], dim=-1)
    solved = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True).to(q.dtype)
    w, u0 = solved.split([k.size(-1), v.size(-1)], dim=-1)
    scores = (q @ k.transpose(-1, -2)).masked_fill(~(same & causal), 0)  # (..., L, S)
    in_last = (seg == seg[..., -1:])[..., None].to(q.dtype)  # (..., L, 1)
    return scores, w, u0, fresh, in_last


def delta_quadratic(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, state: Tensor | None = None,
                    starts: Tensor | None = None) -> tuple[Tensor, Tensor]:  # fmt: skip
    """Outputs (B, T, H, V) and the final state (B, H, K, V), the whole sequence as one triangular system."""
    batch, length, heads, width = q.shape
    seg = segments(starts, (batch, length), q.device)[:, None]  # (B, 1, T)
    q, k, v, beta = (x.transpose(1, 2) for x in (q, k, v, beta))  # (B, H, T, .), beta (B, H, T)
    scores, w, u0, fresh, in_last = _block(q, k, v, beta, seg)
    s0 = q.new_zeros(batch, heads, width, v.size(-1)) if state is None else state
    u = u0 - w @ s0  # (B, H, T, V)
    out = scores @ u + (q @ s0) * fresh
    survives = (seg[..., -1] == 0).to(q.dtype)[..., None, None]  # (B, 1, 1, 1)
    final = s0 * survives + (k * in_last).transpose(-1, -2) @ u
    return out.transpose(1, 2), final


def delta_recurrent(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, state: Tensor | None = None,
                    starts: Tensor | None = None) -> tuple[Tensor, Tensor]:  # fmt: skip
    """The rule itself, one position at a time: reset (a start), recall, correct, read."""
    batch, length, heads, width = q.shape
    s = q.new_zeros(batch, heads, width, v.size(-1)) if state is None else state
    outs = []
    for t in range(length):
        if starts is not None:
            s = s * (~starts[:, t]).to(q.dtype)[:, None, None, None]
        recalled = (s * k[:, t, :, :, None]).sum(-2)  # (B, H, V): S^T k
        u = beta[:, t, :, None] * (v[:, t] - recalled)
        s = s + k[:, t, :, :, None] * u[:, :, None, :]
        outs.append((q[:, t, :, :, None] * s).sum(-2))
    return torch.stack(outs, dim=1), s


def delta_chunked(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, chunk: int, state: Tensor | None = None,
                  starts: Tensor | None = None) -> tuple[Tensor, Tensor]:  # fmt: skip
    """:func:`delta_quadratic` per chunk with the state carried: the same outputs and final state."""
    batch, length, heads, width = q.shape
    pad = (-length) % chunk
    if pad:  # zero keys and write strengths: nothing recalled, nothing written
        q, k, v = (F.pad(x, (0, 0, 0, 0, 0, pad)) for x in (q, k, v))
        beta = F.pad(beta, (0, 0, 0, pad))
        starts = None if starts is None else F.pad(starts, (0, pad))
    n = q.size(1) // chunk
    q, k, v = (x.reshape(batch, n, chunk, heads, -1).permute(0, 3, 1, 2, 4) for x in (q, k, v))  # (B, H, n, L, .)
    beta = beta.reshape(batch, n, chunk, heads).permute(0, 3, 1, 2)  # (B, H, n, L)
    seg = segments(None if starts is None else starts.view(batch * n, chunk), (batch * n, chunk), q.device)
    seg = seg.view(batch, 1, n, chunk)  # starts counted inside each chunk
    scores, w, u0, fresh, in_last = _block(q, k, v, beta, seg)
    survives = (seg[..., -1] == 0).to(q.dtype)[..., None, None]  # (B, 1, n, 1, 1)
    written = (k * in_last).transpose(-1, -2)  # (B, H, n, K, L)
    s = q.new_zeros(batch, heads, width, v.size(-1)) if state is None else state
    entering, values = [], []
    # unbound once: indexing chunk c of a whole (..., n, ...) tensor would make its gradient a zero tensor of n
    # chunks per chunk (quadratic in the length), where unbind's backward stacks the n gradients once
    chunks = zip(*(x.unbind(2) for x in (u0, w, survives.expand(-1, -1, n, -1, -1), written)))
    for u0_c, w_c, survives_c, written_c in chunks:  # the only sequential part: each chunk's values need its state
        entering.append(s)
        u = u0_c - w_c @ s  # (B, H, L, V)
        values.append(u)
        s = s * survives_c + written_c @ u
    entering, u = torch.stack(entering, dim=2), torch.stack(values, dim=2)  # (B, H, n, K, V), (B, H, n, L, V)
    out = scores @ u + (q @ entering) * fresh
    out = out.permute(0, 2, 3, 1, 4).reshape(batch, n * chunk, heads, -1)[:, :length]
    return out, s
