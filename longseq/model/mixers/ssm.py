"""The ``ssm`` mixer: a Mamba-2 block (Dao and Gu, 2024) whose state is carried like the XL memory.

    z, x, B, C, dt = W_in h                       (gate, input, the state's input and output maps, step size)
    x, B, C = silu(causal_conv(x, B, C))          (a short depthwise convolution, ``conv_kernel`` taps)
    y = SSD(x * dt, A * dt, B, C) + D x           (per head: h_t = exp(A dt_t) h_{t-1} + dt_t x_t B_t^T, y_t = h_t C_t)
    out = W_out RMSNorm(y * silu(z))

A is a negative scalar per head (``A_log``), dt = softplus(dt_raw + dt_bias).  The state is the convolution's tail
(B, K - 1, I + 2N) and the scan's state (B, H, P, N).  On CUDA with ``mamba-ssm`` installed the scan runs in its
fused kernel; elsewhere in the chunked PyTorch form (:mod:`longseq.model.mixers.ssd`).  A document boundary
(``docs``) resets the scan (its decay is exp(-inf) = 0) and masks the convolution's taps.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from longseq.model.mixers.conv import causal_conv
from longseq.model.mixers.ssd import ssd_chunked, ssd_reference


def _fused_scan():
    """mamba-ssm's fused chunked scan, when it is installed (CUDA only), else None."""
    try:
        from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined
    except ImportError:
        return None
    return mamba_chunk_scan_combined


class Mamba2(nn.Module):
    """(B, T, E) -> (B, T, E) with state ``(conv tail, scan state)``.  ``scan="reference"`` runs the scan step by
    step (tests)."""

    def __init__(
        self, d_model: int, d_state: int, head_dim: int, expand: int, chunk: int, kernel: int, eps: float = 1e-5
    ) -> None:
        super().__init__()
        self.inner, self.d_state, self.head_dim, self.chunk = expand * d_model, d_state, head_dim, chunk
        self.heads = self.inner // head_dim
        conv_dim = self.inner + 2 * d_state
        self.in_proj = nn.Linear(d_model, self.inner + conv_dim + self.heads, bias=False)  # z, (x B C), dt
        self.conv_weight = nn.Parameter(torch.zeros(conv_dim, kernel))
        self.conv_bias = nn.Parameter(torch.zeros(conv_dim))
        self.dt_bias = nn.Parameter(torch.zeros(self.heads))
        self.A_log = nn.Parameter(torch.zeros(self.heads))
        self.D = nn.Parameter(torch.ones(self.heads))
        self.norm = nn.RMSNorm(self.inner, eps=eps)
        self.out_proj = nn.Linear(self.inner, d_model, bias=False)
        self.scan = "chunked"
        self.init_own_parameters()

    def init_own_parameters(self) -> None:
        """Mamba's initialisation of what is not a plain weight: A in [1, 16] (log-spaced), dt in [1e-3, 1e-1]
        through softplus's inverse, D = 1, the gated norm's scale 1, the convolution's taps normal(0, 1 / kernel),
        and PyTorch's default for the two projections, as mamba-ssm keeps them.  The model's own initialisation
        (normal(0, 0.02) for every weight) calls it again after its pass."""
        with torch.no_grad():
            self.in_proj.reset_parameters()
            self.out_proj.reset_parameters()
            self.norm.reset_parameters()
            self.conv_weight.normal_(0.0, self.conv_weight.size(1) ** -0.5)
            self.A_log.copy_(torch.linspace(math.log(1.0), math.log(16.0), self.heads))
            dt = torch.exp(torch.linspace(math.log(1e-3), math.log(1e-1), self.heads))
            self.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))
            self.D.fill_(1.0)

    def forward(self, hidden: Tensor, state: tuple | None, docs=None) -> tuple[Tensor, tuple]:
        batch, length, _ = hidden.shape
        z, xbc, dt = self.in_proj(hidden).split([self.inner, self.inner + 2 * self.d_state, self.heads], dim=-1)
        tail, scan_state = (None, None) if state is None else state
        xbc, tail = causal_conv(xbc, self.conv_weight, self.conv_bias, tail, docs)
        x, b, c = F.silu(xbc).split([self.inner, self.d_state, self.d_state], dim=-1)
        dt = F.softplus(dt + self.dt_bias)  # (B, T, H)
        x = x.view(batch, length, self.heads, self.head_dim)
        b, c = b[:, :, None], c[:, :, None]  # (B, T, 1, N): one group, B and C shared by the heads
        y, scan_state = self._scan(x, dt, b, c, scan_state, docs)
        y = y + x * self.D[:, None].to(x.dtype)
        y = self.norm(y.reshape(batch, length, self.inner) * F.silu(z))
        return self.out_proj(y), (tail, scan_state)

    def state_shapes(self) -> tuple[tuple[int, ...], ...]:
        """The shapes of the state's tensors without the batch: the tail (K - 1, I + 2N), the scan's (H, P, N)."""
        return ((self.conv_weight.size(1) - 1, self.conv_weight.size(0)), (self.heads, self.head_dim, self.d_state))

    def _scan(self, x, dt, b, c, state, docs):
        """The scan of x (B, T, H, P) with steps dt (B, T, H): outputs (B, T, H, P) and the final state."""
        exact = torch.float64 if dt.dtype == torch.float64 else torch.float32  # A in full precision
        A = -torch.exp(self.A_log.to(exact)).to(dt.dtype)  # (H,)
        fused = _fused_scan() if x.is_cuda and self.scan == "chunked" else None
        if fused is not None:  # untested here (no GPU): mamba-ssm's kernel, documents as its seq_idx
            seq_idx = None if docs is None else (docs[0] - docs[0][:, :1]).to(torch.int32).contiguous()
            return fused(
                x, dt, A, b, c, chunk_size=self.chunk, initial_states=state, seq_idx=seq_idx, return_final_states=True
            )
        a = dt * A  # (B, T, H), log-decays
        if docs is not None:  # a token that starts a document forgets the state before it
            previous = torch.cat([docs[1][:, None], docs[0][:, :-1]], dim=1)
            a = a.masked_fill((docs[0] != previous)[:, :, None], float("-inf"))
        if self.scan == "reference" or x.size(1) <= 4:  # a few positions (generation): the recurrence itself
            return ssd_reference(x * dt[..., None], a, b, c, state)
        return ssd_chunked(x * dt[..., None], a, b, c, self.chunk, state, boundaries=docs is not None)
