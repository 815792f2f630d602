"""Compression of evicted memories (Rae et al., 2019, "Compressive Transformers").

States that leave the memory are compressed at rate c, c states into one, and kept in a second,
older memory of ``cmem_len`` slots.  Compression functions:

    mean     average of each group of c states
    max      elementwise maximum of each group
    conv     1-D convolution with kernel = stride = c (d x d x c weights)
    linear   the learned W_m in R^{d x c}: each output channel is a weighted sum of that channel over the c states

The learned compressors are trained with the attention-reconstruction loss: the layer's attention over
the old states and over their compression should agree.  Everything from the main model enters that loss
detached, so only the compressor learns from it, and the compressed memory enters the main model detached.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from longseq.model.block import with_detached_parameters
from longseq.model.memory.policy import Compressed, Reconstruction, Selection


class Compression(nn.Module):
    """The Compressive Transformer's second memory: evicted states compressed at ``rate`` into ``cmem_len`` slots
    per layer, older than the plain memory.  Layers read [compressed; memory]; learned compressors hand the
    stack their attention-reconstruction targets in training (:class:`~longseq.model.memory.policy.Reconstruction`)."""

    def __init__(self, kind: str, rate: int, cmem_len: int, d_model: int, n_layer: int) -> None:
        super().__init__()
        self.rate, self.cmem_len = rate, cmem_len
        self.compressors = nn.ModuleList(Compressor(kind, rate, d_model) for _ in range(n_layer))

    def read(self, step, layer: int, plain: Tensor | None) -> Tensor | None:
        """What layer ``layer`` attends to before the segment: [compressed; plain] (B, C + M, E)."""
        stored = step.layer(layer)
        compressed = None if stored is None else stored.compressed
        if compressed is None or compressed.size(1) == 0:
            return plain
        compressed = compressed.to(plain.dtype if plain is not None else compressed.dtype)
        return compressed if plain is None else torch.cat([compressed, plain], dim=1)  # (B, C + M, E)

    def compress(self, step, inputs: list[Tensor], plain: list[Tensor | None], selection: Selection) -> Compressed:
        """The new compressed memory of every layer: the old one, then the evicted states compressed."""
        out, targets, n_evicted = [], [], selection.n_evicted
        for i, (new, old) in enumerate(zip(inputs, plain)):
            stored = step.layer(i)
            previous = None if stored is None else stored.compressed
            if previous is None:
                previous = new.new_zeros(new.size(0), 0, new.size(2))
            if n_evicted == 0:
                out.append(previous)
                continue
            joined = new if old is None else torch.cat([old, new], dim=1)
            evicted = joined[:, :n_evicted].detach()  # (B, n, E), oldest first
            squeezed = self.compressors[i](evicted)  # (B, n / rate, E)
            if step.training and self.compressors[i].learned:  # scored with layer i's attention by the stack
                targets.append(Reconstruction(i, new, evicted, squeezed))
            out.append(torch.cat([previous, squeezed.detach()], dim=1)[:, -self.cmem_len :])
        return Compressed(tuple(out), tuple(targets))


class CompressionKind(NamedTuple):
    """A compression function, as data: ``learned`` (weights trained by the attention-reconstruction loss) and
    ``needs_whole_groups`` (in training it takes exactly ``rate`` evicted states a group, so the segments and the
    memory must be multiples of the rate, and the segment lengths fixed: ``model.registry.check_lengths``)."""

    learned: bool
    needs_whole_groups: bool


COMPRESSION_FUNCTIONS: dict[str, CompressionKind] = {  # the registry: the one place a function's name meets its needs
    "mean": CompressionKind(learned=False, needs_whole_groups=False),
    "max": CompressionKind(learned=False, needs_whole_groups=False),
    "conv": CompressionKind(learned=True, needs_whole_groups=True),
    "linear": CompressionKind(learned=True, needs_whole_groups=True),
}


class Compressor(nn.Module):
    """(B, n, E) -> (B, ceil(n / c), E).  Training keeps n a multiple of c (the trainer checks tgt_len and
    mem_len); a partial last group, as at the end of an evaluation pass, is pooled or padded with its last state."""

    def __init__(self, kind: str, rate: int, d_model: int) -> None:
        super().__init__()
        self.kind, self.rate = kind, rate
        if kind == "conv":
            self.conv = nn.Conv1d(d_model, d_model, kernel_size=rate, stride=rate)
        elif kind == "linear":
            self.weight = nn.Parameter(torch.full((d_model, rate), 1.0 / rate))  # W_m, starts as mean pooling

    @property
    def learned(self) -> bool:
        return COMPRESSION_FUNCTIONS[self.kind].learned

    def forward(self, states: Tensor) -> Tensor:
        batch, n, d = states.shape
        if self.learned and n % self.rate:  # a short final segment: complete the last group with its last state
            pad = self.rate - n % self.rate
            states = torch.cat([states, states[:, -1:].expand(batch, pad, d)], dim=1)
            n += pad
        if self.kind in ("mean", "max"):
            pool = F.avg_pool1d if self.kind == "mean" else F.max_pool1d
            return pool(states.transpose(1, 2), self.rate, self.rate, ceil_mode=True).transpose(1, 2)
        if self.kind == "conv":
            return self.conv(states.transpose(1, 2)).transpose(1, 2)
        groups = states.view(batch, n // self.rate, self.rate, d)  # (B, n/c, c, E)
        return torch.einsum("bgce,ec->bge", groups, self.weight)


def _content_attention(query: Tensor, states: Tensor, w_k, w_v, n_head: int) -> Tensor:
    """Content-only multi-head attention of ``query`` (B, T, H*D) over ``states`` (B, n, E), keys and values
    projected by ``w_k`` and ``w_v`` (a weight and its bias, or None); with fewer key/value heads than ``n_head``
    (grouped-query attention), each serves its group of query heads."""
    batch, qlen, width = query.shape
    d_head = width // n_head
    group = n_head // (w_k[0].size(0) // d_head)
    key, value = (
        F.linear(states, *w).view(batch, -1, w[0].size(0) // d_head, d_head).transpose(1, 2).repeat_interleave(group, 1)
        for w in (w_k, w_v)
    )  # (B, H, n, D)
    q = query.view(batch, qlen, n_head, d_head).transpose(1, 2)  # (B, H, T, D)
    probs = torch.softmax(q @ key.transpose(-1, -2) / math.sqrt(d_head), dim=-1)
    return probs @ value  # (B, H, T, D)


def reconstruction_loss(attention, hidden: Tensor, old: Tensor, compressed: Tensor) -> Tensor:
    """|| attn(h, old) - attn(h, compressed) ||^2 with the layer's attention weights, all detached but the
    compressed states, so the gradient reaches the compressor only."""
    width, kv_width = attention.n_head * attention.d_head, attention.n_kv_head * attention.d_head
    net = attention.qkv_net
    w_q, w_k, w_v = net.weight.detach().split((width, kv_width, kv_width), dim=0)
    b_q, b_k, b_v = (None,) * 3 if net.bias is None else net.bias.detach().split((width, kv_width, kv_width))

    def prepare(x: Tensor) -> Tensor:
        return with_detached_parameters(attention.layer_norm, x) if attention.pre_lnorm else x

    query = F.linear(prepare(hidden.detach()), w_q, b_q)
    target = _content_attention(query, prepare(old.detach()), (w_k, b_k), (w_v, b_v), attention.n_head)
    approx = _content_attention(query, prepare(compressed), (w_k, b_k), (w_v, b_v), attention.n_head)
    return F.mse_loss(approx, target)
