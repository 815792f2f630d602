"""The relative multi-head attention module of Transformer-XL: projections, the chosen kernel, output and
residual.  See :mod:`longseq.model.attention` for the dimension glossary and the score."""

from __future__ import annotations

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
from longseq.model.memory.cache import RingKV
from longseq.model.positions import RelativePositions, position_encoding


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

    def _project(self, hidden: Tensor, memory: Tensor | None, cache) -> tuple[Tensor, Tensor, Tensor]:
        """Queries (B, H, T, D) of the segment; keys and values (B, H, K, D) of [memory; segment]."""
        batch, qlen, _ = hidden.shape
        width = self.n_head * self.d_head
        if cache is not None:
            source = self.layer_norm(hidden) if self.pre_lnorm else hidden
            query, key, value = self.qkv_net(source).split(width, dim=-1)  # (B, T, H*D) each
            key = key.view(batch, qlen, self.n_head, self.d_head).transpose(1, 2)
            value = value.view(batch, qlen, self.n_head, self.d_head).transpose(1, 2)
            if isinstance(cache, RingKV):  # ring storage: append in place, read a view
                key, value = cache.extend(key, value)  # (B, H, K, D)
            elif cache and cache[0].size(2):  # () or empty keys: nothing cached yet
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
        cache=None,  # (keys, values) (B, H, M, D) of the memory, () before any, or a RingKV
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
        mass = key_mass(query, key, rel_key, r_w_bias, r_r_bias, dense_mask(mask)) if with_mass else None
        return out, (key, value), mass
