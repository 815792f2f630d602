"""Adaptive input embedding (Baevski & Auli, 2019) and adaptive softmax (Grave et al., 2017).

The vocabulary is ordered by frequency and cut at ``cutoffs`` into clusters.  Cluster i has
embedding width ``d_embed // div_val**i`` and a projection to ``d_proj`` (the model width).
The softmax head scores the first cluster's tokens plus one logit per tail cluster; a tail
token's log-probability is ``log p(cluster) + log p(token | cluster)``.  Without cutoffs both
reduce to a plain embedding and a plain softmax.

A ``softcap`` c > 0 caps every logit at c tanh(logit / c) (Gemma 2) before its softmax: with clusters, each
cluster's logits (the head's, its cluster logits included, and each tail's) before that cluster's own softmax, so
p(token) = p(cluster) p(token | cluster) still holds, of capped logits.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from longseq.model.block import softcap


def _upcast(x: Tensor) -> Tensor:
    """Half-precision scores are normalised in float32; float32 and float64 stay as they are."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def _cluster_bounds(vocab_size: int, cutoffs: list[int]) -> list[tuple[int, int]]:
    ends = [0, *cutoffs, vocab_size]
    return list(zip(ends[:-1], ends[1:]))


class AdaptiveEmbedding(nn.Module):
    """Token ids (B, T) -> embeddings (B, T, d_proj), scaled by sqrt(d_proj) as in the paper (``scaled`` False: the
    lookup alone, as Llama's)."""

    def __init__(
        self, vocab_size: int, d_embed: int, d_proj: int, cutoffs: list[int], div_val: int, scaled: bool = True
    ) -> None:
        super().__init__()
        self.d_proj = d_proj
        self.div_val = div_val
        self.bounds = _cluster_bounds(vocab_size, cutoffs)
        self.scale = d_proj**0.5 if scaled else 1.0
        self.emb_layers = nn.ModuleList()
        self.emb_projs = nn.ParameterList()
        if div_val == 1:
            self.emb_layers.append(nn.Embedding(vocab_size, d_embed))
            if d_proj != d_embed:
                self.emb_projs.append(nn.Parameter(torch.empty(d_proj, d_embed)))
        else:
            for i, (lo, hi) in enumerate(self.bounds):
                d_emb_i = d_embed // div_val**i
                self.emb_layers.append(nn.Embedding(hi - lo, d_emb_i))
                self.emb_projs.append(nn.Parameter(torch.empty(d_proj, d_emb_i)))

    def forward(self, input_ids: Tensor) -> Tensor:
        if self.div_val == 1:
            embed = self.emb_layers[0](input_ids)  # (B, T, d_embed)
            if len(self.emb_projs):
                embed = F.linear(embed, self.emb_projs[0])  # (B, T, d_proj)
            return embed * self.scale if self.scale != 1.0 else embed
        flat = input_ids.reshape(-1)  # (N,)
        param = self.emb_projs[0]
        out = torch.zeros(flat.numel(), self.d_proj, dtype=param.dtype, device=param.device)  # (N, d_proj)
        for i, (lo, hi) in enumerate(self.bounds):
            index = ((flat >= lo) & (flat < hi)).nonzero().squeeze(1)
            if index.numel() == 0:
                continue
            embed_i = F.linear(self.emb_layers[i](flat[index] - lo), self.emb_projs[i])
            out = out.index_copy(0, index, embed_i)
        return out.view(*input_ids.shape, self.d_proj) * self.scale


class AdaptiveLogSoftmax(nn.Module):
    """Hidden states (N, d_proj) -> log-probabilities or negative log-likelihoods.

    ``out_projs[i]`` is None where d_proj == d_embed and div_val == 1 (no projection needed).
    Head column ``cutoffs[0] + i - 1`` holds the log-probability of tail cluster i, as in the
    original TensorFlow code and the Hugging Face port.  ``softcap`` > 0 caps the logits (module docstring);
    capped half-precision logits are computed in float32.  ``bias`` False: a plain softmax without a bias per token
    (Llama's ``lm_head``; an adaptive softmax keeps its biases).
    """

    def __init__(
        self,
        vocab_size: int,
        d_embed: int,
        d_proj: int,
        cutoffs: list[int],
        div_val: int,
        softcap: float = 0.0,
        bias: bool = True,
    ) -> None:
        super().__init__()
        self.vocab_size, self.softcap = vocab_size, softcap
        self.div_val = div_val
        self.bounds = _cluster_bounds(vocab_size, cutoffs)
        self.n_clusters = len(cutoffs)
        self.shortlist = self.bounds[0][1]
        if self.n_clusters:
            self.cluster_weight = nn.Parameter(torch.zeros(self.n_clusters, d_embed))
            self.cluster_bias = nn.Parameter(torch.zeros(self.n_clusters))
        self.out_layers = nn.ModuleList()
        projs: list[nn.Parameter | None] = []
        if div_val == 1:
            self.out_layers.append(nn.Linear(d_embed, vocab_size, bias=bias or bool(cutoffs)))
            for _ in self.bounds:
                projs.append(nn.Parameter(torch.empty(d_proj, d_embed)) if d_proj != d_embed else None)
        else:
            for i, (lo, hi) in enumerate(self.bounds):
                d_emb_i = d_embed // div_val**i
                self.out_layers.append(nn.Linear(d_emb_i, hi - lo))
                projs.append(nn.Parameter(torch.empty(d_proj, d_emb_i)))
        self.out_projs = nn.ParameterList(projs)

    def _logits(self, hidden: Tensor, weight: Tensor, bias: Tensor, proj: Tensor | None) -> Tensor:
        if proj is not None:
            hidden = F.linear(hidden, proj.t())  # (N, d_emb_i)
        logits = F.linear(hidden, weight, bias)
        return softcap(_upcast(logits), self.softcap) if self.softcap else logits

    def _cluster_params(self, i: int) -> tuple[Tensor, Tensor, Tensor | None]:
        if self.div_val == 1:
            lo, hi = self.bounds[i]
            layer = self.out_layers[0]
            weight, bias = layer.weight[lo:hi], None if layer.bias is None else layer.bias[lo:hi]
        else:
            weight, bias = self.out_layers[i].weight, self.out_layers[i].bias
        if i == 0 and self.n_clusters:
            weight = torch.cat([weight, self.cluster_weight], dim=0)
            bias = torch.cat([bias, self.cluster_bias], dim=0)
        return weight, bias, self.out_projs[i]

    def _head_log_prob(self, hidden: Tensor) -> Tensor:
        return F.log_softmax(_upcast(self._logits(hidden, *self._cluster_params(0))), dim=-1)  # (N, shortlist + C)

    def logits(self, hidden: Tensor) -> Tensor:
        """Unnormalised logits (N, V); only defined for a plain softmax (no cutoffs)."""
        if self.n_clusters:
            raise ValueError("adaptive softmax has no single logit vector; use log_prob()")
        return self._logits(hidden, *self._cluster_params(0))

    def log_prob(self, hidden: Tensor) -> Tensor:
        """Full log-probabilities (N, V), in float32 or wider."""
        head = self._head_log_prob(hidden)
        if not self.n_clusters:
            return head
        parts = [head[:, : self.shortlist]]
        for i in range(1, len(self.bounds)):
            tail = F.log_softmax(_upcast(self._logits(hidden, *self._cluster_params(i))), dim=-1)
            parts.append(head[:, self.shortlist + i - 1, None] + tail)
        return torch.cat(parts, dim=-1)

    def nll(self, hidden: Tensor, target: Tensor) -> Tensor:
        """Negative log-likelihood (N,) of ``target`` (N,), in float32 or wider; tail clusters only see their tokens."""
        if not self.n_clusters:
            logits = _upcast(self._logits(hidden, *self._cluster_params(0)))
            return F.cross_entropy(logits, target, reduction="none")
        head = self._head_log_prob(hidden)
        nll = head.new_zeros(target.shape)
        for i, (lo, hi) in enumerate(self.bounds):
            index = ((target >= lo) & (target < hi)).nonzero().squeeze(1)
            if index.numel() == 0:
                continue
            target_i = target[index] - lo
            if i == 0:
                logprob = head[index].gather(1, target_i[:, None]).squeeze(1)
            else:
                tail = F.log_softmax(_upcast(self._logits(hidden[index], *self._cluster_params(i))), dim=-1)
                logprob = head[index, self.shortlist + i - 1] + tail.gather(1, target_i[:, None]).squeeze(1)
            nll = nll.index_copy(0, index, -logprob)
        return nll
