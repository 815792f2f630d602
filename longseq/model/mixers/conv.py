"""Causal depthwise convolution with a carried tail, and the gated convolution mixer (in the spirit of H3's and
Hyena's short convolutions): ``out = W_o (conv(W_u h) * silu(W_g h))``.

The state a layer carries is the last ``kernel - 1`` inputs of its convolution, so a segment's first positions
see the previous segment's last ones.  With document ids, a tap never reaches another document: taps are masked
where the document differs, and entries of the tail that belong to an earlier document are zeroed when it is
written (a later token can only belong to the last document or a newer one).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def causal_conv(u: Tensor, weight: Tensor, bias: Tensor | None, tail: Tensor | None, docs=None):
    """Depthwise causal convolution of ``u`` (B, T, C) with ``weight`` (C, K): out[t] = sum_k weight[:, k] *
    u[t - (K - 1) + k] (+ bias), reading positions before t = 0 from ``tail`` (B, K - 1, C; zeros when None).
    ``docs`` = (document of every position (B, T), document of the tail's last position (B,)) masks taps across
    documents.  Returns the output (B, T, C) and the new tail (B, K - 1, C)."""
    batch, length, channels = u.shape
    k = weight.size(1)
    if tail is None:
        tail = u.new_zeros(batch, k - 1, channels)
    full = torch.cat([tail.to(u.dtype), u], dim=1)  # (B, K - 1 + T, C)
    if docs is None:  # K shifted multiply-adds: a depthwise convolution this short is faster so than as conv1d
        out = full[:, :length] * weight[:, 0]
        for j in range(1, k):
            out = out + full[:, j : j + length] * weight[:, j]
        return (out if bias is None else out + bias), full[:, length:]
    query_docs, last_doc = docs
    full_docs = torch.cat([last_doc[:, None].expand(batch, k - 1), query_docs], dim=1)  # (B, K - 1 + T)
    windows = full.unfold(1, k, 1)  # (B, T, C, K)
    same = full_docs.unfold(1, k, 1) == query_docs[:, :, None]  # (B, T, K): taps in this position's document
    out = torch.einsum("btck,btk,ck->btc", windows, same.to(u.dtype), weight)
    out = out if bias is None else out + bias
    stale = full_docs[:, length:] != query_docs[:, -1:]  # tail entries of an earlier document
    return out, full[:, length:].masked_fill(stale[:, :, None], 0)


def conv_reference(u: Tensor, weight: Tensor, bias: Tensor | None, tail: Tensor | None, docs=None) -> Tensor:
    """:func:`causal_conv`'s output written as a loop over positions and taps (the readable reference)."""
    batch, length, channels = u.shape
    k = weight.size(1)
    tail = u.new_zeros(batch, k - 1, channels) if tail is None else tail
    full = torch.cat([tail, u], dim=1)
    out = []
    for t in range(length):
        acc = u.new_zeros(batch, channels) if bias is None else bias.expand(batch, channels).clone()
        for j in range(k):
            source = t + j  # index into full; position t - (K - 1) + j of the segment
            term = weight[:, j] * full[:, source]
            if docs is not None:
                position = source - (k - 1)
                doc = docs[0][:, position] if position >= 0 else docs[1]
                term = term * (doc == docs[0][:, t]).to(u.dtype)[:, None]
            acc = acc + term
        out.append(acc)
    return torch.stack(out, dim=1)


class GatedConv(nn.Module):
    """The ``conv`` mixer: (B, T, E) -> (B, T, E); its state is the convolution's tail ``(tail,)``."""

    def __init__(self, d_model: int, expand: int, kernel: int) -> None:
        super().__init__()
        inner = expand * d_model
        self.in_proj = nn.Linear(d_model, 2 * inner, bias=False)  # W_u, W_g
        self.conv_weight = nn.Parameter(torch.zeros(inner, kernel))
        self.conv_bias = nn.Parameter(torch.zeros(inner))
        self.out_proj = nn.Linear(inner, d_model, bias=False)
        self.init_own_parameters()

    def init_own_parameters(self) -> None:
        """The convolution's taps normal(0, 1 / kernel) and PyTorch's default for the projections: with the
        model's normal(0, 0.02) the gated product of two small projections all but silences the layer."""
        with torch.no_grad():
            self.in_proj.reset_parameters()
            self.out_proj.reset_parameters()
            self.conv_weight.normal_(0.0, self.conv_weight.size(1) ** -0.5)

    def forward(self, hidden: Tensor, state: tuple | None, docs=None) -> tuple[Tensor, tuple]:
        u, gate = self.in_proj(hidden).chunk(2, dim=-1)  # (B, T, I) each
        conv, tail = causal_conv(u, self.conv_weight, self.conv_bias, None if state is None else state[0], docs)
        return self.out_proj(conv * F.silu(gate)), (tail,)

    def state_shapes(self) -> tuple[tuple[int, ...], ...]:
        """The shape of the state's tail without the batch: (kernel - 1, I)."""
        return ((self.conv_weight.size(1) - 1, self.conv_weight.size(0)),)
