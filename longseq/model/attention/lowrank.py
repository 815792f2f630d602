"""Linformer's low-rank attention (Wang et al., 2020): a segment's keys and values projected along its length.

    K' = E K,   V' = F V          E, F (k, n) learned: k = ``pattern.lowrank`` rows, n = ``pattern.lowrank_len``
    out = softmax(Q K'^T / sqrt(D)) V'                   every query reads k mixtures of the segment's T keys

so a layer holds (T, k) scores instead of (T, T): memory and time O(T k).  Each column of E and F belongs to a
position; a segment shorter than n uses the first T columns.  The projection mixes positions, so it serves full
attention both ways over one segment (no memory), with positions that survive the mixing: keys rotated before it
(rope), none, or added to the input (absolute); the rest is refused
(:func:`~longseq.model.registry.check_lowrank_patterns_and_positions`).  The kernel after it is the layer's content
kernel (``sdpa`` or the readable ``reference``), over the k projected keys with nothing masked.

Documents (a batch's padding is one: classify and mlm) are projected apart: each document's keys through the
columns counted from its own start, and a query reads its own document's projection, so a document padded on the
left or the right reads as it does alone, and no real token reads filler.  How many documents a segment holds is
read on the host (the projection's shape depends on it), once per forward for all the layers that share a mask.

Sharing (Linformer section 4): ``none`` (E and F per head), ``headwise`` (one E and one F per layer, for all its
heads), ``kv`` (E = F, per layer), ``layerwise`` (one E = F for every layer: the stack hands every layer the same
module, saved once).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from longseq.model.attention.patterns import PatternMask


class LowRankProjection(nn.Module):
    """E (``key_proj``) and F (``value_proj``, absent when shared with E): (P, k, n), P = heads or 1."""

    def __init__(self, heads: int, rows: int, length: int, share: str) -> None:
        super().__init__()
        self.rows, self.length = rows, length
        copies = heads if share == "none" else 1
        self.key_proj = nn.Parameter(torch.empty(copies, rows, length))  # E
        shared = share in ("kv", "layerwise")
        self.value_proj = None if shared else nn.Parameter(torch.empty(copies, rows, length))  # F
        self.init_own_parameters()

    def init_own_parameters(self) -> None:
        """Each (k, n) matrix Xavier-uniform with gain 1/sqrt(2), as fairseq's Linformer: a projected key keeps
        about the scale of one key."""
        with torch.no_grad():
            for matrix in (self.key_proj, self.value_proj):
                for part in () if matrix is None else matrix:
                    nn.init.xavier_uniform_(part, gain=2**-0.5)

    def project(self, x: Tensor, matrix: Tensor, columns: Tensor, groups: Tensor) -> Tensor:
        """x (B, H, K, D) -> (B, H, G, k, D): each document's rows of x through E's columns ``columns`` (B, K),
        ``groups`` (B, K, G) one-hot of each key's document."""
        picked = matrix[:, :, columns]  # (P, k, B, K)
        if matrix.size(0) == 1:
            return torch.einsum("mbj,bjg,bhjd->bhgmd", picked[0], groups, x)
        return torch.einsum("hmbj,bjg,bhjd->bhgmd", picked, groups, x)

    def forward(self, kernel, query: Tensor, key: Tensor, value: Tensor, mask, dropatt: float, training: bool,
                softcap: float = 0.0):  # fmt: skip
        """Attention of queries (B, H, T, D) over the projections of the keys and values (B, H, T, D) of the same
        segment, with the layer's content ``kernel`` (``softcap``: its cap on the scores): (B, H, T, D)."""
        length = key.size(2)
        if length > self.length:
            raise ValueError(
                f"a segment of {length} keys is longer than pattern.lowrank_len={self.length}, the most positions "
                "the low-rank projection takes: read shorter segments (segment_len, tgt_len) or build it longer"
            )
        groups, columns = documents(mask, query.size(0), length, key.device)  # (B, K, G) bool, (B, K)
        weights = groups.to(key.dtype)
        values = self.value_proj if self.value_proj is not None else self.key_proj
        keys, values = self.project(key, self.key_proj, columns, weights), self.project(value, values, columns, weights)
        free, none = unmasked(mask, query, self.rows)
        outs = [kernel(query, keys[:, :, g], values[:, :, g], None, none, none, free, dropatt, training, softcap=softcap)
                for g in range(groups.size(-1))]  # fmt: skip
        if len(outs) == 1:
            return outs[0]
        return sum(out * groups[:, None, :, g, None].to(out.dtype) for g, out in enumerate(outs))  # own document's


def documents(mask: PatternMask | Tensor, batch: int, length: int, device) -> tuple[Tensor, Tensor]:
    """Each key's document (B, K, G), one-hot over the G documents of the segment, and its column: its position
    counted from its document's first key (B, K).  Without documents: one group, columns 0 .. K - 1.  Worked out
    once for the layers that share a :class:`PatternMask` (G, read on the host, included)."""
    if isinstance(mask, Tensor):
        if bool(mask.any()):
            raise ValueError("the low-rank projection serves full attention: a dense mask may forbid no pair")
        return _documents(None, batch, length, device)
    if mask.mlen or mask.global_keys is not None or mask.dropped_keys is not None:
        raise ValueError("the low-rank projection reads one segment: no memory, global tokens or dropped keys")
    return mask.shared(("lowrank", length), lambda: _documents(mask.key_docs, batch, length, device))


def unmasked(mask: PatternMask | Tensor, query: Tensor, rows: int) -> tuple[Tensor, Tensor]:
    """What the content kernel takes beside the projected keys: its mask over the ``rows`` projections of queries
    (B, H, T, D), nothing masked (1, 1, T, k), and the content family's unread u and v (H, D), zeros.  Made once for
    the layers that share a :class:`PatternMask` (every call with a dense mask)."""
    heads, length, d_head = query.size(1), query.size(2), query.size(-1)

    def make() -> tuple[Tensor, Tensor]:
        free = torch.zeros(1, 1, length, rows, dtype=torch.bool, device=query.device)
        return free, query.new_zeros(heads, d_head)

    if isinstance(mask, Tensor):
        return make()
    return mask.shared(("lowrank-unmasked", length, rows, heads, d_head, query.dtype), make)


def _documents(docs: Tensor | None, batch: int, length: int, device) -> tuple[Tensor, Tensor]:
    index = torch.arange(length, device=device)
    if docs is None:
        return torch.ones(batch, length, 1, dtype=torch.bool, device=device), index.expand(batch, length)
    found, group = torch.unique(docs, return_inverse=True)  # the one read on the host: how many documents
    group, count = group.expand(batch, length), found.numel()  # (B, K): 0 .. G - 1, G
    first = torch.full((batch, count), length, dtype=torch.long, device=device)
    first = first.scatter_reduce(1, group, index.expand(batch, length), reduce="amin")  # (B, G)
    return group[..., None] == torch.arange(count, device=device), index - first.gather(1, group)
