"""Layers that are not attention, each carrying its recurrent state in the memory: ``ssm`` (Mamba-2's SSD),
``conv`` (a gated short convolution), ``rnn`` (an LSTM layer).  :class:`MixerLayer` wraps one with the residual,
the LayerNorm and the position-wise feed-forward of a decoder layer."""

from __future__ import annotations

from torch import Tensor, nn

from longseq.config.model import MIXERS, ModelConfig
from longseq.model.memory import LayerMemory
from longseq.model.mixers.conv import GatedConv
from longseq.model.mixers.rnn import LSTMMixer
from longseq.model.mixers.ssm import Mamba2


def build_mixer(name: str, config: ModelConfig) -> nn.Module:
    m = config.mixers
    if name == "ssm":
        return Mamba2(config.d_model, m.d_state, m.head_dim, m.expand, m.chunk, m.conv_kernel, config.layer_norm_eps)
    if name == "conv":
        return GatedConv(config.d_model, m.expand, m.conv_kernel)
    if name == "rnn":
        return LSTMMixer(config.d_model)
    raise ValueError(f"unknown mixer {name!r}; known: {', '.join(MIXERS)}")


class MixerLayer(nn.Module):
    """A mixer, then the position-wise feed-forward, each with a residual and a pre- or post-LayerNorm: the
    decoder layer's shape with the attention replaced.  Called like a decoder layer; its "present" is its part of the new
    memory."""

    def __init__(self, name: str, config: ModelConfig, feed_forward: nn.Module) -> None:
        super().__init__()
        self.name, self.pre_lnorm = name, config.pre_lnorm
        self.mixer = build_mixer(name, config)
        self.layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.drop = nn.Dropout(config.dropout)
        self.pos_ff = feed_forward

    def forward(self, hidden: Tensor, table, r_w_bias, r_r_bias, mask, context):
        source = self.layer_norm(hidden) if self.pre_lnorm else hidden
        out, state = self.mixer(source, context.state, context.docs)
        out = self.drop(out)
        hidden = hidden + out if self.pre_lnorm else self.layer_norm(hidden + out)
        return self.pos_ff(hidden), LayerMemory(state=state), None
