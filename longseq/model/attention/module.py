"""The relative multi-head attention module of Transformer-XL: projections, the chosen kernel, output and
residual.  See :mod:`longseq.model.attention` for the dimension glossary and the score."""

from __future__ import annotations

from dataclasses import replace
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from longseq.model.attention.kernels import (
    GROUPED_KERNELS,
    blocked_attention,
    flex_relative_attention,
    kernel_for,
    key_mass,
    resolve_kernel,
    sdpa_attention,
)
from longseq.model.attention.lowrank import LowRankProjection
from longseq.model.attention.patterns import PatternMask
from longseq.model.attention.reference import attention_probs, content_probs, dense_mask
from longseq.model.block import Dropout, norm_layer
from longseq.model.positions import RelativePositions, Rotation, Shape, position_encoding


class AttentionContext(Protocol):
    """What an attention layer reads from the memory (:mod:`longseq.model.memory.context` implements it for a
    hidden-state memory, cached keys and values, and a ring): one call that projects the segment and puts the
    memory's keys and values before its own."""

    with_mass: bool  # also return the attention mass of every key

    def project(self, project, norm, hidden: Tensor, rotation: Rotation | None = None) -> tuple[Tensor, ...]:
        """Queries (B, H, T, D) of the segment ``hidden`` (B, T, E); keys and values (B, H, K, D) of
        [memory; segment], queries and keys turned by the pass's ``rotation`` (rope; None: as projected); and the
        keys as the memory keeps them.  ``project`` maps (B, L, E) to the three (B, H, L, D)
        (``project(x, queries=False)``: None and the keys and values); ``norm`` is the pre-LayerNorm (None under
        post-LN)."""


class RelativeMultiHeadAttention(nn.Module):
    """Multi-head attention over [memory; segment] with relative positions and a residual + LayerNorm.

    ``pre_lnorm`` normalises the attention input (memory included); otherwise the residual sum is
    normalised (post-LN), as in the paper.  The layer's position encoding is a module of its own (``rel``,
    :mod:`longseq.model.positions`), and its kernel is chosen when it is built and again when it is moved to a
    device (``auto``: :func:`~longseq.model.attention.kernels.resolve_kernel` for its ``pattern``), never per call.
    ``n_kv_head`` < ``n_head`` shares each key/value head among ``n_head / n_kv_head`` query heads (grouped-query
    attention; 1: multi-query); a key/value memory stores the ``n_kv_head`` heads only.  ``qk_norm`` RMS-normalises
    every query and key head (learned scale per channel) before positions are applied.  ``norm`` names the block's
    norm (``layernorm`` or ``rmsnorm``; ``bias`` False: a LayerNorm without bias); ``softcap`` > 0 caps every logit
    at softcap * tanh(logit / softcap) before the mask and softmax, in every kernel that runs it (``sdpa`` has no
    hook for the scores: ``auto`` then chooses ``reference`` for the content family).  With ``lowrank`` (a
    :class:`~longseq.model.attention.lowrank.LowRankProjection`) the keys and values are projected along the
    length (Linformer) and the kernel attends to the projections.  ``qkv_bias`` gives the query, key and value
    projections a bias (Qwen2's), ``out_bias`` the output projection.
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
        n_kv_head: int = 0,
        qk_norm: bool = False,
        norm: str = "layernorm",
        bias: bool = True,
        softcap: float = 0.0,
        qkv_bias: bool = False,
        out_bias: bool = False,
        pattern=None,  # the layer's AttentionPattern (None: full), for ``auto``
        positions: Shape | None = None,  # the encoding's options beyond the heads (rope, t5)
        lowrank: LowRankProjection | None = None,  # Linformer's E and F (its own, or every layer's)
    ) -> None:
        super().__init__()
        self.chunk = chunk
        self.n_head, self.d_head = n_head, d_head
        self.n_kv_head = n_kv_head or n_head
        if n_head % self.n_kv_head:
            raise ValueError(f"n_kv_head={n_kv_head} must divide n_head={n_head}")
        self.pre_lnorm = pre_lnorm
        self.dropatt, self.softcap = dropatt, softcap
        self.kernel_name, self.pattern = kernel, pattern
        self.qkv_net = nn.Linear(d_model, (n_head + 2 * self.n_kv_head) * d_head, bias=qkv_bias)  # W_q, W_{k,E}, W_v
        shape = positions or Shape(d_model, n_head, d_head, max_relative_distance)
        encoding = position_encoding(pos)
        self.rel = encoding(replace(shape, d_model=d_model, n_head=n_head, d_head=d_head))  # W_{k,R}, a table, ...
        self.family = encoding.family
        self.q_norm = nn.RMSNorm(d_head, eps=eps) if qk_norm else None
        self.k_norm = nn.RMSNorm(d_head, eps=eps) if qk_norm else None
        self.lowrank = lowrank  # keys and values projected along the length before the kernel
        self.o_net = nn.Linear(n_head * d_head, d_model, bias=out_bias)
        self.layer_norm = norm_layer(norm, d_model, eps, bias)
        self.drop = Dropout(dropout)
        self._prepare()

    def _prepare(self) -> None:
        """Choose the kernel for the device the weights are on (``auto`` resolved here, once), and the query blocks
        of attention over every key (:func:`plain_chunk`)."""
        device = self.qkv_net.weight.device.type
        name = resolve_kernel(self.kernel_name, device, self.pattern, self.dropatt > 0, self.family, self.softcap > 0)
        self.kernel = kernel_for(name, self.family, self.softcap > 0)
        self.blocked = self.kernel is not flex_relative_attention and self.chunk > 0
        self.plain_chunk = plain_chunk(self.kernel, self.chunk, device)

    def _apply(self, fn, recurse: bool = True):
        super()._apply(fn, recurse)
        self._prepare()  # ``model.to(device)``: the device is known now
        return self

    def relative_keys(self, positions: RelativePositions | Tensor | None) -> Tensor | None:
        """This layer's relative table for ``positions`` ((H, R, D) keys, an (H, R) bias, or None); a tensor is
        taken as an already made table (the evaluation cache); a pass's :class:`Rotation` (rope) is no table."""
        if isinstance(positions, Rotation):
            return None
        if not isinstance(positions, RelativePositions):
            return positions
        return self.rel.table(positions)

    def heads(self, source: Tensor, queries: bool = True) -> tuple[Tensor | None, Tensor, Tensor]:
        """Queries (B, H, L, D), keys and values (B, H_kv, L, D) of every position of ``source`` (B, L, E); with
        ``queries`` False, None and the keys and values only (a memory's positions ask no queries).  A plain
        ``qkv_net`` then multiplies with its key/value rows alone; a wrapped one (PEFT's LoRA, a forward hook) runs
        whole and its queries are dropped."""
        batch, length, _ = source.shape
        q_width, kv_width = self.n_head * self.d_head, self.n_kv_head * self.d_head
        if queries or not self._plain_projection():
            query, key, value = self.qkv_net(source).split((q_width, kv_width, kv_width), dim=-1)
            query = query.view(batch, length, self.n_head, self.d_head).transpose(1, 2) if queries else None
        else:
            bias = None if self.qkv_net.bias is None else self.qkv_net.bias[q_width:]
            query, (key, value) = None, F.linear(source, self.qkv_net.weight[q_width:], bias).split(kv_width, dim=-1)
        key, value = (x.view(batch, length, self.n_kv_head, self.d_head).transpose(1, 2) for x in (key, value))
        if self.q_norm is not None:
            query = None if query is None else self.q_norm(query)
            key = self.k_norm(key)
        return query, key, value

    def _plain_projection(self) -> bool:
        net = self.qkv_net
        return type(net) is nn.Linear and not (net._forward_hooks or net._forward_pre_hooks)

    def _scored(
        self, hidden: Tensor, context: AttentionContext | None, rel_key, grouped: bool = False
    ) -> tuple[Tensor, Tensor, Tensor, tuple[Tensor, Tensor]]:
        """Queries (B, H, T, D) of the segment, keys and values (B, H_kv, K, D) of [memory; segment] as the scores
        see them: turned (rope: by the pass's rotation that the stack gives as ``rel_key``, else at their indices),
        key/value heads shared by groups (kept as ``n_kv_head`` heads with ``grouped``, for a kernel that shares
        them itself); and the keys and values as the memory keeps them."""
        norm, rotation = self.layer_norm if self.pre_lnorm else None, _rotation(rel_key)
        if context is None:  # no memory: the segment alone
            query, key, value = self.heads(hidden if norm is None else norm(hidden))
            kept = key
            if rotation is not None:
                query, key = rotation.queries(query), rotation.scored(key)
        else:
            query, key, value, kept = context.project(self.heads, norm, hidden, rotation)
        if rotation is None:  # called without the stack's: at their indices
            query, key = self.rel.rotate(query, key)
        present = (kept, value)
        if self.n_kv_head != self.n_head and not grouped:
            key, value = _shared(key, self.n_head), _shared(value, self.n_head)
        return query, key, value, present

    @torch.no_grad()
    def probs(self, hidden, rel_key, r_w_bias, r_r_bias, mask, context: AttentionContext | None = None) -> Tensor:
        """The attention probabilities (B, H, T, K) this layer uses for these inputs (the reference, no dropout;
        same arguments as :meth:`forward`, for diagnostics).  A ring context must not be passed: it would grow."""
        if self.lowrank is not None:
            raise ValueError("a low-rank (Linformer) layer attends to mixtures of the keys: it has no map per key")
        query, key, value, _ = self._scored(hidden, context, rel_key)
        table = self.relative_keys(rel_key)
        if self.family == "content":
            return content_probs(query, key, table, dense_mask(mask), self.softcap)
        return attention_probs(query, key, table, r_w_bias, r_r_bias, dense_mask(mask), self.softcap)

    def applied(
        self, hidden, rel_key, r_w_bias, r_r_bias, mask, context: AttentionContext | None = None, rows=None
    ) -> tuple[Tensor, Tensor]:
        """The layer output (B, T, E) computed by the readable reference from its probabilities, and those
        probabilities (B, H, T, K) as applied (after ``dropatt`` in training; with ``rows``, a slice, those
        queries' only), both in the autograd graph: what a caller that returns the attention maps (transformers'
        ``output_attentions``) runs in place of :meth:`forward`'s kernel, so that the maps are the ones the output
        depends on.  Same arguments as :meth:`forward`; a ring context must not be passed (it would grow)."""
        if self.lowrank is not None:
            raise ValueError("a low-rank (Linformer) layer attends to mixtures of the keys: it has no map per key")
        batch, qlen, _ = hidden.shape
        query, key, value, _ = self._scored(hidden, context, rel_key)  # (B, H, T, D), (B, H, K, D)
        table = self.relative_keys(rel_key)
        if self.family == "content":
            probs = content_probs(query, key, table, dense_mask(mask), self.softcap)
        else:
            probs = attention_probs(query, key, table, r_w_bias, r_r_bias, dense_mask(mask), self.softcap)
        probs = F.dropout(probs, self.dropatt, self.training)  # (B, H, T, K)
        kept = probs if rows is None else probs[:, :, rows]
        if rows is not None:  # the rows returned are the rows applied
            probs = torch.cat([probs[:, :, : rows.start], kept, probs[:, :, rows.stop :]], dim=2)
        attn = (probs @ value).transpose(1, 2).reshape(batch, qlen, self.n_head * self.d_head)  # (B, T, H*D)
        out = self.drop(self.o_net(attn))
        return (hidden + out if self.pre_lnorm else self.layer_norm(hidden + out)), kept

    def forward(
        self,
        hidden: Tensor,  # (B, T, E)
        rel_key: RelativePositions | Tensor | Rotation | None,  # positions, the layer's table already made, or rope's
        r_w_bias: Tensor,  # (H, D)
        r_r_bias: Tensor,  # (H, D)
        mask: PatternMask | Tensor,  # the layer's pattern, or a dense causal (T, K) mask
        context: AttentionContext | None = None,  # the memory before the segment (None: none)
    ) -> tuple[Tensor, tuple[Tensor, Tensor], Tensor | None]:
        """Returns the layer output (B, T, E), the keys and values of [memory; segment] (B, H_kv, K, D; the keys as a
        key/value memory keeps them), and with ``context.with_mass`` the attention mass every key received (B, K),
        else None.

        A cached context reuses the memory's keys and values instead of projecting them again (identical
        results: the projection is per position, LayerNorm included).
        """
        batch, qlen, _ = hidden.shape
        table = self.relative_keys(rel_key)  # (H, R, D), (H, R) or None
        grouped = self.kernel in GROUPED_KERNELS and self.lowrank is None  # Linformer's E and F are per query head
        query, key, value, present = self._scored(hidden, context, rel_key, grouped)  # (B, H, T, D), (B, H*, K, D)
        narrows = mask_narrows(mask, qlen, key.size(2))
        chunk = self.chunk if narrows else self.plain_chunk
        if self.lowrank is not None:
            attn = self.lowrank(self.kernel, query, key, value, mask, self.dropatt, self.training, self.softcap)
        elif self.blocked and (narrows or 0 < chunk < qlen):
            attn = blocked_attention(
                self.kernel,
                chunk,
                query,
                key,
                value,
                table,
                r_w_bias,
                r_r_bias,
                mask,
                self.dropatt,
                self.training,
                softcap=self.softcap,
            )
        else:  # one block over every key: the kernel itself
            attn = self.kernel(
                query, key, value, table, r_w_bias, r_r_bias, mask, self.dropatt, self.training, softcap=self.softcap
            )
        attn = attn.transpose(1, 2).reshape(batch, qlen, self.n_head * self.d_head)  # (B, T, H*D)
        out = self.drop(self.o_net(attn))  # (B, T, E)
        out = hidden + out if self.pre_lnorm else self.layer_norm(hidden + out)
        mass = None
        if context is not None and context.with_mass:
            mass = self._mass(query, _shared(key, self.n_head), table, r_w_bias, r_r_bias, dense_mask(mask))
        return out, present, mass

    def _mass(self, query, key, table, r_w_bias, r_r_bias, mask) -> Tensor:
        if self.family == "content":
            return content_probs(query, key, table, mask, self.softcap).sum(dim=(1, 2))
        return key_mass(query, key, table, r_w_bias, r_r_bias, mask, self.softcap)


def _rotation(rel_key) -> Rotation | None:
    """The pass's rotation when the stack gave one in place of the relative positions (rope)."""
    return rel_key if isinstance(rel_key, Rotation) else None


def _shared(heads: Tensor, n_head: int) -> Tensor:
    """(B, H_kv, L, D) key or value heads as (B, H, L, D): each shared by its group of query heads."""
    group = n_head // heads.size(1)
    return heads if group == 1 else heads.repeat_interleave(group, dim=1)


SDPA_CPU_BLOCK = 128  # the fewest queries of a block on the CPU's fused kernel (measured: 64 was 2-3% slower)


def plain_chunk(kernel, chunk: int, device: str) -> int:
    """The query blocks of ``kernel`` when every block reaches every key before it (full causal attention): the
    config's ``chunk`` for the relative kernels; for SDPA none on a GPU (the lower-right causal mask reaches
    FlashAttention whole, which skips the future keys itself) and at least :data:`SDPA_CPU_BLOCK` on a CPU (where
    the mask is made dense, so blocks skip the future keys' tiles)."""
    if kernel is not sdpa_attention or not chunk:
        return chunk
    return 0 if device == "cuda" else max(chunk, SDPA_CPU_BLOCK)


def mask_narrows(mask: PatternMask | Tensor, qlen: int, klen: int) -> bool:
    """Whether the queries of one block reach fewer than all keys (a local pattern over a long memory): then the
    blocked path computes only the keys they reach."""
    return isinstance(mask, PatternMask) and mask.key_range(0, qlen) != (0, klen)
