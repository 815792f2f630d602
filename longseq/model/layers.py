"""The two sub-layers of a Transformer-XL decoder layer: relative attention over [memory; segment], then the
position-wise feed-forward.  See :mod:`longseq.model.attention` for the dimension glossary."""

from __future__ import annotations

from torch import Tensor, nn

from longseq.config.model import ModelConfig
from longseq.model.attention import RelativeMultiHeadAttention
from longseq.model.memory import LayerContext


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


class DecoderLayer(nn.Module):
    """Relative multi-head attention over [memory; segment], then the position-wise feed-forward."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        c = config
        self.dec_attn = RelativeMultiHeadAttention(
            c.d_model,
            c.n_head,
            c.d_head,
            c.dropout,
            c.dropatt,
            c.pre_lnorm,
            c.layer_norm_eps,
            c.attn_impl,
            c.attn_chunk,
            c.positions.pos,
            c.positions.max_relative_distance,
        )
        self.pos_ff = PositionwiseFF(c.d_model, c.d_inner, c.dropout, c.pre_lnorm, c.layer_norm_eps)

    def forward(self, hidden, rel_key, r_w_bias, r_r_bias, mask, context: LayerContext):
        """The layer over ``context`` (its memory or key/value cache); returns the output, the keys and values of
        [memory; segment], and with ``context.with_mass`` the attention mass of every key."""
        hidden, present, mass = self.dec_attn(
            hidden, rel_key, r_w_bias, r_r_bias, mask, context.memory, context.cache, context.with_mass
        )
        return self.pos_ff(hidden), present, mass
