"""Layers that are not attention, each carrying its recurrent state in the memory: ``ssm`` (Mamba-2's SSD),
``conv`` (a gated short convolution), ``rnn`` (an LSTM layer), and the linear-attention family with a matrix state
per head, ``linear``, ``performer``, ``retention``, ``gla`` and ``delta`` (:mod:`.linear`).  :class:`MixerLayer`
wraps one with the residual, the norm and the position-wise feed-forward of a decoder layer."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from torch import Tensor, nn

from longseq.config.model import ModelConfig
from longseq.model.block import Dropout, norm_layer
from longseq.model.layers import LayerOutput, shape_fault
from longseq.model.memory import RecurrentState, StateContext
from longseq.model.mixers.conv import GatedConv
from longseq.model.mixers.linear import DeltaNet, GatedLinearAttention, LinearAttention, Performer, Retention
from longseq.model.mixers.rnn import LSTMMixer
from longseq.model.mixers.ssm import Mamba2


class MixerKind(NamedTuple):
    """A mixer: how to build it from a config, the :class:`~longseq.config.model.MixerConfig` fields it reads, and
    the :class:`~longseq.config.model.ModelConfig` fields it shares with attention."""

    build: Callable[[ModelConfig], nn.Module]
    reads: tuple[str, ...]
    shares: tuple[str, ...] = ()


HEADS = ("n_head", "d_head")  # the linear-attention mixers' heads are attention's


MATRIX = ("chunk", "short_conv", "state_bptt")  # what every linear-attention mixer reads (and ``conv_kernel`` if
# ``short_conv`` names it: :func:`~longseq.model.registry.unread_options` asks)


def short_conv(c: ModelConfig, name: str) -> int:
    """The taps of mixer ``name``'s short convolution of q, k and v: 0 unless ``mixers.short_conv`` names it."""
    return c.mixers.conv_kernel if name in c.mixers.short_conv else 0


def matrix_mixer(kind: type, name: str) -> MixerKind:
    """A mixer of the linear-attention family: heads as attention's, chunks of ``chunk`` positions."""
    build = lambda c: kind(c.d_model, c.n_head, c.d_head, c.mixers.chunk, short_conv(c, name))  # noqa: E731
    return MixerKind(build, MATRIX, HEADS)


UNFORGETTING = (*MATRIX, "reset_every", "rotary")  # what linear and performer read


def unforgetting(c: ModelConfig) -> tuple:
    """The arguments of a mixer without decay (linear, performer): heads, chunks, its restarts and rotation."""
    return c.d_model, c.n_head, c.d_head, c.mixers.chunk, c.mixers.reset_every, c.mixers.rotary


MIXERS: dict[str, MixerKind] = {  # the registry; "attention" (the decoder layer) is the other choice of a layer
    "ssm": MixerKind(
        lambda c: Mamba2(
            c.d_model,
            c.mixers.d_state,
            c.mixers.head_dim,
            c.mixers.expand,
            c.mixers.chunk,
            c.mixers.conv_kernel,
            c.layer_norm_eps,
        ),
        ("d_state", "head_dim", "expand", "chunk", "conv_kernel", "state_bptt"),
    ),
    "conv": MixerKind(
        lambda c: GatedConv(c.d_model, c.mixers.expand, c.mixers.conv_kernel), ("expand", "conv_kernel", "state_bptt")
    ),
    "rnn": MixerKind(lambda c: LSTMMixer(c.d_model), ("state_bptt",)),
    "linear": MixerKind(lambda c: LinearAttention(*unforgetting(c), short_conv(c, "linear")), UNFORGETTING, HEADS),
    "performer": MixerKind(
        lambda c: Performer(*unforgetting(c), c.mixers.features, short_conv(c, "performer")),
        (*UNFORGETTING, "features"),
        HEADS,
    ),
    "retention": matrix_mixer(Retention, "retention"),
    "gla": matrix_mixer(GatedLinearAttention, "gla"),
    "delta": matrix_mixer(DeltaNet, "delta"),
}


class MixerLayer(nn.Module):
    """A mixer, then the position-wise feed-forward, each with a residual and a pre- or post-norm (``norm``): the
    decoder layer's shape with the attention replaced.  Called like a decoder layer; its "present" is its part of
    the new memory."""

    attends = False  # its context is its recurrent state

    def __init__(self, name: str, config: ModelConfig, feed_forward: nn.Module) -> None:
        super().__init__()
        self.name, self.pre_lnorm = name, config.pre_lnorm
        self.state_bptt = config.mixers.state_bptt  # > 1: the state keeps its graph in training
        self.mixer = MIXERS[name].build(config)
        self.layer_norm = norm_layer(config.norm, config.d_model, config.layer_norm_eps, config.bias)
        self.drop = Dropout(config.dropout)
        self.pos_ff = feed_forward

    def state_fault(self, state, batch: int) -> str | None:
        return shape_fault(f"the {self.name} mixer", state, RecurrentState, batch, self.mixer.state_shapes())

    def forward(self, hidden: Tensor, rel_key, r_w_bias, r_r_bias, mask, context: StateContext):
        source = self.layer_norm(hidden) if self.pre_lnorm else hidden
        out, state = self.mixer(source, None if context.state is None else context.state.tensors, context.docs)
        out = self.drop(out)
        hidden = hidden + out if self.pre_lnorm else self.layer_norm(hidden + out)
        if not (self.training and self.state_bptt > 1):  # stop-gradient, unless it back-propagates further
            state = tuple(t.detach() for t in state)
        return LayerOutput(self.pos_ff(hidden), RecurrentState(state))
