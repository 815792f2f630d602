"""The parts every layer of a block shares, chosen by name: the norm (:data:`NORMS`), the position-wise
feed-forward's activation (:data:`FEED_FORWARDS`), and the soft cap of scores.

* ``norm``: ``layernorm`` (the paper's) or ``rmsnorm`` (Zhang & Sennrich, 2019: x / sqrt(mean(x^2) + eps) * g, no
  centring, no bias; ``torch.nn.RMSNorm``).  A norm module is always named ``layer_norm`` in its layer, so
  checkpoints, the initialisation (weights normal(1, ``init_std``)) and the optimizer's no-decay rule read it the same
  way whichever norm it is.
* ``ff``: ``relu`` (the paper's) and ``gelu`` are W2 act(W1 x); ``swiglu`` and ``geglu`` are the gated units of
  Shazeer (2020), W2 (act(W1 x) * W3 x) with act = SiLU or GELU: W1 and W3 are the two halves of one
  (2 ``d_inner``, ``d_model``) projection, gate first, so ``d_inner`` stays the hidden width (a gated
  feed-forward has 3 ``d_model`` x ``d_inner`` weights instead of 2).
* :func:`softcap`: Gemma 2's c tanh(x / c), which bounds scores to (-c, c) smoothly (attention logits with
  ``attn_softcap``, output logits with ``logit_softcap``).
* :func:`dropout` (and the module :class:`Dropout`): ``F.dropout``, with its mask drawn faster on a CPU.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from longseq.config.base import check_choice


def norm_layer(name: str, width: int, eps: float, bias: bool = True) -> nn.Module:
    """The norm ``name`` (a key of :data:`NORMS`) over the last ``width`` channels; ``bias`` False drops a
    LayerNorm's bias (an RMSNorm has none)."""
    check_choice("norm", name, tuple(NORMS))
    return NORMS[name](width, eps, bias)


NORMS: dict[str, Callable[[int, float, bool], nn.Module]] = {
    "layernorm": lambda width, eps, bias: nn.LayerNorm(width, eps=eps, bias=bias),
    "rmsnorm": lambda width, eps, bias: nn.RMSNorm(width, eps=eps),
}


def with_detached_parameters(norm: nn.LayerNorm | nn.RMSNorm, x: Tensor) -> Tensor:
    """``norm(x)`` with the norm's parameters detached: the gradient reaches ``x`` only."""
    weight = None if norm.weight is None else norm.weight.detach()
    if isinstance(norm, nn.RMSNorm):
        return F.rms_norm(x, norm.normalized_shape, weight, norm.eps)
    bias = None if norm.bias is None else norm.bias.detach()
    return F.layer_norm(x, norm.normalized_shape, weight, bias, norm.eps)


class GatedActivation(nn.Module):
    """act(a) * b for the two halves (a, b) of the last dimension: the gate W1 x and the value W3 x of one
    projection (B, T, 2 F) -> (B, T, F)."""

    def __init__(self, activation: nn.Module) -> None:
        super().__init__()
        self.activation = activation

    def forward(self, projected: Tensor) -> Tensor:
        gate, value = projected.chunk(2, dim=-1)
        return self.activation(gate) * value


class FeedForwardKind(NamedTuple):
    """An activation of the feed-forward: the module, and whether it gates (its first projection is twice as
    wide)."""

    activation: Callable[[], nn.Module]
    gated: bool = False


FEED_FORWARDS: dict[str, FeedForwardKind] = {
    "relu": FeedForwardKind(nn.ReLU),  # not in place: on the view F.linear returns, its backward copied 4 times
    "gelu": FeedForwardKind(nn.GELU),  # the exact (erf) GELU
    "swiglu": FeedForwardKind(lambda: GatedActivation(nn.SiLU()), gated=True),
    "geglu": FeedForwardKind(lambda: GatedActivation(nn.GELU()), gated=True),
}


def feed_forward_kind(name: str) -> FeedForwardKind:
    """The activation ``ff`` names, or a ConfigError naming the close matches."""
    check_choice("ff", name, tuple(FEED_FORWARDS))
    return FEED_FORWARDS[name]


def softcap(scores: Tensor, cap: float) -> Tensor:
    """cap * tanh(scores / cap); a cap of 0 leaves the scores as they are."""
    if not cap:
        return scores
    return cap * torch.tanh(scores / cap)


def masked_softcap(scores: Tensor, cap: float) -> Tensor:
    """:func:`softcap` of scores already masked with -inf, which stay -inf (tanh would make them -cap)."""
    if not cap:
        return scores
    return torch.where(scores == float("-inf"), scores, softcap(scores, cap))


HALF_DTYPES = (torch.bfloat16, torch.float16)


def dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """``F.dropout(x, p, training)``: every element kept with probability 1 - p and scaled by 1 / (1 - p), else 0.

    On a CPU, outside a compiled graph, the mask comes from integer bits (:func:`dropout_noise`; in float32, float64,
    and bfloat16 or float16 as under ``torch.autocast``): PyTorch's CPU ``bernoulli_``
    draws one element at a time unless the processor is Intel's (then MKL's generator serves it), and there it cost
    several times the product it follows (2-3x the float32 time of ``F.dropout`` on an AMD EPYC; 14% of a bf16
    training step).  Elsewhere (CUDA's fused kernel, ``torch.compile``'s own generator) this is ``F.dropout``.
    Both draw from the torch generator, so a seed fixes the masks (they differ from ``F.dropout``'s)."""
    if not training or p == 0:  # evaluation and generation: the input itself, as F.dropout's (no call per layer)
        return x
    fast = x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64, *HALF_DTYPES) and p < 1 - 2**-31
    if not fast or torch.compiler.is_compiling():
        return F.dropout(x, p, training)
    return x * dropout_noise(x, p)


def noise_bits(p: float) -> int:
    """How many uniform bits decide each element of float32 noise for ``p``: 15 where the drop rate they give,
    round(p 2^15) / 2^15, is p to 1e-4 of the smaller of p and 1 - p (0.1, 0.2, 0.25, 0.3, 0.5, 0.9 ...: the keep
    rate, which the kept values' scale 1 / (1 - p) must match, is then right to a relative 1e-4 too), else 31.
    Each 64-bit draw gives four decisions of 15 bits or two of 31; the generator draws one at a time (its cost
    grows with the draws, not with the threads): a million elements' noise took 0.77 ms against 1.46 with 31 bits
    on a 2-core CPU."""
    threshold = round(p * 2**15)
    return 15 if threshold < 2**15 and abs(threshold / 2**15 - p) <= 1e-4 * min(p, 1 - p) else 31


def dropout_noise(like: Tensor, p: float) -> Tensor:
    """The noise of ``F.dropout`` for a float tensor ``like``: 1 / (1 - p) (in its dtype) with probability 1 - p,
    else 0, independently per element.  A bfloat16 or float16 tensor's is float32's, rounded to its dtype (as
    ``F.dropout`` rounds its scale: 1.109375 in bfloat16 for p = 0.1).

    Uniform integers of :func:`noise_bits` bits (four or two per ``random_()`` int64, whose 63 bits are uniform;
    float64: one of 63 bits) decide each element: kept when at least round(p 2^bits), so the keep rate is 1 - p to
    a relative 1e-4 (15 bits) or to 2^-32 (a p within 2^-31 of 1 takes ``F.dropout``).  Integer operations in
    place turn the decision into the bits of 1 / (1 - p) or of 0 (an arithmetic shift of r - threshold gives -1
    where dropped), read as floats without a copy (15-bit decisions are widened to 32 bits once, sign and all)."""
    if like.dtype in HALF_DTYPES:
        return dropout_noise(torch.empty(like.shape, device=like.device), p).to(like.dtype)
    n, wide = like.numel(), like.dtype == torch.float64
    bits = 63 if wide else noise_bits(p)
    draws = torch.empty(-(-n // (64 // (bits + 1))), dtype=torch.int64, device=like.device).random_()
    r = draws.view({63: torch.int64, 31: torch.int32, 15: torch.int16}[bits])[:n].bitwise_and_(2**bits - 1)
    r.sub_(round(p * 2**bits)).bitwise_right_shift_(bits).bitwise_not_()  # all ones where kept, 0 where dropped
    scale = struct.unpack("<q" if wide else "<i", struct.pack("<d" if wide else "<f", 1.0 / (1.0 - p)))[0]  # its bits
    return (r.to(torch.int32) if bits == 15 else r).bitwise_and_(scale).view(like.dtype).view(like.shape)


class Dropout(nn.Dropout):
    """``nn.Dropout`` running :func:`dropout` (the same module otherwise: no parameters, the same repr)."""

    def forward(self, x: Tensor) -> Tensor:
        return F.dropout(x, self.p, self.training, self.inplace) if self.inplace else dropout(x, self.p, self.training)
