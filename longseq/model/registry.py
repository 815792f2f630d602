"""The names a model config chooses, checked against the registries that implement them, and the options each
choice reads.

Every choice is owned by its implementation: attention patterns (:data:`~longseq.model.attention.patterns.PATTERNS`,
a predicate and the parameters it reads), kernels (:data:`~longseq.model.attention.kernels.ATTENTION_KERNELS` and
``CONTENT_KERNELS``, and ``auto``), position encodings (:data:`~longseq.model.positions.POSITION_ENCODINGS`), mixers
(:data:`~longseq.model.mixers.MIXERS`, and ``attention``, the decoder layer), compression functions
(:data:`~longseq.model.memory.compress.COMPRESSION_FUNCTIONS`), a dynamic hourglass's boundary predictors
(:data:`~longseq.model.boundaries.BOUNDARY_PREDICTORS`, and ``fixed``, the hourglass's groups), the block's norm and feed-forward
(:data:`~longseq.model.block.NORMS`, :data:`~longseq.model.block.FEED_FORWARDS`) and architectures
(:data:`MODEL_SPECS`: each one's class and what the trainer asks of it, :mod:`longseq.model.spec`).
A new one is registered once, where it is implemented; :func:`check_names` and :func:`ignored_options` read the
registries."""

from __future__ import annotations

from longseq.config.base import ConfigError, check_choice, leaves
from longseq.config.model import ModelConfig
from longseq.config.run import DataConfig
from longseq.model.attention.kernels import KERNEL_NAMES, kernel_for
from longseq.model.attention.patterns import PATTERNS, layer_patterns
from longseq.model.block import FEED_FORWARDS, NORMS
from longseq.model.boundaries import BOUNDARY_PREDICTORS
from longseq.model.hourglass import Hourglass
from longseq.model.lstm import LSTMLM
from longseq.model.memory.compress import COMPRESSION_FUNCTIONS
from longseq.model.mixers import MIXERS
from longseq.model.positions import POSITION_ENCODINGS
from longseq.model.spec import LSTM, TRANSFORMER_XL, ModelSpec
from longseq.model.stack import DecoderLayer

MODEL_SPECS: dict[str, ModelSpec] = {"transformer": TRANSFORMER_XL, "lstm": LSTM}
ARCHITECTURES = {name: spec.build for name, spec in MODEL_SPECS.items()}  # what ``arch`` names: the model class
LAYERS = ("attention", *MIXERS)  # what ``mixer`` may name for a layer
BOUNDARIES = ("fixed", *BOUNDARY_PREDICTORS)  # what ``hourglass.boundaries`` may name


def check_names(config: ModelConfig) -> None:
    """Every name ``config`` chooses is registered; a :class:`ConfigError` names the field and the close matches."""
    check_choice("arch", config.arch, tuple(ARCHITECTURES))
    for name in config.pattern.attention:
        check_choice("pattern.attention", name, tuple(PATTERNS))
    check_choice("attn_impl", config.attn_impl, KERNEL_NAMES)
    check_choice("positions.pos", config.positions.pos, tuple(POSITION_ENCODINGS))
    check_choice("norm", config.norm, tuple(NORMS))
    check_choice("ff", config.ff, tuple(FEED_FORWARDS))
    if config.attn_impl != "auto":  # the kernel registries say which names each position family runs
        try:
            kernel_for(config.attn_impl, POSITION_ENCODINGS[config.positions.pos].family, config.attn_softcap > 0)
        except ValueError as error:
            raise ConfigError(f"{error} (pos={config.positions.pos})") from None
    for name in config.mixer:
        check_choice("mixer", name, LAYERS)
    check_choice("memory.cmem_fn", config.memory.cmem_fn, tuple(COMPRESSION_FUNCTIONS))
    check_choice("hourglass.boundaries", config.hourglass.boundaries, BOUNDARIES)
    if config.pattern.lowrank:
        check_lowrank_patterns_and_positions(config)


def check_lengths(model: ModelConfig, data: DataConfig) -> None:
    """What the model's choices need of the run's segments, by their registry entries: a compression function that
    takes whole groups of ``cmem_rate`` evicted states (``needs_whole_groups``) needs segments and a memory of
    multiples of the rate, and fixed segment lengths (no ``varlen``)."""
    c, d = model.memory, data
    if c.cmem_len:
        check_choice("memory.cmem_fn", c.cmem_fn, tuple(COMPRESSION_FUNCTIONS))
    if c.cmem_len and COMPRESSION_FUNCTIONS[c.cmem_fn].needs_whole_groups:
        if d.tgt_len % c.cmem_rate or c.mem_len % c.cmem_rate or d.varlen:
            raise ConfigError(
                f"cmem_fn={c.cmem_fn} compresses groups of exactly cmem_rate={c.cmem_rate} evicted states: "
                f"tgt_len={d.tgt_len} and mem_len={c.mem_len} must be multiples of it, and varlen must be off"
            )


def check_lowrank_patterns_and_positions(config: ModelConfig) -> None:
    """Linformer's projection (``pattern.lowrank``) replaces full attention, and a projected key, a mixture of
    positions, has no distance to a query: every layer's pattern must allow every pair, and the position encoding
    must score no distance (rope rotates the keys before the projection; nope and absolute have none)."""
    what = f"pattern.lowrank={config.pattern.lowrank} (Linformer) projects a segment's keys along its length"
    if not all(pattern.is_full for pattern in layer_patterns(config)):
        raise ConfigError(
            f"{what}: it replaces full attention, not a sparse pattern (attention={config.pattern.attention})"
        )
    pos = config.positions.pos
    if POSITION_ENCODINGS[pos].scores_distances:
        usable = [name for name, e in POSITION_ENCODINGS.items() if e.family == "content" and not e.scores_distances]
        raise ConfigError(
            f"{what}, so a projected key has no distance to a query: positions.pos={pos} scores distances; use "
            f"pos={', '.join(usable)}"
        )


def ignored_options(config: ModelConfig, base: ModelConfig | None = None) -> list[str]:
    """``path=value`` for every option set to other than in ``base`` (default: the defaults; the command line gives
    the preset it started from) that the chosen architecture does not read (``arch=lstm`` with ``cmem_len``, a
    pattern's ``window`` with full attention, the ssm's ``d_state`` in a stack without ssm layers): a run that sets
    them trains something other than what it says."""
    check_names(config)
    defaults = leaves((base or ModelConfig(vocab_size=config.vocab_size)).to_dict())
    unread = unread_options(config)
    shown = lambda v: (",".join(map(str, v)) or "none") if isinstance(v, list) else str(v)  # noqa: E731
    return [
        f"{path}={shown(value)}"
        for path, value in leaves(config.to_dict()).items()
        if path in unread and defaults.get(path) != value
    ]


def unread_options(config: ModelConfig) -> set[str]:
    """The option paths the architecture ``config`` describes does not read, by what each registered choice
    declares it reads."""
    every = set(leaves(config.to_dict()))
    if config.arch == "lstm":
        return every - {*LSTMLM.reads, "vocab_size", "arch"}
    layers, unread = set(config.layer_mixers), set()
    if "attention" not in layers:
        unread |= {p for p in every if p.split(".")[0] in ("memory", "pattern", "positions")} | set(DecoderLayer.reads)
    else:
        used = {n for n, m in zip(config.layer_pattern_names, config.layer_mixers) if m == "attention"}
        read = {parameter for name in used for parameter in PATTERNS[name].reads}
        every = {parameter for kind in PATTERNS.values() for parameter in kind.reads}
        unread |= {f"pattern.{p}" for p in every - read}
        if not config.pattern.num_random_blocks:
            unread.add("pattern.pattern_seed")
        if not config.pattern.lowrank:
            unread |= {"pattern.lowrank_len", "pattern.lowrank_share"}
        unread |= POSITION_ENCODINGS[config.positions.pos].unread_options(config.positions)
        m = config.memory
        unread |= {
            path
            for path, on in (
                ("memory.mem_quant_axis", m.mem_quant == "int8"),
                ("memory.cmem_fn", m.cmem_len > 0),
                ("memory.mem_tokens_bptt", m.mem_tokens > 0),
                ("memory.sink_positions", m.sinks > 0),
            )
            if not on
        }
    read = {parameter for name in layers - {"attention"} for parameter in MIXERS[name].reads}
    if layers & set(config.mixers.short_conv):  # a linear-attention layer with its short convolution
        read.add("conv_kernel")
    unread |= {f"mixers.{f}" for f in leaves(config.mixers.to_dict()) if f not in read}
    unread -= {parameter for name in layers - {"attention"} for parameter in MIXERS[name].shares}
    return unread | unread_hourglass(config)


def unread_hourglass(config: ModelConfig) -> set[str]:
    """The hourglass options its boundaries do not read (all of them without ``shorten_layers``): those the fixed
    groups (``Hourglass.reads``) or a boundary predictor (its registry entry's ``reads``) read and the chosen
    boundaries do not."""
    h = config.hourglass
    if not h.shorten_layers:
        return {f"hourglass.{f}" for f in leaves(h.to_dict()) if f != "shorten_layers"}
    reads = {"fixed": Hourglass.reads, **{name: kind.reads for name, kind in BOUNDARY_PREDICTORS.items()}}
    every = {field for fields in reads.values() for field in fields}
    return {f"hourglass.{f}" for f in every - set(reads[h.boundaries])}


def model_spec(arch: str) -> ModelSpec:
    """The spec of architecture ``arch`` (``ModelConfig.arch``); an unknown name is a :class:`ConfigError`."""
    check_choice("arch", arch, tuple(MODEL_SPECS))
    return MODEL_SPECS[arch]


def build_model(config: ModelConfig):
    """The language model a config describes: Transformer-XL (and its vanilla and Shaw variants) or the LSTM."""
    if config.vocab_size < 1:
        raise ConfigError("vocab_size is 0 (taken from the tokenizer in training): set it to build a model")
    check_names(config)
    return ARCHITECTURES[config.arch](config)
