"""The model's typed config: the architecture, in sections for the memory, the attention pattern, positions,
mixers and hourglass.  ``ModelConfig(mem_len=64, window=32)`` takes its sections' fields by name.

Fields that choose an implementation (``pattern.attention``, ``attn_impl``, ``positions.pos``, ``mixer``,
``memory.cmem_fn``, ``hourglass.boundaries``, ``arch``) hold names; the registries that implement them own the names
(:mod:`longseq.model.registry` checks a config against them, when a model is built and before a run starts).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from longseq.config.base import JsonConfig, check, check_choice, check_finite, config

LOWRANK_SHARING = ("none", "headwise", "kv", "layerwise")  # Linformer's sharing of E and F
SINK_POSITIONS = ("cache", "text")  # where rotary positions place the attention sinks (MemoryConfig.sinks)


@config
class MemoryConfig(JsonConfig):
    """The recurrence memory and its compaction policies (:mod:`longseq.model.memory`).

    ``mem_len``: the paper's memory, the last ``mem_len`` layer inputs, stop-gradient.  ``same_length``: every
    query sees exactly the last ``mem_len`` keys.  ``mem_dropout`` hides each memory slot from attention with
    that probability in training (masked, not zeroed).  ``mem_quant="int8"`` stores the memory in 8 bits with a
    scale per row (position) or per channel (``mem_quant_axis``).  ``cmem_len`` > 0 keeps a compressed memory of
    that many slots, made from evicted states at rate ``cmem_rate`` with ``cmem_fn`` (Compressive Transformer).
    ``mem_select="attention"`` keeps, of the old memory, the slots that received the most attention mass.
    ``mem_tokens`` > 0 adds that many memory tokens (Recurrent Memory Transformer), back-propagated through
    ``mem_tokens_bptt`` segments.  ``mem_bptt`` > 1 keeps the gradient through the memory for that many segments
    (truncated back-propagation through time, as an RNN trains; 1: the paper's stop-gradient).  A language-model step
    then reads ``mem_bptt`` consecutive segments, and a classifier back-propagates through a document's last
    ``mem_bptt`` segments.

    ``sinks`` > 0 keeps the first ``sinks`` positions of a stream in the memory for ever beside the last ``mem_len``
    (attention sinks, StreamingLLM: Xiao et al., 2023), visible to every query whatever its pattern.  Where rotary
    positions place them is ``sink_positions``: ``cache`` (StreamingLLM's) puts every key at its slot in the keys a
    pass reads, [sinks; memory; segment], so a sink sits just before the oldest memory slot; ``text`` keeps a sink
    at its position in the text, ever further from the queries as the stream goes on.
    """

    mem_len: int = 64
    same_length: bool = False
    mem_dropout: float = 0.0
    mem_quant: str = "none"
    mem_quant_axis: str = "row"
    cmem_len: int = 0
    cmem_rate: int = 0
    cmem_fn: str = "mean"
    mem_select: str = "recent"
    mem_tokens: int = 0
    mem_tokens_bptt: int = 1
    mem_bptt: int = 1
    sinks: int = 0
    sink_positions: str = "cache"

    def __post_init__(self) -> None:
        check(self.mem_len >= 0, f"memory.mem_len must be >= 0, got {self.mem_len}")
        check(self.sinks >= 0, f"memory.sinks must be >= 0 (0: none), got {self.sinks}")
        check_choice("memory.sink_positions", self.sink_positions, SINK_POSITIONS)

        check(0.0 <= self.mem_dropout < 1.0, f"memory.mem_dropout must be in [0, 1), got {self.mem_dropout}")
        check(self.mem_quant in ("none", "int8"), f"memory.mem_quant must be none or int8, got {self.mem_quant!r}")
        check(
            self.mem_quant_axis in ("row", "channel"),
            f"memory.mem_quant_axis must be row or channel, got {self.mem_quant_axis!r}",
        )
        check(self.cmem_len >= 0 and self.cmem_rate >= 0, "memory.cmem_len and cmem_rate must be >= 0")
        check(
            not self.cmem_len or self.cmem_rate >= 1,
            f"memory.cmem_len={self.cmem_len} needs a compression rate: set cmem_rate >= 1",
        )
        check(
            not self.cmem_rate or self.cmem_len,
            f"memory.cmem_rate={self.cmem_rate} without a compressed memory: set cmem_len >= 1",
        )
        check(
            not self.cmem_len or self.mem_len >= 1,
            "memory.cmem_len needs mem_len >= 1: only states evicted from the memory are compressed",
        )
        check(
            self.mem_select in ("recent", "attention"),
            f"memory.mem_select must be recent or attention, got {self.mem_select!r}",
        )
        check(
            self.mem_select == "recent" or not self.cmem_len,
            "memory.mem_select=attention cannot be combined with a compressed memory (cmem_len > 0)",
        )
        check(self.mem_tokens >= 0, f"memory.mem_tokens must be >= 0, got {self.mem_tokens}")
        check(self.mem_tokens_bptt >= 1, f"memory.mem_tokens_bptt must be >= 1, got {self.mem_tokens_bptt}")
        self._check_bptt()

    def _check_bptt(self) -> None:
        check(self.mem_bptt >= 1, f"memory.mem_bptt must be >= 1, got {self.mem_bptt}")
        if self.mem_bptt > 1:
            check(
                self.mem_len >= 1,
                f"memory.mem_bptt={self.mem_bptt} back-propagates through the memory: set mem_len >= 1",
            )
            check(
                self.mem_quant == "none" and self.mem_select == "recent" and not self.cmem_len,
                f"memory.mem_bptt={self.mem_bptt} needs the memory that carries a gradient: an 8-bit memory "
                "(mem_quant), one selected by attention (mem_select) and a compressed memory (cmem_len) have none",
            )
            check(
                self.mem_tokens_bptt <= self.mem_bptt or not self.mem_tokens,
                f"memory.mem_bptt={self.mem_bptt} is the step's window: mem_tokens_bptt={self.mem_tokens_bptt} "
                "cannot exceed it (the memory would keep its graph as long)",
            )

    @property
    def compacted(self) -> bool:
        """True when a policy beyond plain truncation is on (compression, 8 bits, selection, memory tokens)."""
        return self.cmem_len > 0 or self.mem_quant != "none" or self.mem_select != "recent" or self.mem_tokens > 0


@config
class PatternConfig(JsonConfig):
    """Attention patterns (:mod:`longseq.model.attention.patterns`): ``attention`` names one pattern for every
    layer or one per layer, with the parameters ``window``, ``dilation`` (one value, or one per head),
    ``stride``, ``block_size``, ``block_summary``, ``num_global``, ``num_random_blocks`` and ``pattern_seed``.
    ``bidirectional`` makes every pattern two-sided (encoders: masked LM, classification).

    ``lowrank`` > 0 (Linformer, Wang et al., 2020) projects each attention layer's keys and values along the
    length to ``lowrank`` rows with learned (``lowrank``, ``lowrank_len``) matrices E and F, ``lowrank_len`` the
    longest segment they take; ``lowrank_share`` is Linformer's sharing: ``none`` (E and F per head),
    ``headwise`` (per layer), ``kv`` (E = F, per layer) or ``layerwise`` (one E for every layer).  It serves
    bidirectional full attention without memory (classify, mlm)."""

    attention: list[str] = field(default_factory=lambda: ["full"])
    bidirectional: bool = False
    lowrank: int = 0
    lowrank_len: int = 0
    lowrank_share: str = "none"
    window: int = 256
    dilation: list[int] = field(default_factory=lambda: [1])
    stride: int = 128
    block_size: int = 64
    block_summary: int = 1
    num_global: int = 0
    num_random_blocks: int = 0
    pattern_seed: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.attention, str):
            self.attention = self.attention.split(",")
        if isinstance(self.dilation, int):
            self.dilation = [self.dilation]
        check_choice("pattern.lowrank_share", self.lowrank_share, LOWRANK_SHARING)
        check(self.lowrank >= 0, f"pattern.lowrank must be >= 0 (0: off), got {self.lowrank}")
        check(
            not self.lowrank or self.lowrank <= self.lowrank_len,
            f"pattern.lowrank={self.lowrank} projects keys of segments of up to pattern.lowrank_len positions, which "
            f"must be at least as many (got lowrank_len={self.lowrank_len}); set it to the segment length",
        )
        self.attention = [a.strip() for a in self.attention if a.strip()]
        self.dilation = list(self.dilation)
        check(bool(self.attention), "pattern.attention needs at least one pattern name")
        check_pattern(self.window, self.dilation, self.stride, self.block_size, self.block_summary)
        check(self.num_global >= 0 and self.num_random_blocks >= 0, "num_global and num_random_blocks must be >= 0")


def check_pattern(window: int, dilation, stride: int, block_size: int, block_summary: int) -> None:
    """The parameter ranges every pattern relies on (the predicates in :mod:`longseq.model.attention.patterns`
    read them from this config)."""
    check(window >= 1, f"attention window must be >= 1 key, got window={window}")
    check(
        bool(dilation) and all(d >= 1 for d in dilation),
        f"dilation must be >= 1 for every head, got {list(dilation)}: "
        "a dilation of 0 or less leaves a query nothing to attend to",
    )
    check(stride >= 1, f"stride must be >= 1, got {stride}")
    check(block_size >= 1, f"block_size must be >= 1, got {block_size}")
    check(
        1 <= block_summary <= block_size, f"block_summary must be in [1, block_size={block_size}], got {block_summary}"
    )


ROPE_SCALINGS = ("none", "linear", "ntk", "dynamic", "llama3", "yarn")  # longseq.model.positions.ROPE_SCALINGS's


@config
class PositionConfig(JsonConfig):
    """Position encodings (:mod:`longseq.model.positions`): ``pos`` is ``sinusoidal`` (the paper's R with u and
    v), ``shaw`` (Shaw et al.'s clipped learned table, ``max_relative_distance`` entries each way, no u, v),
    ``rope`` (rotary, base ``rope_theta``), ``alibi``, ``t5`` (``t5_buckets`` learned biases per head, log-spaced up
    to ``max_relative_distance``), ``nope`` (none) or ``absolute`` (the vanilla Transformer: sinusoidal positions
    added to the input, no memory).  ``clamp_len`` > 0 clamps relative distances (not read by rope and nope).

    ``rope_scaling`` stretches rope by ``rope_factor``: ``linear`` (position interpolation) and ``ntk`` (the base
    rescaled) for longer evaluation memories, and transformers' kinds as pretrained Llama-family models set them:
    ``dynamic`` (the base rescaled for a window of more keys than ``rope_original_len``), ``llama3`` (Llama 3.1's
    bands, ``rope_low_freq_factor`` and ``rope_high_freq_factor`` of ``rope_original_len``) and ``yarn`` (YaRN:
    ramps between ``rope_beta_fast`` and ``rope_beta_slow`` rotations over ``rope_original_len``, ``rope_truncate``
    rounding the ramp's ends; cos and sin times ``rope_attention_factor``, 0: 0.1 ln(factor) + 1)."""

    pos: str = "sinusoidal"
    clamp_len: int = -1
    max_relative_distance: int = 64
    rope_theta: float = 10000.0
    rope_scaling: str = "none"
    rope_factor: float = 1.0
    rope_original_len: int = 0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_beta_fast: float = 32.0
    rope_beta_slow: float = 1.0
    rope_attention_factor: float = 0.0
    rope_truncate: bool = True
    t5_buckets: int = 32

    def __post_init__(self) -> None:
        check(
            self.pos not in ("shaw", "t5") or self.max_relative_distance >= 1,
            f"positions.max_relative_distance must be >= 1 with pos={self.pos}, got {self.max_relative_distance}",
        )
        check(self.rope_theta > 0, f"positions.rope_theta must be > 0, got {self.rope_theta}")
        check_choice("positions.rope_scaling", self.rope_scaling, ROPE_SCALINGS)
        check(self.rope_factor >= 1.0, f"positions.rope_factor must be >= 1 (1: no scaling), got {self.rope_factor}")
        check(
            self.rope_factor == 1.0 or self.rope_scaling != "none",
            f"positions.rope_factor={self.rope_factor} is read through a rope_scaling (of pos=rope), and "
            "rope_scaling=none reads none: set rope_scaling=linear or ntk (a memory longer than trained), or dynamic, "
            "llama3 or yarn with rope_original_len; or leave rope_factor at 1",
        )
        check(
            self.rope_scaling not in ("dynamic", "llama3", "yarn") or self.rope_original_len >= 1,
            f"positions.rope_scaling={self.rope_scaling} scales from the context trained before it: set "
            f"rope_original_len >= 1 (got {self.rope_original_len})",
        )
        check(
            self.rope_high_freq_factor > self.rope_low_freq_factor > 0,
            f"positions.rope_high_freq_factor ({self.rope_high_freq_factor}) must exceed rope_low_freq_factor "
            f"({self.rope_low_freq_factor}) > 0",
        )
        check(
            self.rope_beta_fast > 0 and self.rope_beta_slow > 0 and self.rope_attention_factor >= 0,
            "positions.rope_beta_fast and rope_beta_slow must be > 0, rope_attention_factor >= 0 (0: YaRN's default)",
        )
        check(self.t5_buckets >= 2, f"positions.t5_buckets must be >= 2, got {self.t5_buckets}")


LINEAR_FAMILY = ("linear", "performer", "retention", "gla", "delta")  # the mixers with a matrix state
BIDIRECTIONAL_MIXERS = ("rc_ssm", "rc_conv")  # mixers that read both ways (model/mixers/reverse_complement.py)
SHORT_CONV = ["delta"]  # mixers.short_conv's default: fla's DeltaNet has the convolution, its GLA not


@config
class MixerConfig(JsonConfig):
    """The layers that are not attention (:mod:`longseq.model.mixers`).  ``ssm``: a selective state-space layer
    (Mamba-2's SSD: ``d_state`` per head of ``head_dim`` channels, ``expand`` x d_model inner width, chunks of
    ``chunk`` positions); ``conv``: a gated causal depthwise convolution of ``conv_kernel`` taps (the SSM's own
    short convolution has the same width); ``rnn``: an LSTM layer; ``linear``, ``performer``, ``retention``, ``gla``,
    ``delta``: the linear-attention family, ``n_head`` heads of ``d_head`` as attention's, a matrix state per head,
    chunks of ``chunk`` positions, ``features`` random features for the performer; the two without decay
    (``linear``, ``performer``) restart their state every ``reset_every`` positions (0: never; unbounded, their
    average over the whole stream learns no more than a bigram) and with ``rotary`` rotate their numerator by
    position (RoFormer).  ``short_conv`` names the members of the family whose q, k and v pass a causal depthwise
    convolution of ``conv_kernel`` taps and a silu (fla's ShortConvolution) before their feature maps; DeltaNet's
    authors and fla use one by default.  Their recurrent states are part of the memory; ``state_bptt`` > 1
    back-propagates through that many segments (1: stop-gradient, like the XL memory)."""

    d_state: int = 16
    head_dim: int = 32
    expand: int = 2
    chunk: int = 64
    conv_kernel: int = 4
    features: int = 64
    reset_every: int = 64
    rotary: bool = True
    short_conv: list[str] = field(default_factory=lambda: list(SHORT_CONV))
    state_bptt: int = 1

    def __post_init__(self) -> None:
        names = self.short_conv.split(",") if isinstance(self.short_conv, str) else self.short_conv
        names = [name.strip() for name in names if name.strip()]
        self.short_conv = [] if [n.lower() for n in names] == ["none"] else names
        for name in self.short_conv:
            check_choice("mixers.short_conv", name, LINEAR_FAMILY)
        for name in ("d_state", "head_dim", "expand", "chunk", "conv_kernel", "features", "state_bptt"):
            check(getattr(self, name) >= 1, f"mixers.{name} must be >= 1, got {getattr(self, name)}")
        check(self.reset_every >= 0, f"mixers.reset_every must be >= 0 (0: never), got {self.reset_every}")


@config
class HourglassConfig(JsonConfig):
    """Multi-resolution: layers ``shorten_layers[0]`` .. ``shorten_layers[1] - 1`` run on a shortened sequence,
    with their own XL memory; an upsampling step with a residual link brings back full resolution for the layers
    after.  Empty ``shorten_layers``: one resolution.

    ``boundaries`` chooses where the sequence is cut:

    * ``fixed``: the hourglass of Nawrot et al. (2021): groups of ``shorten_factor`` positions (a causal shift,
      then ``shorten_fn`` = linear or mean pooling of each group);
    * ``learned``: H-Net's dynamic chunking (Hwang, Wang and Gu, 2025): a routing module cuts where adjacent states
      differ, ``ratio_loss`` weighs the loss that holds the mean chunk length near ``shorten_factor`` (0.3: H-Net's
      0.03 leaves a small model's chunks 20-40% short of the target after hundreds of steps, docs/mixers.md; like
      H-Net's per device, it is each gradient-accumulation chunk's and rank's own, not the whole batch's);
    * ``entropy``: the Byte Latent Transformer's entropy patches (Pagnoni et al., 2024): a cut where the next-byte
      entropy rises (``entropy_rule=relative``, the default) or is high (``global``), its threshold tracking the
      quantile that gives chunks of ``shorten_factor`` positions on average in training (the global threshold,
      learned on entropies raised by dropout, cuts less at evaluation).

    With ``learned`` and ``entropy`` the shortened layers are attention layers whose memory holds ``mem_len``
    chunks (one slot per chunk).  With ``learned``, ``residual_proj`` passes the block's input to its output through
    a linear map that starts at zero (H-Net's; false: the input itself, as in the configs stored before the option).
    ``max_chunk`` > 0 (``learned`` and ``entropy``) bounds a chunk's length: a position begins a chunk wherever the
    chunk would otherwise grow past it (BLT's maximum patch length), so that text whose entropy is flat is still cut
    (0: no bound; at least ``shorten_factor`` otherwise).
    ``coarse_mem_len`` > 0 sets the shortened layers' memory apart from ``mem_len`` (in groups or chunks; 0: as
    above): an evaluation at another ``mem_len`` moves it in proportion (:meth:`ModelConfig.coarse_mem`)."""

    shorten_layers: list[int] = field(default_factory=list)
    shorten_factor: int = 2
    shorten_fn: str = "linear"
    boundaries: str = "fixed"
    ratio_loss: float = 0.3
    entropy_rule: str = "relative"
    residual_proj: bool = True
    coarse_mem_len: int = 0
    max_chunk: int = 0

    def __post_init__(self) -> None:
        check(
            not self.shorten_layers
            or (len(self.shorten_layers) == 2 and 0 < self.shorten_layers[0] < self.shorten_layers[1]),
            f"hourglass.shorten_layers needs two layer indices 0 < first < end (the shortened layers are first .. "
            f"end - 1; the first and the last layers run at full resolution), got {self.shorten_layers}",
        )
        check(
            self.shorten_factor >= 2 or not self.shorten_layers,
            f"shorten_factor must be >= 2, got {self.shorten_factor}",
        )
        check(self.shorten_fn in ("linear", "mean"), f"shorten_fn must be linear or mean, got {self.shorten_fn!r}")
        check(
            self.boundaries == "fixed" or bool(self.shorten_layers),
            f"hourglass.boundaries={self.boundaries} chooses where the shortened layers cut the sequence: set "
            "shorten_layers=first,end (the layers that run on chunks)",
        )
        check(self.ratio_loss >= 0, f"hourglass.ratio_loss must be >= 0, got {self.ratio_loss}")
        check(self.coarse_mem_len >= 0, f"hourglass.coarse_mem_len must be >= 0, got {self.coarse_mem_len}")
        check(
            self.max_chunk == 0 or self.max_chunk >= self.shorten_factor,
            f"hourglass.max_chunk bounds a chunk's length: 0 (no bound) or at least the mean it aims at, "
            f"shorten_factor={self.shorten_factor}; got {self.max_chunk}",
        )
        check(
            self.entropy_rule in ("global", "relative"),
            f"hourglass.entropy_rule must be global or relative, got {self.entropy_rule!r}",
        )

    @property
    def dynamic(self) -> bool:
        """True when a boundary predictor chooses the chunks (``learned``, ``entropy``)."""
        return bool(self.shorten_layers) and self.boundaries != "fixed"


@dataclass(frozen=True)
class Recurrence:
    """How one call reads and writes the memory: ``mem_len`` positions kept, relative distances clamped to
    ``clamp_len`` (<= 0: no clamp), and with ``same_length`` every query sees exactly the last ``mem_len`` keys;
    ``sinks``: the first positions of the stream kept beside them, seen by every query, and ``sink_positions`` where
    rotary positions place them (:class:`MemoryConfig`).  A model's own is :meth:`ModelConfig.recurrence`;
    evaluation and generation may use another (a longer memory than in training, attention sinks)."""

    mem_len: int
    clamp_len: int = -1
    same_length: bool = False
    sinks: int = 0
    sink_positions: str = "cache"

    def __post_init__(self) -> None:
        if self.mem_len < 0:
            raise ValueError(f"mem_len must be >= 0, got {self.mem_len}")
        if self.sinks < 0:
            raise ValueError(f"sinks must be >= 0 (0: none), got {self.sinks}")
        if self.sink_positions not in SINK_POSITIONS:
            raise ValueError(f"sink_positions must be one of {', '.join(SINK_POSITIONS)}, got {self.sink_positions!r}")


FLOAT32_MAX = 3.4028234663852886e38  # torch.finfo(torch.float32).max; the config package does not import torch
FLOAT16_MAX = 65504.0  # torch.finfo(torch.float16).max (bfloat16's, 3.39e38, is float32's order)


def check_cap_fits(name: str, cap: float, dtype: str, largest: float) -> None:
    """A soft cap c (``c * tanh(x / c)``) must be a number of the ``dtype`` the scores are capped in: a larger one
    is infinite there, and inf * tanh(x / inf) = inf * 0 is NaN in every score."""
    check(
        cap <= largest,
        f"{name}={cap:g} is beyond {dtype}'s largest number ({largest:g}): c * tanh(x / c) in {dtype} is NaN for "
        "every score (inf * 0), which would show up only as a NaN loss. A cap that large caps nothing: use 0 for no "
        "cap, or one near the scores' scale (Gemma 2: 50 for attention, 30 for the output logits)",
    )


@config
class ModelConfig(JsonConfig):
    """Transformer-XL architecture (Dai et al., 2019), with its ``memory``, ``pattern`` and ``positions``.

    ``cutoffs`` switch on the adaptive input embedding and adaptive softmax; ``div_val`` shrinks each tail
    cluster's embedding by that factor.  ``tie_projs[i]`` ties the softmax projection of cluster ``i`` to the
    embedding's (default: all but the head cluster when ``div_val > 1``, as in the paper).  ``attn_impl`` names
    the attention kernel: ``rel_shift`` (the fast path), ``flex`` (PyTorch's FlexAttention, compiled on CUDA; no
    attention dropout), ``reference`` (readable), or ``auto`` (the default: ``flex`` on CUDA for full and local
    patterns when PyTorch has it and no attention dropout is trained, ``rel_shift`` otherwise);
    ``attn_chunk`` processes queries in blocks of that size (0: all at once), which is exact, faster on CPU and
    linear in length for local and sparse patterns.
    ``dropout_r`` is the dropout on the sinusoidal R (unset: ``dropout``, as in the paper's code); ``uv_init`` starts
    u and v at normal(0, ``init_std``) or at zeros.

    The block (:mod:`longseq.model.block`): ``norm`` is ``layernorm`` (the paper's) or ``rmsnorm``, in every layer
    (``pre_lnorm``: before each sub-layer, else after the residual sum), and with ``final_norm`` once more after the
    last layer (as a pre-norm stack usually ends); ``ff`` is the feed-forward's activation, ``relu`` (the paper's),
    ``gelu``, or the gated ``swiglu`` and ``geglu`` (Shazeer, 2020; ``d_inner`` stays the hidden width); ``bias`` False
    drops the biases of the feed-forward's linears and of the norms; attention's projections have biases with
    ``qkv_bias`` (queries, keys and values: Qwen2) and ``attn_out_bias`` (its output), the softmax with
    ``head_bias``.  ``embed_scale`` multiplies the embedding by sqrt(d_model) (the paper's; false: the lookup alone,
    as Llama's).
    ``attn_softcap`` > 0 caps every attention logit at c tanh(x / c) before the mask and softmax (Gemma 2; not on the
    SDPA kernel, which has no hook for the scores), ``logit_softcap`` > 0 the output logits (with an adaptive softmax,
    each cluster's logits before its own softmax).

    ``arch="lstm"`` is the LSTM baseline (``n_layer`` LSTM layers of width ``d_model``).  ``vocab_size=0`` means
    "from the tokenizer": training sets it (presets use it, so ``cutoffs`` are checked against the real vocabulary).
    """

    vocab_size: int = 256
    n_layer: int = 4
    d_model: int = 128
    n_head: int = 4
    n_kv_head: int = 0
    qk_norm: bool = False
    d_head: int = 32
    d_inner: int = 512
    dropout: float = 0.1
    dropatt: float = 0.0
    dropout_r: float | None = None
    pre_lnorm: bool = False
    norm: str = "layernorm"
    ff: str = "relu"
    bias: bool = True
    qkv_bias: bool = False
    attn_out_bias: bool = False
    head_bias: bool = True
    embed_scale: bool = True
    final_norm: bool = False
    attn_softcap: float = 0.0
    logit_softcap: float = 0.0
    cutoffs: list[int] = field(default_factory=list)
    div_val: int = 1
    d_embed: int | None = None
    tie_weight: bool = True
    tie_projs: list[bool] | None = None
    untie_r: bool = False
    init_std: float = 0.02
    proj_init_std: float = 0.01
    uv_init: str = "normal"
    layer_norm_eps: float = 1e-5
    attn_impl: str = "auto"
    attn_chunk: int = 64
    arch: str = "transformer"
    mixer: list[str] = field(default_factory=lambda: ["attention"])
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    pattern: PatternConfig = field(default_factory=PatternConfig)
    positions: PositionConfig = field(default_factory=PositionConfig)
    mixers: MixerConfig = field(default_factory=MixerConfig)
    hourglass: HourglassConfig = field(default_factory=HourglassConfig)

    @property
    def effective_range(self) -> int:
        """Temporal range of the memory: (mem_len + cmem_rate * cmem_len) * n_layer (Rae et al., 2019)."""
        m = self.memory
        return (m.mem_len + m.cmem_rate * m.cmem_len) * self.n_layer

    def coarse_mem(self, mem_len: int | None = None) -> int:
        """Slots of an hourglass's shortened layers' memory (groups for fixed boundaries, chunks for learned and
        entropy) when the stack's memory holds ``mem_len`` positions (default: ``memory.mem_len``):
        ``hourglass.coarse_mem_len`` at the configured mem_len and in proportion at another; without it,
        mem_len // shorten_factor groups (fixed: the same span as the full-resolution memory) or mem_len chunks."""
        m, h = self.memory.mem_len if mem_len is None else mem_len, self.hourglass
        if h.coarse_mem_len:
            return m * h.coarse_mem_len // self.memory.mem_len
        return m if h.dynamic else m // h.shorten_factor

    @property
    def embed_dim(self) -> int:
        """Embedding width of the head cluster: ``d_embed``, or ``d_model`` when unset."""
        return self.d_model if self.d_embed is None else self.d_embed

    @property
    def proj_ties(self) -> list[bool]:
        """``tie_projs``, or the default: tie every tail cluster's projection when ``div_val > 1``."""
        if self.tie_projs is not None:
            return list(self.tie_projs)
        return [False] + [self.div_val > 1] * len(self.cutoffs)

    @property
    def layer_mixers(self) -> list[str]:
        """One mixer name per layer (``attention`` for the relative attention)."""
        return self.mixer * self.n_layer if len(self.mixer) == 1 else list(self.mixer)

    @property
    def segments_per_step(self) -> int:
        """Consecutive segments one gradient flows through: ``mem_bptt`` with a memory, ``mem_tokens_bptt`` with
        memory tokens, ``state_bptt`` with recurrent layers (whichever is largest), else 1.  A language-model step
        reads this many segments; a classifier back-propagates through a document's last this many."""
        m = self.memory
        recurrent = any(name != "attention" for name in self.layer_mixers)
        return max(
            m.mem_bptt if m.mem_len else 1,
            m.mem_tokens_bptt if m.mem_tokens else 1,
            self.mixers.state_bptt if recurrent else 1,
        )

    def recurrence(
        self,
        *,
        mem_len: int | None = None,
        clamp_len: int | None = None,
        same_length: bool | None = None,
        sinks: int | None = None,
        sink_positions: str | None = None,
    ) -> Recurrence:
        """This model's own :class:`Recurrence` (``memory.mem_len``, ``positions.clamp_len``,
        ``memory.same_length``, ``memory.sinks``, ``memory.sink_positions``), with each value given (not None) in
        place of its own: what one call of the model reads and writes
        (``model(x, recurrence=config.recurrence(mem_len=640))``)."""
        values = {"mem_len": mem_len, "clamp_len": clamp_len, "same_length": same_length, "sinks": sinks}
        values["sink_positions"] = sink_positions
        m = self.memory
        own = Recurrence(m.mem_len, self.positions.clamp_len, m.same_length, m.sinks, m.sink_positions)
        return self.check_recurrence(replace(own, **{name: v for name, v in values.items() if v is not None}))

    def check_recurrence(self, given: Recurrence | None) -> Recurrence:
        """``given`` (None: this model's own, :meth:`recurrence`), checked: what one call of the model reads and
        writes; anything but a :class:`Recurrence` is a ``TypeError``.  ``same_length`` with learned or entropy
        chunks is refused here as the config refuses it for training, and sinks where the model cannot keep them."""
        if given is None:
            return self.recurrence()
        if not isinstance(given, Recurrence):
            raise TypeError(f"recurrence must be a longseq.config.Recurrence, got {type(given).__name__}")
        out = given
        self._check_sinks(out)
        check(
            not (out.same_length and self.hourglass.dynamic),
            f"same_length=true cannot be used with hourglass.boundaries={self.hourglass.boundaries}, at evaluation "
            "as in training: the rows' chunk memories hold different numbers of chunks, and it would limit the "
            "full-resolution layers only; evaluate without it",
        )
        return out

    def _check_sinks(self, recurrence: Recurrence) -> None:
        """Attention sinks (``sinks``, the model's or a call's) keep the first positions of a causal stream beside
        the plain memory of attention layers at one resolution; ``sink_positions=text`` rotates them."""
        if not recurrence.sinks:
            return
        what = f"sinks={recurrence.sinks} keeps the first positions of a stream in the memory"
        check(
            not self.memory.compacted,
            f"{what} beside the plain memory: it does not combine with cmem_len, mem_quant, mem_select or mem_tokens",
        )
        check(not self.pattern.bidirectional, f"{what}: a causal stream's (bidirectional=true reads both ways)")
        check(
            not self.hourglass.shorten_layers and self.arch == "transformer",
            f"{what} of a stack at one resolution: not with an hourglass (shorten_layers) or arch={self.arch}",
        )
        check(
            recurrence.sink_positions == "cache" or self.positions.pos == "rope",
            f"sink_positions=text rotates the sinks at their positions in the text: it needs pos=rope (got "
            f"pos={self.positions.pos}, whose keys sit at their slot in the cache)",
        )

    @property
    def layer_pattern_names(self) -> list[str]:
        """One pattern name per layer."""
        names = self.pattern.attention
        return names * self.n_layer if len(names) == 1 else list(names)

    def __post_init__(self) -> None:
        check_finite(self)
        check(
            self.vocab_size >= 0,
            f"ModelConfig.vocab_size must be >= 1 (0: taken from the tokenizer), got {self.vocab_size}",
        )
        for name in ("n_layer", "d_model", "n_head", "d_head", "d_inner", "div_val"):
            check(getattr(self, name) >= 1, f"ModelConfig.{name} must be >= 1, got {getattr(self, name)}")
        check(
            self.n_kv_head >= 0 and (self.n_kv_head == 0 or self.n_head % self.n_kv_head == 0),
            f"ModelConfig.n_kv_head must divide n_head={self.n_head} (0: as n_head), got {self.n_kv_head}",
        )
        check(self.attn_chunk >= 0, f"ModelConfig.attn_chunk must be >= 0 (0: no chunking), got {self.attn_chunk}")
        for name in ("attn_softcap", "logit_softcap"):
            check(getattr(self, name) >= 0, f"ModelConfig.{name} must be >= 0 (0: no cap), got {getattr(self, name)}")
            check_cap_fits(f"ModelConfig.{name}", getattr(self, name), "float32", FLOAT32_MAX)
        for name in ("dropout", "dropatt"):
            check(0.0 <= getattr(self, name) < 1.0, f"ModelConfig.{name} must be in [0, 1), got {getattr(self, name)}")
        check(
            self.dropout_r is None or 0.0 <= self.dropout_r < 1.0,
            f"ModelConfig.dropout_r must be in [0, 1) (or unset: dropout), got {self.dropout_r}",
        )
        check(self.uv_init in ("normal", "zeros"), f"ModelConfig.uv_init must be normal or zeros, got {self.uv_init!r}")
        check(self.d_embed is None or self.d_embed >= 1, f"ModelConfig.d_embed must be >= 1, got {self.d_embed}")
        check(
            self.attn_impl != "flex" or self.dropatt == 0,
            f"ModelConfig.attn_impl=flex has no attention dropout: set dropatt=0 (got {self.dropatt}) or use rel_shift",
        )
        self._check_softmax()
        self._check_sections()
        self._check_mem_bptt()  # after the mixers' names are parsed
        self._check_sinks(self.recurrence())

    def _check_mem_bptt(self) -> None:
        bptt, mixers = self.memory.mem_bptt, self.layer_mixers
        if bptt == 1:
            return
        check(
            self.arch == "transformer" and not self.hourglass.shorten_layers and "attention" in mixers,
            f"memory.mem_bptt={bptt} back-propagates through the attention memory: arch=lstm, an hourglass "
            "(shorten_layers) and a stack without attention layers carry states (state_bptt) instead",
        )
        check(
            self.mixers.state_bptt in (1, bptt) or mixers == ["attention"] * self.n_layer,
            f"memory.mem_bptt={bptt} and state_bptt={self.mixers.state_bptt} differ: a step reads the larger "
            "window and the states would keep their graph through all of it; set them equal, or state_bptt=1",
        )

    def _check_softmax(self) -> None:
        self.cutoffs = list(self.cutoffs)
        if self.vocab_size == 0:  # not known yet: training takes it from the tokenizer and checks the cutoffs then
            check(
                self.cutoffs == sorted(set(self.cutoffs)) and all(c > 0 for c in self.cutoffs),
                f"ModelConfig.cutoffs must be strictly increasing and positive, got {self.cutoffs}",
            )
            return
        bounds = [0, *self.cutoffs, self.vocab_size]
        check(
            all(a < b for a, b in zip(bounds, bounds[1:])),
            f"ModelConfig.cutoffs must be strictly increasing and inside (0, vocab_size={self.vocab_size}), "
            f"got {self.cutoffs}",
        )
        check(
            self.head_bias or not self.cutoffs,
            "ModelConfig.head_bias=false is for a plain softmax: an adaptive one (cutoffs) has its cluster biases",
        )
        if self.div_val > 1:
            check(bool(self.cutoffs), "ModelConfig.div_val > 1 needs cutoffs (adaptive embedding)")
            check(
                self.embed_dim // self.div_val ** len(self.cutoffs) >= 1,
                f"d_embed={self.embed_dim} is too small for div_val={self.div_val}",
            )
        check(
            self.tie_projs is None or len(self.tie_projs) == len(self.cutoffs) + 1,
            f"ModelConfig.tie_projs needs one entry per cluster ({len(self.cutoffs) + 1}), got {self.tie_projs}",
        )

    def _check_lowrank_bidirectional_without_memory(self) -> None:
        """Linformer's projection mixes a segment's keys along the length: it serves attention both ways, over one
        segment (its patterns and positions are the registries' to check:
        ``model.registry.check_lowrank_patterns_and_positions``; the task and segment length the run's,
        ``config.checks.check_lowrank_task_and_length``)."""
        pattern = self.pattern
        what = f"pattern.lowrank={pattern.lowrank} (Linformer) projects a segment's keys and values along its length"
        check(
            pattern.bidirectional,
            f"{what}, so every query sees every key: it serves bidirectional models (classify, mlm) and a causal "
            "language model cannot use it; set bidirectional=true, or lowrank=0",
        )
        check(self.memory.mem_len == 0, f"{what}, one segment at a time: set mem_len=0 (got {self.memory.mem_len})")

    def _check_mixers(self) -> None:
        if isinstance(self.mixer, str):
            self.mixer = self.mixer.split(",")
        self.mixer = [m.strip() for m in self.mixer if m.strip()]
        check(
            len(self.mixer) in (1, self.n_layer),
            f"ModelConfig.mixer needs one name or one per layer ({self.n_layer}), got {self.mixer}",
        )
        mixers, mem = self.layer_mixers, self.memory
        stray = [name for name in self.mixers.short_conv if name not in mixers]
        check(
            not stray or self.mixers.short_conv == SHORT_CONV,
            f"mixers.short_conv names {', '.join(stray)}, which no layer of this stack is (mixer={','.join(mixers)}): "
            "name the stack's linear-attention layers that take the convolution, or none",
        )
        if any(m != "attention" for m in mixers):
            inner = self.mixers.expand * self.d_model
            check(
                "ssm" not in mixers or inner % self.mixers.head_dim == 0,
                f"the ssm inner width expand x d_model = {inner} must be a multiple of head_dim={self.mixers.head_dim}",
            )
            check(
                "retention" not in mixers or self.d_head % 2 == 0,
                f"retention rotates pairs of channels: d_head must be even, got {self.d_head}",
            )
            rotated = {"linear": ("d_head", self.d_head), "performer": ("mixers.features", self.mixers.features)}
            for name, (option, size) in rotated.items():
                check(
                    name not in mixers or not self.mixers.rotary or size % 2 == 0,
                    f"{name} with mixers.rotary=true rotates pairs of its features: {option} must be even, got {size}",
                )
            check(
                not (mem.cmem_len or mem.mem_select != "recent" or mem.mem_tokens or mem.mem_quant != "none"),
                "the memory compaction options (cmem_len, mem_select, mem_tokens, mem_quant) apply to attention-only "
                "stacks; a stack with recurrent layers (ssm, conv, rnn, the linear-attention family) keeps the plain "
                "memory",
            )
            causal = sorted({m for m in mixers if m not in ("attention", *BIDIRECTIONAL_MIXERS)})
            check(
                not self.pattern.bidirectional or not causal,
                f"the recurrent layers ({', '.join(causal)}) are causal: bidirectional=true needs attention layers or "
                f"the reverse-complement mixers ({', '.join(BIDIRECTIONAL_MIXERS)})",
            )
            both_ways = sorted({m for m in mixers if m in BIDIRECTIONAL_MIXERS})
            check(
                not both_ways or self.pattern.bidirectional,
                f"mixer {', '.join(both_ways)} reads both ways along its segment, so a causal language model would see "
                "the tokens it predicts: it serves bidirectional models (masked LM, classification): set "
                "bidirectional=true",
            )
            check(
                not both_ways or self.d_model % 2 == 0,
                f"the reverse-complement mixers split the channels into two strands: d_model must be even, got "
                f"{self.d_model}",
            )
            check(
                "rc_ssm" not in mixers or (inner // 2) % self.mixers.head_dim == 0,
                f"rc_ssm's inner width expand x d_model / 2 = {inner // 2} must be a multiple of "
                f"head_dim={self.mixers.head_dim}",
            )
        h = self.hourglass
        if h.shorten_layers:
            check(
                not (mem.compacted or self.pattern.bidirectional),
                "an hourglass keeps the plain memory at each resolution and is causal: no cmem_len, mem_select, "
                "mem_tokens, mem_quant or bidirectional with shorten_layers",
            )
            check(
                h.shorten_layers[1] < self.n_layer,
                f"shorten_layers={h.shorten_layers}: the last layer must run at full resolution (n_layer={self.n_layer})",
            )
            check(
                not h.coarse_mem_len or mem.mem_len > 0,
                f"hourglass.coarse_mem_len={h.coarse_mem_len} is kept in proportion to mem_len (an evaluation's "
                "mem_len moves both): set mem_len > 0",
            )
            self._check_dynamic()

    def _check_dynamic(self) -> None:
        h = self.hourglass
        if not h.dynamic:
            return
        first, end = h.shorten_layers
        check(
            set(self.layer_mixers[first:end]) == {"attention"},
            f"hourglass.boundaries={h.boundaries}: the layers that run on chunks ({first} .. {end - 1}) must be "
            f"attention layers (their memory holds a different number of chunks per row), got "
            f"mixer={self.layer_mixers[first:end]}",
        )
        check(
            not self.memory.same_length,
            f"hourglass.boundaries={h.boundaries} cannot be combined with same_length (rows hold different numbers "
            "of chunks)",
        )

    def _check_sections(self) -> None:
        self._check_mixers()
        mem, pattern, pos = self.memory, self.pattern, self.positions
        check(
            len(pattern.attention) in (1, self.n_layer),
            f"pattern.attention needs one pattern or one per layer ({self.n_layer}), got {pattern.attention}",
        )
        check(
            len(pattern.dilation) in (1, self.n_head),
            f"dilation needs one value or one per head ({self.n_head}), got {list(pattern.dilation)}",
        )
        check(
            pos.pos != "absolute" or (mem.mem_len == 0 and not mem.mem_tokens),
            f"positions.pos=absolute (the vanilla Transformer) has no memory: absolute positions cannot be reused "
            f"across segments; set mem_len=0 (got mem_len={mem.mem_len}, mem_tokens={mem.mem_tokens})",
        )
        check(
            not pattern.bidirectional
            or not (mem.same_length or mem.cmem_len or mem.mem_tokens or mem.mem_select != "recent"),
            "pattern.bidirectional=true supports the plain hidden-state memory only "
            "(no same_length, compressed memory, memory tokens or attention-based selection)",
        )
        if pattern.lowrank:
            self._check_lowrank_bidirectional_without_memory()
