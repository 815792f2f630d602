"""What every layer of the stack is (:class:`StackLayer`, :class:`LayerOutput`) and the position-wise feed-forward
that the decoder layer (:class:`~longseq.model.stack.DecoderLayer`) and the mixers' layers end with.  See
:mod:`longseq.model.attention` for the dimension glossary."""

from __future__ import annotations

from typing import ClassVar, NamedTuple, Protocol

from torch import Tensor, nn

from longseq.model.attention.module import AttentionContext
from longseq.model.memory import LayerState, StateContext


class PositionwiseFF(nn.Module):
    """Linear -> ReLU -> Dropout -> Linear -> Dropout, with residual and pre- or post-LayerNorm."""

    def __init__(self, d_model: int, d_inner: int, dropout: float, pre_lnorm: bool, eps: float) -> None:
        super().__init__()
        self.pre_lnorm = pre_lnorm
        self.core_net = nn.Sequential(
            nn.Linear(d_model, d_inner),
            nn.ReLU(inplace=True),
            nn.Dropout(dropout),
            nn.Linear(d_inner, d_model),
            nn.Dropout(dropout),
        )
        self.layer_norm = nn.LayerNorm(d_model, eps=eps)

    def forward(self, hidden: Tensor) -> Tensor:  # (B, T, E) -> (B, T, E)
        if self.pre_lnorm:
            return hidden + self.core_net(self.layer_norm(hidden))
        return self.layer_norm(hidden + self.core_net(hidden))


class LayerOutput(NamedTuple):
    """What a layer of the stack returns: its output, its part of the new memory (an attention layer's keys and
    values of [memory; segment] (B, H, K, D); a recurrent layer's new state, a
    :class:`~longseq.model.memory.LayerState`), and the attention mass of every key (B, K) when its context asked
    for it, else None."""

    hidden: Tensor
    present: tuple[Tensor, Tensor] | LayerState
    mass: Tensor | None = None


class StackLayer(Protocol):
    """A layer of :class:`~longseq.model.stack.LayerStack`.  ``attends`` says, for its kind, whether it reads
    [memory; segment] by attention (its context is an :class:`AttentionContext` from the memory step, its
    ``present`` keys and values) or continues a recurrent state (its context is a
    :class:`~longseq.model.memory.StateContext` holding its own state, its ``present`` the new state).  Every layer
    takes the same arguments and ignores what it does not read (a recurrent layer, the relative table and the
    mask)."""

    attends: ClassVar[bool]

    def __call__(
        self,
        hidden: Tensor,
        rel_key,
        r_w_bias: Tensor,
        r_r_bias: Tensor,
        mask,
        context: AttentionContext | StateContext,
    ) -> LayerOutput: ...
