"""The decoder layer and the stack of layers over a recurrence memory, the body of the Transformer-XL backbone (and
of an hourglass's shortened middle): for every layer, read its context from the memory step, run it, record what it
made.  See :mod:`longseq.model.attention` for the dimension glossary."""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from longseq.config.model import ModelConfig
from longseq.model.attention import RelativeMultiHeadAttention
from longseq.model.attention.lowrank import LowRankProjection
from longseq.model.attention.module import AttentionContext
from longseq.model.attention.patterns import (
    AttentionPattern,
    PatternMask,
    global_keys,
    global_positions,
    layer_patterns,
)
from longseq.model.block import Dropout
from longseq.model.dynamic import DynamicHourglass
from longseq.model.hourglass import Hourglass, inner_config
from longseq.model.layers import LayerOutput, PositionwiseFF
from longseq.model.memory import (
    MaskInputs,
    Memory,
    MemoryPolicies,
    MemoryStep,
    Reconstruction,
    Recurrence,
    StateContext,
    StepInputs,
)
from longseq.model.memory.compress import reconstruction_loss
from longseq.model.mixers import MixerLayer
from longseq.model.positions import SHAPE_OPTIONS, RelativePositions, Shape, position_encoding, relative_distances


class DecoderLayer(nn.Module):
    """Relative multi-head attention over [memory; segment], then the position-wise feed-forward."""

    attends = True
    reads = (  # the options only it reads
        "n_head",
        "n_kv_head",
        "qk_norm",
        "d_head",
        "dropatt",
        "attn_impl",
        "attn_chunk",
        "untie_r",
        "uv_init",
        "dropout_r",
        "attn_softcap",
        "qkv_bias",
        "attn_out_bias",
    )

    def __init__(self, config: ModelConfig, pattern=None, lowrank: LowRankProjection | None = None) -> None:
        super().__init__()
        c, shape = config, layer_shape(config)
        self.dec_attn = RelativeMultiHeadAttention(
            d_model=c.d_model,
            n_head=c.n_head,
            d_head=c.d_head,
            dropout=c.dropout,
            dropatt=c.dropatt,
            pre_lnorm=c.pre_lnorm,
            eps=c.layer_norm_eps,
            kernel=c.attn_impl,
            chunk=c.attn_chunk,
            pos=c.positions.pos,
            n_kv_head=c.n_kv_head,
            qk_norm=c.qk_norm,
            pattern=pattern,
            positions=shape,
            norm=c.norm,
            bias=c.bias,
            softcap=c.attn_softcap,
            qkv_bias=c.qkv_bias,
            out_bias=c.attn_out_bias,
            lowrank=lowrank,
        )
        self.pos_ff = PositionwiseFF.from_config(c)

    def forward(self, hidden, rel_key, r_w_bias, r_r_bias, mask, context: AttentionContext) -> LayerOutput:
        """The layer over ``context`` (its memory or key/value cache); returns the output, the keys and values of
        [memory; segment], and with ``context.with_mass`` the attention mass of every key."""
        hidden, present, mass = self.dec_attn(hidden, rel_key, r_w_bias, r_r_bias, mask, context)
        return LayerOutput(self.pos_ff(hidden), present, mass)

    def state_fault(self, state, batch: int) -> str | None:
        if state.attends:  # its shapes: Memory.check
            return None
        return f"an attention layer keeps keys and values (or its inputs), not a {type(state).__name__}"

    def reconstruction_loss(self, target: Reconstruction) -> Tensor:
        """The Compressive Transformer's attention-reconstruction loss of a compressed memory, with this layer's
        attention weights (detached: only the compressor learns from it)."""
        return reconstruction_loss(self.dec_attn, target.hidden, target.old, target.compressed)


def layer_shape(config: ModelConfig) -> Shape:
    """What an attention layer's position encoding is built for (its heads and the encoding's options)."""
    p = config.positions
    return Shape(
        config.d_model,
        config.n_head,
        config.d_head,
        bidirectional=config.pattern.bidirectional,
        **{name: getattr(p, name) for name in SHAPE_OPTIONS},
    )


def build_layers(config: ModelConfig) -> list[nn.Module]:
    """One module per layer of ``config``; an hourglass's shortened layers form one :class:`Hourglass` block."""
    c, layers, patterns = config, [], layer_patterns(config)
    first, end = c.hourglass.shorten_layers or (c.n_layer, c.n_layer)
    shared = projection(c) if c.pattern.lowrank_share == "layerwise" else None  # one module for every layer
    for i, name in enumerate(c.layer_mixers):
        if i == first:
            layers.append((DynamicHourglass if c.hourglass.dynamic else Hourglass)(c, LayerStack(inner_config(c))))
        if first <= i < end:
            continue
        if name == "attention":
            layers.append(DecoderLayer(c, patterns[i], projection(c) if shared is None else shared))
        else:
            layers.append(MixerLayer(name, c, PositionwiseFF.from_config(c)))
    return layers


def projection(config: ModelConfig) -> LowRankProjection | None:
    """An attention layer's Linformer projection (``pattern.lowrank``), or None."""
    p = config.pattern
    return LowRankProjection(config.n_head, p.lowrank, p.lowrank_len, p.lowrank_share) if p.lowrank else None


def outer_patterns(config: ModelConfig) -> list[AttentionPattern | None]:
    """The pattern of every layer :func:`build_layers` makes (None for the hourglass block)."""
    patterns = layer_patterns(config)
    first, end = config.hourglass.shorten_layers or (config.n_layer, config.n_layer)
    return patterns[:first] + ([None] if first < config.n_layer else []) + patterns[end:]


def mask_slots(patterns: list[AttentionPattern | None], attends: tuple[bool, ...]) -> tuple[int | None, ...]:
    """For every layer, the first attending layer with an equal pattern, whose mask it shares (itself for the first
    of its kind); None for a layer that does not attend."""
    attending = [p if a else None for p, a in zip(patterns, attends)]
    return tuple(None if p is None else attending.index(p) for p in attending)


class LayerStack(nn.Module):
    """A stack of layers over a recurrence memory: decoder layers (attention), recurrent layers (ssm, conv, rnn)
    and, with an hourglass, one block that runs its own stack at a shorter resolution.

    u and v (``r_w_bias``, ``r_r_bias``) are (H, D) shared by all layers, or (L, H, D) with ``untie_r``; an
    encoding without them (Shaw's, absolute) has fixed zeros, and a stack without an attention layer has none
    (None): every parameter it holds is read.  Each layer attends with its own pattern.  What the
    layers read from the memory and what is kept of them is the memory policies' business
    (:mod:`longseq.model.memory`); the backbone only hands each layer its context.

    ``activation_checkpointing`` (an execution setting, not architecture; the trainer sets it through the
    architecture's :class:`~longseq.model.spec.ModelSpec`) = k recomputes every k-th layer in the backward pass
    instead of storing its activations (0: off).
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = c = config
        self.activation_checkpointing = 0
        self.drop_r = Dropout(c.dropout if c.dropout_r is None else c.dropout_r)  # on the sinusoidal R
        self.encoding = position_encoding(c.positions.pos)
        self.position_shape = layer_shape(c)  # what a pass's rotation (rope) is computed for, once for all layers
        self.layers = nn.ModuleList(build_layers(c))
        self.attends = tuple(layer.attends for layer in self.layers)  # what the memory step knows of the layers
        bias_shape = (len(self.layers), c.n_head, c.d_head) if c.untie_r else (c.n_head, c.d_head)
        if not any(self.attends):  # no layer reads u and v: none is made (DDP wants a gradient for every parameter)
            self.register_parameter("r_w_bias", None)
            self.register_parameter("r_r_bias", None)
        elif self.encoding.learned_biases:
            self.r_w_bias = nn.Parameter(torch.zeros(bias_shape))  # u
            self.r_r_bias = nn.Parameter(torch.zeros(bias_shape))  # v
        else:  # Shaw: terms (a) and (b) only; absolute: content only
            self.register_buffer("r_w_bias", torch.zeros(bias_shape), persistent=False)
            self.register_buffer("r_r_bias", torch.zeros(bias_shape), persistent=False)
        self.patterns = outer_patterns(c)
        self.mask_slots = mask_slots(self.patterns, self.attends)  # decided here: which layers share a mask
        self.memory = MemoryPolicies(c)

    @property
    def memory_tokens(self) -> Tensor | None:
        """The learned initial memory tokens (n, E), or None without memory tokens."""
        tokens = self.memory.tokens
        return None if tokens is None else tokens.initial

    def open_step(
        self, memory: Memory, batch: int, qlen: int, device, recurrence: Recurrence, doc_ids: Tensor | None = None
    ) -> MemoryStep:
        """The memory step of one forward pass of these layers over a (batch, qlen) segment."""
        self.check_memory(memory, batch)
        given = StepInputs(memory, batch, qlen, recurrence, doc_ids, self.training, device, self.attends)
        return self.memory.begin(given)

    def check_memory(self, memory: Memory, batch: int) -> None:
        """Refuse by name a memory that does not fit these layers and ``batch`` rows (one another model made): one
        state per layer, each of the kind and shapes its layer keeps."""
        c = self.config
        memory.check(len(self.layers), batch, c.d_model, c.n_kv_head or c.n_head, c.d_head)
        for i, (layer, state) in enumerate(zip(self.layers, memory.layers)):
            fault = layer.state_fault(state, batch)
            if fault is not None:
                raise ValueError(
                    f"mems[{i}] does not fit layer {i} of this model: {fault}.  The memory (or cache) was made by "
                    "another model: pass the one this model returned, or none to start afresh"
                )

    def run(
        self,
        step: MemoryStep,
        memory: Memory,
        hidden: Tensor,
        recurrence: Recurrence,
        global_mask: Tensor | None = None,
        layer_outputs: list | None = None,
        tokens: Tensor | None = None,
    ):
        """The layers over ``hidden`` (B, T', E) with the ``step`` opened on ``memory`` for them: returns the output,
        the new memory and the auxiliary loss (or None): the compressors' reconstruction loss and the layers' own
        (a dynamic hourglass's boundary predictor).  An attention layer reads its context from the step; a recurrent
        layer gets its own state from ``memory`` (and the segment's ``tokens`` (B, T), when given), and its new state
        goes to the step's write.  With ``layer_outputs`` (a list), every layer's output (B, T', E) is appended to
        it (``output_hidden_states``)."""
        shape = step.mask_inputs()
        tables = self._tables(step, shape, recurrence, hidden.device)  # one per layer
        masks = self._masks(step, shape, global_mask, hidden.size(0), hidden.device)  # one per layer
        docs = state_docs(shape, memory)
        states, losses, every = {}, [], self.activation_checkpointing if self.training else 0
        for i, layer in enumerate(self.layers):
            if layer.attends:  # its memory (or key/value cache) through the step
                args = (hidden, tables[i], *self._biases(i), masks[i], step.read(i, hidden))
            else:  # its own state
                held = memory.layers[i] if memory.layers else None
                args = (hidden, None, *self._biases(i), None, StateContext(held, docs, recurrence, tokens))
            if every and i % every == 0:  # recomputed in the backward pass, with the same dropout
                out = checkpoint(layer, *args, use_reentrant=False)
            else:
                out = layer(*args)
            if layer.attends:
                step.record(i, out.present, out.mass)
            else:
                states[i] = out.present
            hidden = out.hidden
            if out.aux is not None:
                losses.append(out.aux)
            if layer_outputs is not None:
                layer_outputs.append(hidden)
        hidden, memory, targets = step.write(hidden, states)
        if targets:
            losses.append(torch.stack([self.layers[t.layer].reconstruction_loss(t) for t in targets]).mean())
        return hidden, memory, sum(losses[1:], losses[0]) if losses else None

    def _tables(self, step: MemoryStep, shape: MaskInputs, recurrence: Recurrence, device) -> list:
        """What every layer reads of the relative positions: the positions of this pass, shared (each layer projects
        them inside its own forward); or, for a memory that carries them, the projected tables."""
        if not any(self.attends):
            return [None] * len(self.layers)
        dtype = self.r_w_bias.dtype
        if self.encoding.rotation is not None:  # rope: how this pass's queries and keys turn, for every layer
            return [self._rotation(step, shape, recurrence, dtype, device)] * len(self.layers)
        rows, clamp_len = step.table_rows(), recurrence.clamp_len
        if rows is None:
            return [self._positions(clamp_len, shape.qlen, dtype, device, shape.mlen + shape.qlen + 1)] * len(
                self.layers
            )
        tables = step.carried_tables(clamp_len, dtype)
        if tables is None:
            tables = step.carry_tables(
                self._project(self._positions(clamp_len, shape.qlen, dtype, device, rows)), clamp_len
            )
        return tables

    def _rotation(self, step: MemoryStep, shape: MaskInputs, recurrence: Recurrence, dtype, device):
        """The pass's :class:`~longseq.model.positions.Rotation`: a key/value memory holds its keys turned at their
        positions in the stream where the rotation is the same in every pass, else every key turns at its index."""
        cached = step.caches_keys and self.encoding.caches_turned_keys(self.position_shape)
        where = dict(cached=cached, sinks=shape.sinks, gap=shape.gap, position=shape.position)
        klen = shape.mlen + shape.qlen
        return self.encoding.rotation(
            self.position_shape, shape.qlen, klen, dtype, device, sink_positions=recurrence.sink_positions, **where
        )

    def _biases(self, layer: int) -> tuple[Tensor | None, Tensor | None]:
        if self.r_w_bias is None:  # no layer attends
            return None, None
        if self.config.untie_r:
            return self.r_w_bias[layer], self.r_r_bias[layer]
        return self.r_w_bias, self.r_r_bias

    def _positions(self, clamp_len: int, qlen: int, dtype: torch.dtype, device, rows: int) -> RelativePositions:
        """The relative positions of distances ``rows - 1`` .. 0; a bidirectional model continues down to
        -(qlen - 1) for the later keys of the segment.  Every layer projects them itself."""
        bottom = -(qlen - 1) if self.config.pattern.bidirectional else 0
        distances = relative_distances(rows - 1, clamp_len, device, bottom)
        return self.encoding.positions(distances, self.config.d_model, dtype, self.drop_r)

    def relative_tables(self, klen: int, clamp_len: int = -1, dtype=torch.float32, device=None, qlen: int = 1):
        """Every layer's projected relative table (H, R, D) for ``klen`` keys (R = klen + 1, or klen + qlen with a
        bidirectional model): what a layer multiplies its queries with (tests, diagnostics)."""
        return self._project(self._positions(clamp_len, qlen, dtype, device, klen + 1))

    def _project(self, positions: RelativePositions) -> list[Tensor | None]:
        """Every layer's relative table (H, R, D), projected outside the layers (the key/value memory's cache)."""
        return [layer.dec_attn.relative_keys(positions) if layer.attends else None for layer in self.layers]

    def _masks(
        self, step: MemoryStep, shape: MaskInputs, global_mask: Tensor | None, batch: int, device
    ) -> list[PatternMask | None]:
        """Each attention layer's :class:`PatternMask` (layers with equal patterns share one, as
        :attr:`mask_slots` says); None for the others."""
        if global_mask is not None:
            global_mask = step.wrap_flags(global_mask.to(torch.bool))
        masks: list[PatternMask | None] = []
        for i, slot in enumerate(self.mask_slots):
            if slot is None or slot < i:
                masks.append(None if slot is None else masks[slot])
                continue
            pattern, flags, rows = self.patterns[i], None, None
            if pattern.has_global:
                flags = global_keys(global_mask, pattern.config.num_global, batch, shape.qlen, shape.mlen, device)
                rows = global_positions(global_mask, pattern.config.num_global, batch, shape.qlen, shape.mlen)
            masks.append(
                PatternMask(
                    pattern=pattern,
                    qlen=shape.qlen,
                    mlen=shape.mlen,
                    span=shape.span,
                    query_docs=shape.query_docs,
                    key_docs=shape.key_docs,
                    global_keys=flags,
                    device=device,
                    dropped_keys=shape.dropped_keys,
                    global_rows=rows,
                    sinks=shape.sinks,
                )
            )
        return masks


def state_docs(shape: MaskInputs, memory: Memory) -> tuple[Tensor, Tensor] | None:
    """What a recurrent layer reads of the documents: (document of every position (B, T), document of the last
    position before the segment (B,)), or None when documents are not tracked."""
    if shape.query_docs is None:
        return None
    last = memory.last_doc if memory.last_doc is not None else shape.query_docs[:, 0]  # no ids yet: continue
    return shape.query_docs, last
