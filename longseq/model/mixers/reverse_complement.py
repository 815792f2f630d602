"""Reverse-complement equivariant mixers with parameter sharing, as Caduceus builds them (Schiff et al., 2024),
for encoders of DNA (masked LM, classification: a bidirectional model).

A DNA sequence and its reverse complement are the same molecule read from its two strands.  For hidden states
h (B, T, E) the reverse complement is ``rc(h)``: h flipped along its positions and its channels, which is the
hidden state of the other strand when the embedding is equivariant (Caduceus's RCPS embedding gives the second
half of the channels the first half's embedding of the complement, flipped).  A layer f is RC-equivariant when
``f(rc(h)) = rc(f(h))``.

* :class:`RCPS` (reverse-complement parameter sharing) makes any layer g of width E / 2 so::

      RCPS(g)(h) = concat(g(h[..., :E/2]),  rc(g(rc(h[..., E/2:]))))

  one g, its parameters shared by the two strands;
* :class:`Bidirectional` reads a segment both ways with one layer g, Caduceus's BiMamba with every parameter
  shared (Caduceus ties only the projections)::

      Bi(g)(h) = g(h) + flip(g(flip(h)))   (flip: the positions reversed)

The registered mixers are ``rc_ssm`` = RCPS(Bi(Mamba-2 of width E / 2)), Caduceus's block, and ``rc_conv`` =
RCPS(Bi(the gated convolution of width E / 2)).  Each sees the later positions of its segment, so a causal language
model cannot use it (the model config asks for ``bidirectional=true``: masked LM, classification); it reads one segment at a time, its state an empty (B, 0) tensor (the memory carries nothing of it).
Document ids (masked LM's padding) keep each pass inside its document, in both directions.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


def reverse_complement(hidden: Tensor) -> Tensor:
    """``rc(h)``: (B, T, E) flipped along the positions and the channels."""
    return hidden.flip(-2, -1)


def flip_documents(docs: tuple[Tensor, Tensor] | None) -> tuple[Tensor, Tensor] | None:
    """The document ids of a segment read backwards, numbered again so they rise along it (as a kernel's sequence
    index must): the same positions share a document.  The tail's document is the first position's (no tail)."""
    if docs is None:
        return None
    flipped = docs[0].flip(-1)  # (B, T)
    changes = torch.cat([torch.zeros_like(flipped[:, :1]), (flipped[:, 1:] != flipped[:, :-1]).long()], dim=1)
    rising = changes.cumsum(1)
    return rising, rising[:, 0]


class Bidirectional(nn.Module):
    """``g(h) + flip(g(flip(h)))`` with one layer g (every parameter shared by the two directions); each pass starts
    from no state."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, hidden: Tensor, docs=None) -> Tensor:
        forward, _ = self.inner(hidden, None, docs)
        backward, _ = self.inner(hidden.flip(-2), None, flip_documents(docs))
        return forward + backward.flip(-2)


class RCPS(nn.Module):
    """Reverse-complement parameter sharing of a layer ``inner`` of width E / 2 (called as ``inner(h, docs)``): the
    first half of the channels is the forward strand, the second the reverse strand read forward."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, hidden: Tensor, docs=None) -> Tensor:
        half = hidden.size(-1) // 2
        forward = self.inner(hidden[..., :half], docs)
        reverse = self.inner(reverse_complement(hidden[..., half:]), flip_documents(docs))
        return torch.cat([forward, reverse_complement(reverse)], dim=-1)


class ReverseComplementMixer(nn.Module):
    """A mixer (B, T, E) -> (B, T, E): RCPS of a bidirectional ``inner`` of width E / 2; segment-local, its state
    an empty (B, 0) tensor."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.layer = RCPS(Bidirectional(inner))

    def forward(self, hidden: Tensor, state: tuple | None, docs=None) -> tuple[Tensor, tuple]:
        return self.layer(hidden, docs), (hidden.new_zeros(hidden.size(0), 0),)

    def state_shapes(self) -> tuple[tuple[int, ...], ...]:
        return ((0,),)
