"""What every layer of the stack is (:class:`StackLayer`, :class:`LayerOutput`) and the position-wise feed-forward
that the decoder layer (:class:`~longseq.model.stack.DecoderLayer`) and the mixers' layers end with.  See
:mod:`longseq.model.attention` for the dimension glossary."""

from __future__ import annotations

from typing import ClassVar, NamedTuple, Protocol

from torch import Tensor, nn

from longseq.config.model import ModelConfig
from longseq.model.attention.module import AttentionContext
from longseq.model.block import Dropout, feed_forward_kind, norm_layer
from longseq.model.memory import LayerState, StateContext


class PositionwiseFF(nn.Module):
    """Linear -> activation -> Dropout -> Linear -> Dropout, with residual and a pre- or post-norm.

    ``ff`` names the activation (:data:`~longseq.model.block.FEED_FORWARDS`: ``relu``, the paper's, ``gelu``, or the
    gated ``swiglu`` and ``geglu``, whose first linear is W1 and W3 side by side); ``bias`` False drops every bias
    (the linears' and a LayerNorm's); ``norm`` names the norm (``layernorm`` or ``rmsnorm``)."""

    def __init__(
        self,
        d_model: int,
        d_inner: int,
        dropout: float,
        pre_lnorm: bool,
        eps: float,
        *,
        ff: str = "relu",
        bias: bool = True,
        norm: str = "layernorm",
    ) -> None:
        super().__init__()
        self.pre_lnorm = pre_lnorm
        kind = feed_forward_kind(ff)
        self.core_net = nn.Sequential(
            nn.Linear(d_model, 2 * d_inner if kind.gated else d_inner, bias=bias),  # W1 (W1 and W3 when gated)
            kind.activation(),
            Dropout(dropout),
            nn.Linear(d_inner, d_model, bias=bias),  # W2
            Dropout(dropout),
        )
        self.layer_norm = norm_layer(norm, d_model, eps, bias)

    @classmethod
    def from_config(cls, c: ModelConfig) -> PositionwiseFF:
        """The feed-forward of every layer of ``c``."""
        return cls(c.d_model, c.d_inner, c.dropout, c.pre_lnorm, c.layer_norm_eps, ff=c.ff, bias=c.bias, norm=c.norm)

    def forward(self, hidden: Tensor) -> Tensor:  # (B, T, E) -> (B, T, E)
        if self.pre_lnorm:
            return hidden + self.core_net(self.layer_norm(hidden))
        return self.layer_norm(hidden + self.core_net(hidden))


class LayerOutput(NamedTuple):
    """What a layer of the stack returns: its output, its part of the new memory (an attention layer's keys and
    values of [memory; segment] (B, H, K, D); a recurrent layer's new state, a
    :class:`~longseq.model.memory.LayerState`), the attention mass of every key (B, K) when its context asked
    for it, else None, and a loss of its own to add to the model's in training (a dynamic hourglass's boundary
    predictor), else None."""

    hidden: Tensor
    present: tuple[Tensor, Tensor] | LayerState
    mass: Tensor | None = None
    aux: Tensor | None = None


class StackLayer(Protocol):
    """A layer of :class:`~longseq.model.stack.LayerStack`.  ``attends`` says, for its kind, whether it reads
    [memory; segment] by attention (its context is an :class:`AttentionContext` from the memory step, its
    ``present`` keys and values) or continues a recurrent state (its context is a
    :class:`~longseq.model.memory.StateContext` holding its own state, its ``present`` the new state).  Every layer
    takes the same arguments and ignores what it does not read (a recurrent layer, the relative table and the
    mask).  :meth:`state_fault` says what is wrong with a state passed to it (a memory of another model)."""

    attends: ClassVar[bool]

    def state_fault(self, state: LayerState, batch: int) -> str | None:
        """Why ``state`` cannot be this layer's state for ``batch`` rows, or None when it can."""

    def __call__(
        self,
        hidden: Tensor,
        rel_key,
        r_w_bias: Tensor,
        r_r_bias: Tensor,
        mask,
        context: AttentionContext | StateContext,
    ) -> LayerOutput: ...


def shape_fault(
    what: str, state: LayerState, kind: type, batch: int, *signatures: tuple[tuple[int, ...], ...]
) -> str | None:
    """Why ``state`` is not the state of a layer (``what``) that keeps a ``kind`` of tensors of one of the
    ``signatures`` (their shapes without the batch), or None when it is."""
    if not isinstance(state, kind):
        return f"{what} keeps a {kind.__name__}, not a {type(state).__name__}"
    held = tuple(tuple(t.shape) for t in state.tensors)
    wanted = [tuple((batch, *shape) for shape in signature) for signature in signatures]
    if held in wanted:
        return None
    return f"{what} keeps tensors of shapes {wanted[0]} (batch first), this state holds {held}"
