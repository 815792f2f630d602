"""The relative multi-head attention module of Transformer-XL: projections, the chosen kernel, output and
residual.  See :mod:`longseq.model.attention` for the dimension glossary and the score."""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor, nn

from longseq.model.attention.kernels import (
    ATTENTION_KERNELS,
    blocked_attention,
    content_attention,
    flex_relative_attention,
    key_mass,
    resolve_kernel,
)
from longseq.model.attention.patterns import PatternMask
from longseq.model.attention.reference import attention_probs, dense_mask
from longseq.model.positions import RelativePositions, position_encoding


class AttentionContext(Protocol):
    """What an attention layer reads from the memory (:mod:`longseq.model.memory.context` implements it for a
    hidden-state memory, cached keys and values, and a ring): one call that projects the segment and puts the
    memory's keys and values before its own."""

    with_mass: bool  # also return the attention mass of every key

    def project(self, project, norm, hidden: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Queries (B, H, T, D) of the segment ``hidden`` (B, T, E); keys and values (B, H, K, D) of
        [memory; segment].  ``project`` maps (B, L, E) to the three (B, H, L, D); ``norm`` is the pre-LayerNorm
        (None under post-LN)."""


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
        *,
        dropout: float = 0.0,
        dropatt: float = 0.0,
        pre_lnorm: bool = False,
        eps: float = 1e-5,
        kernel: str = "auto",
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
        self.encoding = position_encoding(pos)
        self.encoding.setup(self, d_model, max_relative_distance)  # W_{k,R} (r_net), Shaw's table, or nothing
        self.o_net = nn.Linear(n_head * d_head, d_model, bias=False)
        self.layer_norm = nn.LayerNorm(d_model, eps=eps)
        self.drop = nn.Dropout(dropout)

    def relative_keys(self, positions: RelativePositions | Tensor | None) -> Tensor | None:
        """This layer's relative table (H, R, D) for ``positions``; a tensor is taken as an already projected
        table (the evaluation cache), and absolute positions have none."""
        if not isinstance(positions, RelativePositions):
            return positions
        return self.encoding.relative_keys(self, positions)

    def heads(self, source: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Queries, keys and values (B, H, L, D) of every position of ``source`` (B, L, E)."""
        batch, length, _ = source.shape
        width = self.n_head * self.d_head
        query, key, value = self.qkv_net(source).split(width, dim=-1)  # (B, L, H*D) each
        return tuple(x.view(batch, length, self.n_head, self.d_head).transpose(1, 2) for x in (query, key, value))

    def _project(self, hidden: Tensor, context: AttentionContext | None) -> tuple[Tensor, Tensor, Tensor]:
        """Queries (B, H, T, D) of the segment; keys and values (B, H, K, D) of [memory; segment]."""
        norm = self.layer_norm if self.pre_lnorm else None
        if context is None:  # no memory: the segment alone
            return self.heads(hidden if norm is None else norm(hidden))
        return context.project(self.heads, norm, hidden)

    @torch.no_grad()
    def probs(self, hidden, rel_key, r_w_bias, r_r_bias, mask, context: AttentionContext | None = None) -> Tensor:
        """The attention probabilities (B, H, T, K) this layer uses for these inputs (the reference, no dropout;
        same arguments as :meth:`forward`, for diagnostics).  A ring context must not be passed: it would grow."""
        query, key, _ = self._project(hidden, context)
        return attention_probs(query, key, self.relative_keys(rel_key), r_w_bias, r_r_bias, dense_mask(mask))

    def forward(
        self,
        hidden: Tensor,  # (B, T, E)
        rel_key: RelativePositions | Tensor | None,  # positions, or the (H, R, D) table W_R R of distances K .. 0
        r_w_bias: Tensor,  # (H, D)
        r_r_bias: Tensor,  # (H, D)
        mask: PatternMask | Tensor,  # the layer's pattern, or a dense causal (T, K) mask
        context: AttentionContext | None = None,  # the memory before the segment (None: none)
    ) -> tuple[Tensor, tuple[Tensor, Tensor], Tensor | None]:
        """Returns the layer output (B, T, E), the keys and values of [memory; segment] (B, H, K, D), and with
        ``context.with_mass`` the attention mass every key received (B, K), else None.

        A cached context reuses the memory's keys and values instead of projecting them again (identical
        results: the projection is per position, LayerNorm included).
        """
        batch, qlen, _ = hidden.shape
        width = self.n_head * self.d_head
        rel_key = self.relative_keys(rel_key)  # (H, R, D)
        query, key, value = self._project(hidden, context)  # (B, H, T, D), (B, H, K, D) x 2

        if rel_key is None:  # absolute positions: content scores only
            attn = content_attention(query, key, value, mask, self.dropatt, self.training, self.kernel)
        elif (
            name := resolve_kernel(self.kernel, query.device.type, mask, self.training and self.dropatt > 0)
        ) == "flex":
            attn = flex_relative_attention(
                query, key, value, rel_key, r_w_bias, r_r_bias, mask, self.dropatt, self.training
            )
        else:
            kernel = ATTENTION_KERNELS[name]
            attn = blocked_attention(
                kernel, self.chunk, query, key, value, rel_key, r_w_bias, r_r_bias, mask, self.dropatt, self.training
            )  # (B, H, T, D)
        attn = attn.transpose(1, 2).reshape(batch, qlen, width)  # (B, T, H*D)
        out = self.drop(self.o_net(attn))  # (B, T, E)
        out = hidden + out if self.pre_lnorm else self.layer_norm(hidden + out)
        with_mass = context is not None and context.with_mass
        mass = key_mass(query, key, rel_key, r_w_bias, r_r_bias, dense_mask(mask)) if with_mass else None
        return out, (key, value), mass
