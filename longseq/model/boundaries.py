"""Where a chunk begins: the boundary predictors of a dynamic hourglass, and the moves between positions and
chunks (selection, smoothing, upsampling).

Dimensions: B batch, T positions of the segment, E width, n chunks of the segment (the most of any row), V
vocabulary.  A boundary ``cuts[b, t]`` says that position t begins a chunk; a chunk is the positions from its
boundary up to the next one.  The decision at t reads positions <= t only, so it is the same whether a text is read
whole or in segments (the predictors carry what they need of the previous segment: its last input and, for the
relative entropy rule, its last entropy).  Some positions begin a chunk whatever the predictor says (``forced``):
the start of a stream and the first position of every document.  With ``max_chunk`` = M > 0 a position also begins
one where the chunk it would continue already holds M positions (:func:`limit_length`; BLT's patcher has this
limit): where the predictor sees nothing to cut (an entropy probe that has not learned yet, a stretch of flat
entropy) the chunks are then M long rather than unbounded.  Each predictor carries the length of its last chunk.

* :class:`Router`, H-Net's dynamic chunking (Hwang, Wang and Gu, 2025): the routing module
  p_t = (1 - cos(W_q x_t, W_k x_{t-1})) / 2 with a boundary where p_t >= 1/2, trained through the smoothing and the
  confidence of the upsampled output (:func:`smooth`, :func:`confidence`) and held near a mean chunk length N by
  the ratio loss (:func:`ratio_loss`).  W_q and W_k start as the identity, as in H-Net.
* :class:`EntropyCut`, the Byte Latent Transformer's entropy patches (Pagnoni et al., 2024): a linear head on the
  level's input (detached: a probe, trained by its own next-token loss, which shapes nothing else) gives the entropy
  H_t of the next-token distribution before position t; a boundary where H_t (``global``) or H_t - H_{t-1}
  (``relative``) exceeds a threshold.  The decision is not learned: the threshold tracks the (1 - 1/N) quantile of
  that score by the pinball loss, so that a boundary falls on 1 position in N on average.  It is stored as a
  fraction of log V (``level``), so that the optimiser moves it at a useful rate.

:func:`smooth` is the upsampler's exponential moving average over the chunks, z_c = P_c zhat_c + (1 - P_c) z_{c-1}
(P_c the boundary probability of chunk c, clamped to [1e-4, 1 - 1e-4] as in H-Net; a forced boundary restarts it),
computed by the decayed scan of :mod:`longseq.model.mixers.linear_scan`; :func:`smooth_reference` is its loop.

:data:`BOUNDARY_PREDICTORS` is the registry of predictors, by the name ``hourglass.boundaries`` gives: each one's
builder and the options it reads.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from longseq.config.model import ModelConfig
from longseq.model.mixers.linear_scan import scan_chunked

CLAMP = 1e-4  # the smoothing's boundary probabilities lie in [CLAMP, 1 - CLAMP] (H-Net's DeChunkLayer)
SMOOTH_CHUNK = 16  # chunks per block of the scan


class Cut(NamedTuple):
    """A predictor's decision over a segment."""

    cuts: Tensor  # (B, T) bool: position t begins a chunk
    probs: Tensor  # (B, T) p_t, the probability of a boundary (1 where forced; the cuts as 0/1 for entropy)
    last_score: Tensor  # (B,) what the next segment reads of the last position (the entropy rule: its entropy)
    aux: Tensor | None  # the predictor's training loss, or None
    run: Tensor  # (B,) int64: the positions of the last chunk up to the segment's last (what the next one carries)


def limit_length(cuts: Tensor, run: Tensor, longest: int) -> tuple[Tensor, Tensor]:
    """The cuts (B, T) with a chunk begun wherever the chunk would otherwise grow past ``longest`` positions (0:
    no limit), and the length of the last chunk through the segment's last position (B,).  ``run`` (B,) is the
    length of the chunk the segment continues (carried from the previous one).  :func:`limit_length_reference`
    is its loop."""
    index = torch.arange(cuts.size(1), device=cuts.device)
    start = torch.where(cuts, index, -run[:, None]).cummax(dim=1).values  # (B, T): where the current chunk began
    distance = index - start  # (B, T): positions since then
    if longest:
        cuts = cuts | ((distance > 0) & (distance % longest == 0))
        distance = distance % longest
    return cuts, distance[:, -1] + 1


def limit_length_reference(cuts: Tensor, run: Tensor, longest: int) -> tuple[Tensor, Tensor]:
    """:func:`limit_length` as its loop, position by position."""
    out, lengths = cuts.clone(), run.clone()
    for b in range(cuts.size(0)):
        for t in range(cuts.size(1)):
            out[b, t] = bool(cuts[b, t]) or lengths[b] == longest > 0
            lengths[b] = 1 if out[b, t] else lengths[b] + 1
    return out, lengths


def ratio_loss(cuts: Tensor, probs: Tensor, target: float) -> Tensor:
    """H-Net's ratio loss N/(N-1) ((N-1) F G + (1-F)(1-G)) with F the fraction of positions cut (no gradient)
    and G the mean boundary probability: 1 when F = G = 1/N, more when the chunks are shorter or longer."""
    n, probs = float(target), _at_least_float32(probs)
    fraction, mean_prob = cuts.to(probs.dtype).mean(), probs.mean()
    return n / (n - 1) * ((n - 1) * fraction * mean_prob + (1 - fraction) * (1 - mean_prob))


class Router(nn.Module):
    """H-Net's routing module (see the module docstring); ``weight`` x the ratio loss is its training loss."""

    def __init__(self, width: int, target: int, weight: float, longest: int = 0) -> None:
        super().__init__()
        self.q_proj = nn.Linear(width, width, bias=False)  # W_q
        self.k_proj = nn.Linear(width, width, bias=False)  # W_k
        self.target, self.weight, self.longest = target, weight, longest

    def init_own_parameters(self) -> None:
        with torch.no_grad():
            self.q_proj.weight.copy_(torch.eye(self.q_proj.weight.size(0)))
            self.k_proj.weight.copy_(torch.eye(self.k_proj.weight.size(0)))

    def forward(self, hidden: Tensor, previous: Tensor, last_score: Tensor, run: Tensor, forced: Tensor, tokens=None):
        """``hidden`` (B, T, E) the level's input, ``previous`` (B, E) the input before the segment's first.  The
        ratio loss reads the router's own cuts; a cut made by the length limit has probability 1, as a forced one."""
        before = torch.cat([previous[:, None], hidden[:, :-1]], dim=1)  # (B, T, E): x_{t-1}
        cos = F.cosine_similarity(self.q_proj(hidden), self.k_proj(before), dim=-1)  # (B, T)
        probs = ((1 - cos) / 2).clamp(0, 1).masked_fill(forced, 1.0)
        cuts = probs >= 0.5
        aux = self.weight * ratio_loss(cuts, probs, self.target) if self.training and self.weight else None
        limited, run = limit_length(cuts, run, self.longest)
        return Cut(limited, probs.masked_fill(limited & ~cuts, 1.0), torch.zeros_like(last_score), aux, run)


class EntropyCut(nn.Module):
    """The entropy rule (see the module docstring): ``rule`` is ``global`` or ``relative``."""

    def __init__(self, width: int, vocab: int, target: int, rule: str, longest: int = 0) -> None:
        super().__init__()
        self.head = nn.Linear(width, vocab)  # the next token after each position
        self.level = nn.Parameter(torch.zeros(()))  # the threshold, as a fraction of log V
        self.scale, self.quantile, self.rule, self.longest = math.log(vocab), 1 - 1 / target, rule, longest

    def init_own_parameters(self) -> None:
        with torch.no_grad():
            self.level.fill_(0.5 if self.rule == "global" else 0.1)

    def forward(self, hidden: Tensor, previous: Tensor, last_score: Tensor, run: Tensor, forced: Tensor, tokens=None):
        """``last_score`` (B,) is the entropy of the previous segment's last position (the relative rule).  The
        threshold's quantile reads the scores alone, not the cuts the length limit adds."""
        inputs = torch.cat([previous[:, None], hidden], dim=1).detach()  # (B, T + 1, E): position t - 1 at t
        log_probs = F.log_softmax(self.head(inputs), dim=-1)  # (B, T + 1, V): the token at t, at index t
        entropy = -(log_probs.exp() * log_probs).sum(-1)[:, :-1].to(hidden.dtype)  # (B, T): H_t
        score = entropy
        if self.rule == "relative":
            score = entropy - torch.cat([last_score[:, None], entropy[:, :-1]], dim=1)  # H_t - H_{t-1}
        threshold = self.level * self.scale
        cuts = (score > threshold) | forced
        aux = None
        if self.training:
            aux = self._loss(log_probs[:, :-1], tokens, score.detach() - threshold, forced)
        cuts, run = limit_length(cuts, run, self.longest)
        return Cut(cuts, cuts.to(hidden.dtype), entropy[:, -1], aux, run)

    def _loss(self, log_probs: Tensor, tokens: Tensor | None, excess: Tensor, forced: Tensor) -> Tensor:
        """The head's next-token loss (where the previous position is known) and the threshold's pinball loss,
        whose gradient vanishes when a fraction 1/N of the scores exceed it."""
        kept = (~forced).to(excess.dtype)
        count = kept.sum().clamp(min=1)
        pinball = torch.maximum(self.quantile * excess, (self.quantile - 1) * excess)
        loss = (pinball * kept).sum() / count
        if tokens is not None:
            nll = -log_probs.gather(-1, tokens[..., None].long()).squeeze(-1)  # (B, T)
            loss = loss + (nll * kept).sum() / count
        return loss


class BoundaryKind(NamedTuple):
    """A boundary predictor: how to build it from a model config (the level's width is ``d_model``), and the
    :class:`~longseq.config.model.HourglassConfig` fields it reads beyond those every hourglass reads
    (``shorten_layers``, ``shorten_factor``: the mean chunk length it aims at, ``boundaries``)."""

    build: Callable[[ModelConfig], nn.Module]
    reads: tuple[str, ...]


BOUNDARY_PREDICTORS: dict[str, BoundaryKind] = {  # the registry; "fixed" (Hourglass's groups of k) is the other choice
    "learned": BoundaryKind(  # residual_proj: H-Net's zero-start residual projection (it held the entropy rule back)
        lambda c: Router(c.d_model, c.hourglass.shorten_factor, c.hourglass.ratio_loss, c.hourglass.max_chunk),
        ("ratio_loss", "residual_proj", "max_chunk"),
    ),
    "entropy": BoundaryKind(
        lambda c: EntropyCut(
            c.d_model, c.vocab_size, c.hourglass.shorten_factor, c.hourglass.entropy_rule, c.hourglass.max_chunk
        ),
        ("entropy_rule", "max_chunk"),
    ),
}


def select_chunks(hidden: Tensor, cuts: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Down-sampling: each row's boundary positions, in order, left-aligned and padded to the most of any row.
    Returns the chunks' inputs (B, n, E), their positions (B, n) (padding: some other position) and the number
    of chunks of every row (B,).  Reads n on the host: the coarse stack's shape depends on it."""
    counts = cuts.sum(dim=1)  # (B,)
    n = int(counts.max()) if cuts.numel() else 0
    order = torch.sort(cuts.to(torch.uint8), dim=1, descending=True, stable=True).indices[:, :n]  # (B, n)
    return hidden.gather(1, order[..., None].expand(-1, -1, hidden.size(-1))), order, counts


def smooth(outputs: Tensor, probs: Tensor, carried: Tensor, starts: Tensor) -> Tensor:
    """The exponential moving average over the chunks' outputs (B, n, E) with their boundary probabilities
    (B, n), from the carried average (B, E); ``starts`` (B, n) restart it (a forced boundary).  Computed in at
    least float32 (in bfloat16, 1 - 1e-4 rounds to 1)."""
    dtype = outputs.dtype
    outputs, probs, carried = (_at_least_float32(x) for x in (outputs, probs, carried))
    p = probs.clamp(CLAMP, 1 - CLAMP).masked_fill(starts, 1.0)
    decay = torch.log1p(-p.masked_fill(starts, 0.0))  # (B, n): log(1 - P_c), 0 where it restarts
    ones = torch.ones_like(p)[..., None, None]  # (B, n, 1, 1): the query and key width of one
    out, _ = scan_chunked(ones, p[..., None, None], outputs[:, :, None], decay[..., None], SMOOTH_CHUNK,
                          carried[:, None, None], starts)  # fmt: skip
    return out[:, :, 0].to(dtype)  # (B, n, E)


def _at_least_float32(x: Tensor) -> Tensor:
    return x.to(torch.promote_types(x.dtype, torch.float32))


def smooth_reference(outputs: Tensor, probs: Tensor, carried: Tensor, starts: Tensor) -> Tensor:
    """:func:`smooth` as its loop, chunk by chunk (the readable reference)."""
    p = probs.clamp(CLAMP, 1 - CLAMP).masked_fill(starts, 1.0)
    average, out = carried, []
    for c in range(outputs.size(1)):
        average = p[:, c, None] * outputs[:, c] + (1 - p[:, c, None]) * average
        out.append(average)
    return torch.stack(out, dim=1) if out else outputs


def upsample(smoothed: Tensor, carried: Tensor, cuts: Tensor) -> tuple[Tensor, Tensor]:
    """Every position's chunk output (B, T, E): the smoothed output of the chunk it lies in, the carried one
    (B, E) before the segment's first boundary; and the average the next segment carries (B, E)."""
    both = torch.cat([carried[:, None], smoothed], dim=1)  # (B, n + 1, E): 0 is the chunk of an earlier segment
    index = cuts.long().cumsum(dim=1)  # (B, T)
    width = both.size(-1)
    last = both.gather(1, index[:, -1:, None].expand(-1, 1, width))[:, 0]
    return both.gather(1, index[..., None].expand(-1, -1, width)), last


def confidence(cut: Cut) -> Tensor:
    """H-Net's straight-through confidence (B, T, 1): 1 in the forward pass, the gradient of
    c_t = p_t (a boundary) or 1 - p_t (none) in the backward pass."""
    c = torch.where(cut.cuts, cut.probs, 1 - cut.probs)
    return (c - c.detach() + 1)[..., None]
