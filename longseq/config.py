"""Typed configuration for every component, presets, and ``key=value`` overrides.

Each component has a dataclass validated in ``__post_init__``; every config round-trips
through JSON (``to_dict`` / ``from_dict``) and unknown keys are an error.  Presets are
plain functions returning a :class:`RunConfig`.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import types
import typing
from dataclasses import dataclass, field
from typing import Any


class ConfigError(ValueError):
    """A configuration value, key or preset is invalid."""


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


class _JsonConfig:
    """Mixin: strict ``from_dict`` and plain ``to_dict`` for a dataclass config."""

    @classmethod
    def from_dict(cls, data: dict[str, Any]):
        if not isinstance(data, dict):
            raise ConfigError(f"{cls.__name__} expects a JSON object, got {type(data).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            hints = []
            for key in unknown:
                close = difflib.get_close_matches(key, names, n=3)
                hints.append(f"{key!r}" + (f" (did you mean {', '.join(close)}?)" if close else ""))
            raise ConfigError(f"unknown {cls.__name__} key(s): {'; '.join(hints)}")
        values = {}
        for f in dataclasses.fields(cls):
            if f.name in data:
                values[f.name] = coerce_value(f.name, data[f.name], _field_type(cls, f.name))
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)


@dataclass
class ModelConfig(_JsonConfig):
    """Transformer-XL architecture (Dai et al., 2019).

    ``clamp_len <= 0`` means no clamping of relative distances.  ``cutoffs`` switch on the
    adaptive input embedding and adaptive softmax; ``div_val`` shrinks each tail cluster's
    embedding by that factor.  ``tie_projs[i]`` ties the softmax projection of cluster ``i`` to
    the embedding's (default: all but the head cluster when ``div_val > 1``, as in the paper).
    ``attn_impl`` names the attention kernel (``rel_shift`` fast path or ``reference``); ``attn_chunk``
    processes queries in blocks of that size (0: all at once), which is exact and faster on CPU.

    Memory compaction: ``mem_dropout`` zeroes that fraction of memory slots in training; ``mem_quant="int8"``
    stores the memory in 8 bits with a scale per row (position) or per channel (``mem_quant_axis``);
    ``cmem_len`` > 0 keeps a compressed memory of that many slots, made from evicted states at rate
    ``cmem_rate`` with ``cmem_fn`` (mean, max, conv, linear), as in the Compressive Transformer.
    ``mem_select="attention"`` keeps, of the old memory, the slots that received the most attention mass.
    ``mem_tokens`` > 0 adds that many memory tokens (Recurrent Memory Transformer): read before the segment,
    written after it and carried on, with back-propagation through ``mem_tokens_bptt`` segments.

    Attention patterns (:mod:`longseq.model.patterns`): ``attention`` names one pattern for every layer or
    one per layer (full, window, dilated, strided, block_sparse, global, bigbird), with the parameters
    ``window``, ``dilation`` (one value, or one per head), ``stride``, ``block_size``, ``block_summary``,
    ``num_global``, ``num_random_blocks`` and ``pattern_seed``.  With ``attn_chunk`` > 0 a local pattern runs
    in time and memory linear in the sequence length.  ``bidirectional`` makes every pattern two-sided (encoders:
    masked LM, classification).  ``pos="shaw"`` replaces the sinusoidal R and the u, v biases with the clipped
    learned relative table of Shaw et al. (2018), ``max_relative_distance`` entries each way; ``pos="absolute"``
    is the vanilla Transformer (Al-Rfou et al., 2018): sinusoidal absolute positions added to the embeddings and
    no memory.  ``arch="lstm"`` is the LSTM baseline (``n_layer`` LSTM layers of width ``d_model``).
    """

    @property
    def uses_memory_state(self) -> bool:
        """True when the memory is a :class:`~longseq.model.memory.MemoryState` rather than a tuple."""
        return self.cmem_len > 0 or self.mem_quant != "none" or self.mem_select != "recent" or self.mem_tokens > 0

    @property
    def effective_range(self) -> int:
        """Temporal range of the memory: (mem_len + cmem_rate * cmem_len) * n_layer (Rae et al., 2019)."""
        return (self.mem_len + self.cmem_rate * self.cmem_len) * self.n_layer

    vocab_size: int = 256
    n_layer: int = 4
    d_model: int = 128
    n_head: int = 4
    d_head: int = 32
    d_inner: int = 512
    dropout: float = 0.1
    dropatt: float = 0.0
    mem_len: int = 64
    clamp_len: int = -1
    same_length: bool = False
    pre_lnorm: bool = False
    cutoffs: list[int] = field(default_factory=list)
    div_val: int = 1
    d_embed: int | None = None
    tie_weight: bool = True
    tie_projs: list[bool] | None = None
    untie_r: bool = False
    init_std: float = 0.02
    proj_init_std: float = 0.01
    layer_norm_eps: float = 1e-5
    attn_impl: str = "rel_shift"
    attn_chunk: int = 64
    mem_dropout: float = 0.0
    mem_quant: str = "none"
    mem_quant_axis: str = "row"
    cmem_len: int = 0
    cmem_rate: int = 0
    cmem_fn: str = "mean"
    mem_select: str = "recent"
    mem_tokens: int = 0
    mem_tokens_bptt: int = 1
    attention: list[str] = field(default_factory=lambda: ["full"])
    bidirectional: bool = False
    window: int = 256
    dilation: list[int] = field(default_factory=lambda: [1])
    stride: int = 128
    block_size: int = 64
    block_summary: int = 1
    num_global: int = 0
    num_random_blocks: int = 0
    pattern_seed: int = 0
    pos: str = "sinusoidal"
    max_relative_distance: int = 64
    arch: str = "transformer"

    def layer_patterns(self):
        """One :class:`~longseq.model.patterns.AttentionPattern` per layer (``attention`` holds one name for
        every layer or one per layer)."""
        from longseq.model.patterns import AttentionPattern

        names = self.attention * self.n_layer if len(self.attention) == 1 else self.attention
        return [
            AttentionPattern(
                name=name,
                causal=not self.bidirectional,
                window=self.window,
                dilation=tuple(self.dilation),
                stride=self.stride,
                block_size=self.block_size,
                block_summary=self.block_summary,
                num_global=self.num_global,
                num_random_blocks=self.num_random_blocks,
                seed=self.pattern_seed,
            )
            for name in names
        ]

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

    def __post_init__(self) -> None:
        for name in ("vocab_size", "n_layer", "d_model", "n_head", "d_head", "d_inner", "div_val"):
            _check(getattr(self, name) >= 1, f"ModelConfig.{name} must be >= 1, got {getattr(self, name)}")
        _check(self.mem_len >= 0, f"ModelConfig.mem_len must be >= 0, got {self.mem_len}")
        _check(0.0 <= self.mem_dropout < 1.0, f"ModelConfig.mem_dropout must be in [0, 1), got {self.mem_dropout}")
        _check(
            self.mem_quant in ("none", "int8"), f"ModelConfig.mem_quant must be none or int8, got {self.mem_quant!r}"
        )
        _check(
            self.mem_quant_axis in ("row", "channel"),
            f"ModelConfig.mem_quant_axis must be row or channel, got {self.mem_quant_axis!r}",
        )
        _check(self.cmem_len >= 0 and self.cmem_rate >= 0, "ModelConfig.cmem_len and cmem_rate must be >= 0")
        _check(
            not self.cmem_len or self.cmem_rate >= 1,
            f"ModelConfig.cmem_len={self.cmem_len} needs a compression rate: set cmem_rate >= 1",
        )
        _check(
            not self.cmem_rate or self.cmem_len,
            f"ModelConfig.cmem_rate={self.cmem_rate} without a compressed memory: set cmem_len >= 1",
        )
        _check(
            not self.cmem_len or self.mem_len >= 1,
            "ModelConfig.cmem_len needs mem_len >= 1: only states evicted from the memory are compressed",
        )
        _check(
            self.mem_select == "recent" or not self.cmem_len,
            "ModelConfig.mem_select=attention cannot be combined with a compressed memory (cmem_len > 0)",
        )
        _check(self.mem_tokens >= 0, f"ModelConfig.mem_tokens must be >= 0, got {self.mem_tokens}")
        _check(self.mem_tokens_bptt >= 1, f"ModelConfig.mem_tokens_bptt must be >= 1, got {self.mem_tokens_bptt}")
        _check(
            self.mem_select in ("recent", "attention"),
            f"ModelConfig.mem_select must be recent or attention, got {self.mem_select!r}",
        )
        from longseq.model.compress import COMPRESSION_FUNCTIONS

        _check(
            self.cmem_fn in COMPRESSION_FUNCTIONS,
            f"ModelConfig.cmem_fn must be one of {COMPRESSION_FUNCTIONS}, got {self.cmem_fn!r}",
        )
        _check(self.attn_chunk >= 0, f"ModelConfig.attn_chunk must be >= 0 (0: no chunking), got {self.attn_chunk}")
        for name in ("dropout", "dropatt"):
            value = getattr(self, name)
            _check(0.0 <= value < 1.0, f"ModelConfig.{name} must be in [0, 1), got {value}")
        _check(self.d_embed is None or self.d_embed >= 1, f"ModelConfig.d_embed must be >= 1, got {self.d_embed}")
        self.cutoffs = list(self.cutoffs)
        bounds = [0, *self.cutoffs, self.vocab_size]
        _check(
            all(a < b for a, b in zip(bounds, bounds[1:])),
            f"ModelConfig.cutoffs must be strictly increasing and inside (0, vocab_size={self.vocab_size}), "
            f"got {self.cutoffs}",
        )
        if self.div_val > 1:
            _check(bool(self.cutoffs), "ModelConfig.div_val > 1 needs cutoffs (adaptive embedding)")
            smallest = self.embed_dim // self.div_val ** len(self.cutoffs)
            _check(smallest >= 1, f"d_embed={self.embed_dim} is too small for div_val={self.div_val}")
        _check(
            self.tie_projs is None or len(self.tie_projs) == len(self.cutoffs) + 1,
            f"ModelConfig.tie_projs needs one entry per cluster ({len(self.cutoffs) + 1}), got {self.tie_projs}",
        )
        from longseq.model.attention import ATTENTION_KERNELS

        _check(
            self.attn_impl in ATTENTION_KERNELS,
            f"ModelConfig.attn_impl must be one of {sorted(ATTENTION_KERNELS)}, got {self.attn_impl!r}",
        )
        self._check_patterns()

    def _check_patterns(self) -> None:
        from longseq.model.patterns import PATTERN_NAMES, PatternError

        if isinstance(self.attention, str):
            self.attention = [a for a in self.attention.split(",") if a.strip()]
        if isinstance(self.dilation, int):
            self.dilation = [self.dilation]
        self.attention, self.dilation = [a.strip() for a in self.attention], list(self.dilation)
        _check(
            len(self.attention) in (1, self.n_layer),
            f"ModelConfig.attention needs one pattern or one per layer ({self.n_layer}), got {self.attention}",
        )
        for name in self.attention:
            if name not in PATTERN_NAMES:
                close = difflib.get_close_matches(name, PATTERN_NAMES, n=2)
                hint = f" (did you mean {', '.join(close)}?)" if close else ""
                _check(
                    False, f"ModelConfig.attention: unknown pattern {name!r}{hint}; known: {', '.join(PATTERN_NAMES)}"
                )
        _check(
            self.pos in ("sinusoidal", "shaw", "absolute"),
            f"ModelConfig.pos must be sinusoidal, shaw or absolute, got {self.pos!r}",
        )
        _check(self.arch in ("transformer", "lstm"), f"ModelConfig.arch must be transformer or lstm, got {self.arch!r}")
        _check(
            self.pos != "absolute" or (self.mem_len == 0 and not self.mem_tokens),
            f"ModelConfig.pos=absolute (the vanilla Transformer) has no memory: absolute positions cannot be reused "
            f"across segments; set mem_len=0 (got mem_len={self.mem_len}, mem_tokens={self.mem_tokens})",
        )
        _check(
            self.pos != "shaw" or self.max_relative_distance >= 1,
            f"ModelConfig.max_relative_distance must be >= 1 with pos=shaw, got {self.max_relative_distance}",
        )
        try:
            for pattern in self.layer_patterns():
                pattern.check_heads(self.n_head)
        except PatternError as exc:
            raise ConfigError(f"ModelConfig: {exc}") from None
        if self.bidirectional:
            _check(
                not (self.same_length or self.cmem_len or self.mem_tokens or self.mem_select != "recent"),
                "ModelConfig.bidirectional=true supports the plain hidden-state memory only "
                "(no same_length, compressed memory, memory tokens or attention-based selection)",
            )


@dataclass
class DataConfig(_JsonConfig):
    """Corpus, tokenizer and ordered LM batching.

    ``path`` is a file or a directory in a standard layout (``None`` = the bundled
    tiny-shakespeare).  ``varlen`` draws segment lengths around ``tgt_len`` as the paper's code does.
    ``doc_reset`` keeps documents apart (a directory of documents): no token attends to another document,
    in the segment or in the memory.
    """

    path: str | None = None
    tokenizer: str = "char"
    lowercase: bool = False
    tgt_len: int = 64
    batch_size: int = 16
    eval_tgt_len: int = 64
    eval_batch_size: int = 16
    varlen: bool = False
    doc_reset: bool = False

    def __post_init__(self) -> None:
        _check(
            self.tokenizer in ("byte", "char", "word"),
            f"DataConfig.tokenizer must be byte, char or word, got {self.tokenizer!r}",
        )
        for name in ("tgt_len", "batch_size", "eval_tgt_len", "eval_batch_size"):
            _check(getattr(self, name) >= 1, f"DataConfig.{name} must be >= 1, got {getattr(self, name)}")


SCHEDULES = ("cosine", "linear", "inv_sqrt", "constant")


@dataclass
class TrainConfig(_JsonConfig):
    """Optimisation, schedule, evaluation cadence and checkpointing.

    NaN guard: a step whose loss or gradient norm is NaN or Inf is skipped (no update, the memory of the
    step before is kept) and logged; after ``nan_patience`` consecutive bad steps the run rolls back to the
    last checkpoint and multiplies the learning rate by ``nan_lr_factor`` (``nan_patience=0``: stop with an
    error at the first bad step).  ``keep_last`` > 1 keeps that many training checkpoints (``last`` plus
    ``history/step-N``); ``best`` is kept apart.

    ``optimizer``: adamw or lamb; ``layer_lr_decay`` < 1 scales each layer's learning rate by decay^(depth from the
    top).  ``precision``: fp32, bf16 (autocast, CPU or GPU) or fp16 (autocast with dynamic loss scaling;
    on CPU it runs, slowly, for testing); attention logits, softmax and the loss stay in float32.  ``activation_checkpointing`` = k recomputes
    every k-th decoder layer in the backward pass instead of keeping its activations (0: off).
    ``grad_norm_interval`` = N logs every layer's gradient norm every N steps; ``tensorboard`` also writes the
    metrics as TensorBoard events (needs the tensorboard package).  ``device``: auto (cuda when available),
    cpu or cuda[:N]; under torchrun each rank takes cuda:LOCAL_RANK.  ``parallel``: how torchrun processes share
    the model, ddp (every rank holds all weights) or fsdp (weights, gradients and optimizer moments sharded
    across ranks, PyTorch's ``fully_shard``, one unit per decoder layer); one process ignores it.
    """

    max_steps: int = 1200
    lr: float = 1e-3
    min_lr: float = 1e-5
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    warmup_steps: int = 100
    schedule: str = "cosine"
    clip: float = 0.25
    grad_accum: int = 1
    eval_interval: int = 300
    eval_max_segments: int = 0
    log_interval: int = 20
    save_interval: int = 0
    seed: int = 1111
    nan_patience: int = 3
    nan_lr_factor: float = 0.5
    keep_last: int = 1
    optimizer: str = "adamw"
    layer_lr_decay: float = 1.0
    precision: str = "fp32"
    activation_checkpointing: int = 0
    grad_norm_interval: int = 0
    tensorboard: bool = False
    device: str = "auto"
    parallel: str = "ddp"

    def __post_init__(self) -> None:
        _check(self.max_steps >= 1, f"TrainConfig.max_steps must be >= 1, got {self.max_steps}")
        _check(self.nan_patience >= 0, f"TrainConfig.nan_patience must be >= 0, got {self.nan_patience}")
        _check(0 < self.nan_lr_factor <= 1, f"TrainConfig.nan_lr_factor must be in (0, 1], got {self.nan_lr_factor}")
        _check(self.keep_last >= 1, f"TrainConfig.keep_last must be >= 1, got {self.keep_last}")
        _check(
            self.optimizer in ("adamw", "lamb"), f"TrainConfig.optimizer must be adamw or lamb, got {self.optimizer!r}"
        )
        _check(0 < self.layer_lr_decay <= 1, f"TrainConfig.layer_lr_decay must be in (0, 1], got {self.layer_lr_decay}")
        _check(
            self.precision in ("fp32", "bf16", "fp16"),
            f"TrainConfig.precision must be fp32, bf16 or fp16, got {self.precision!r}",
        )
        for name in ("activation_checkpointing", "grad_norm_interval"):
            _check(getattr(self, name) >= 0, f"TrainConfig.{name} must be >= 0, got {getattr(self, name)}")
        _check(
            self.device == "auto" or self.device.split(":")[0] in ("cpu", "cuda"),
            f"TrainConfig.device must be auto, cpu or cuda[:N], got {self.device!r}",
        )
        _check(self.parallel in ("ddp", "fsdp"), f"TrainConfig.parallel must be ddp or fsdp, got {self.parallel!r}")
        _check(self.lr > 0, f"TrainConfig.lr must be > 0, got {self.lr}")
        _check(0 <= self.min_lr <= self.lr, f"TrainConfig.min_lr must be in [0, lr], got {self.min_lr}")
        _check(self.schedule in SCHEDULES, f"TrainConfig.schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        for name in ("warmup_steps", "eval_max_segments", "save_interval"):
            _check(getattr(self, name) >= 0, f"TrainConfig.{name} must be >= 0, got {getattr(self, name)}")
        for name in ("grad_accum", "eval_interval", "log_interval"):
            _check(getattr(self, name) >= 1, f"TrainConfig.{name} must be >= 1, got {getattr(self, name)}")
        _check(self.clip >= 0, f"TrainConfig.clip must be >= 0 (0 disables), got {self.clip}")


@dataclass
class EvalConfig(_JsonConfig):
    """Evaluation-time settings; ``None`` keeps the checkpoint's own value.

    The paper evaluates with a much longer memory than it trains with, e.g. WikiText-103 with
    ``tgt_len=64, mem_len=640, clamp_len=400, same_length=True``.
    """

    split: str = "valid"
    tgt_len: int | None = None
    mem_len: int | None = None
    clamp_len: int | None = None
    same_length: bool | None = None
    batch_size: int | None = None
    max_segments: int = 0

    def __post_init__(self) -> None:
        _check(
            self.split in ("train", "valid", "test"),
            f"EvalConfig.split must be train, valid or test, got {self.split!r}",
        )
        for name in ("tgt_len", "batch_size"):
            value = getattr(self, name)
            _check(value is None or value >= 1, f"EvalConfig.{name} must be >= 1, got {value}")
        _check(self.mem_len is None or self.mem_len >= 0, f"EvalConfig.mem_len must be >= 0, got {self.mem_len}")
        _check(self.max_segments >= 0, f"EvalConfig.max_segments must be >= 0, got {self.max_segments}")


@dataclass
class RunConfig:
    """The three configs of a training run, stored together in every checkpoint."""

    model: ModelConfig
    data: DataConfig
    train: TrainConfig

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model.to_dict(), "data": self.data.to_dict(), "train": self.train.to_dict()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunConfig:
        if not isinstance(data, dict) or set(data) != {"model", "data", "train"}:
            keys = sorted(data) if isinstance(data, dict) else type(data).__name__
            raise ConfigError(f"a run config needs exactly the sections model, data and train, got {keys}")
        return cls(
            model=ModelConfig.from_dict(data["model"]),
            data=DataConfig.from_dict(data["data"]),
            train=TrainConfig.from_dict(data["train"]),
        )


# ----------------------------------------------------------------------------- overrides


def _field_type(cls: type, name: str) -> Any:
    return typing.get_type_hints(cls)[name]


def coerce_value(key: str, value: Any, annotation: Any) -> Any:
    """Convert ``value`` (a JSON value or a command-line string) to ``annotation`` or raise."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
            if type(None) in args:
                return None
        inner = [a for a in args if a is not type(None)]
        return coerce_value(key, value, inner[0])
    if origin is list:
        (item_type,) = args
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                try:
                    value = json.loads(text)
                except json.JSONDecodeError as exc:
                    raise ConfigError(f"{key}: cannot parse {value!r} as a list: {exc}") from None
            else:
                value = [v for v in text.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        return [coerce_value(key, v, item_type) for v in value]
    if annotation is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "1", "yes", "on"):
            return True
        if isinstance(value, str) and value.lower() in ("false", "0", "no", "off"):
            return False
        raise ConfigError(f"{key}: expected true or false, got {value!r}")
    if annotation is int:
        if isinstance(value, bool):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value.replace("_", ""))
            except ValueError:
                pass
        raise ConfigError(f"{key}: expected an integer, got {value!r}")
    if annotation is float:
        if isinstance(value, bool):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{key}: expected a number, got {value!r}")
    if annotation is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{key}: expected a string, got {value!r}")
    raise ConfigError(f"{key}: unsupported field type {annotation}")


def apply_overrides(sections: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``key=value`` strings to named config sections and return new, validated configs.

    A key is a field name of one section, or ``section.field`` when the name is ambiguous.
    An unknown key is an error that lists the close matches.
    """
    owners: dict[str, list[str]] = {}
    for section, cfg in sections.items():
        for f in dataclasses.fields(cfg):
            owners.setdefault(f.name, []).append(section)
    changes: dict[str, dict[str, Any]] = {section: {} for section in sections}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like key=value")
        key, raw = item.split("=", 1)
        key = key.strip()
        if "." in key:
            section, name = key.split(".", 1)
            if section not in sections or name not in owners or section not in owners[name]:
                _unknown_key(key, owners, sections)
        else:
            if key not in owners:
                _unknown_key(key, owners, sections)
            if len(owners[key]) > 1:
                options = ", ".join(f"{s}.{key}" for s in owners[key])
                raise ConfigError(f"key {key!r} is ambiguous: use one of {options}")
            section, name = owners[key][0], key
        cfg = sections[section]
        changes[section][name] = coerce_value(key, raw, _field_type(type(cfg), name))
    result = {}
    for section, cfg in sections.items():
        merged = {**cfg.to_dict(), **changes[section]}
        result[section] = type(cfg).from_dict(merged)
    return result


def _unknown_key(key: str, owners: dict[str, list[str]], sections: dict[str, Any]) -> None:
    candidates = list(owners) + [f"{s}.{n}" for n, ss in owners.items() for s in ss]
    close = difflib.get_close_matches(key, candidates, n=4, cutoff=0.6)
    hint = f"; did you mean {', '.join(close)}?" if close else f"; sections: {', '.join(sections)}"
    raise ConfigError(f"unknown config key {key!r}{hint}")


# ----------------------------------------------------------------------------- presets


def tiny_shakespeare() -> RunConfig:
    """The default: a 4-layer character model on the bundled corpus, a few minutes on 2 CPU cores."""
    return RunConfig(
        model=ModelConfig(
            vocab_size=65, n_layer=4, d_model=128, n_head=4, d_head=32, d_inner=512, dropout=0.1, mem_len=64
        ),
        data=DataConfig(path=None, tokenizer="char", tgt_len=64, batch_size=16, eval_tgt_len=64, eval_batch_size=16),
        train=TrainConfig(
            max_steps=1200, lr=2e-3, min_lr=1e-4, warmup_steps=100, eval_interval=300, eval_max_segments=80
        ),
    )


def enwik8_base() -> RunConfig:
    """The paper's 12-layer enwik8 model (run_enwik8_base.sh); evaluate with tgt_len=80, mem_len=2100, clamp_len=820."""
    return RunConfig(
        model=ModelConfig(
            vocab_size=256, n_layer=12, d_model=512, n_head=8, d_head=64, d_inner=2048, dropout=0.1, dropatt=0.0,
            mem_len=512,
        ),
        data=DataConfig(tokenizer="byte", tgt_len=512, batch_size=22, eval_tgt_len=128, eval_batch_size=10),
        train=TrainConfig(
            max_steps=400_000, lr=2.5e-4, min_lr=0.0, warmup_steps=0, schedule="cosine", clip=0.25,
            eval_interval=4000, log_interval=200,
        ),
    )  # fmt: skip


def text8_base() -> RunConfig:
    """The paper's 12-layer text8 model (same architecture as enwik8-base)."""
    run = enwik8_base()
    run.model.vocab_size = 27
    run.data.tokenizer = "char"
    return run


def wt103_base() -> RunConfig:
    """The paper's 16-layer WikiText-103 model with adaptive softmax; evaluate with tgt_len=64, mem_len=640, clamp_len=400, same_length=True."""
    return RunConfig(
        model=ModelConfig(
            vocab_size=267_735, n_layer=16, d_model=410, n_head=10, d_head=41, d_inner=2100, dropout=0.1,
            dropatt=0.0, mem_len=150, cutoffs=[20_000, 40_000, 200_000], div_val=1,
        ),
        data=DataConfig(tokenizer="word", tgt_len=150, batch_size=60, eval_tgt_len=150, eval_batch_size=10),
        train=TrainConfig(
            max_steps=200_000, lr=2.5e-4, min_lr=0.0, warmup_steps=0, schedule="cosine", clip=0.25,
            eval_interval=4000, log_interval=200,
        ),
    )  # fmt: skip


def ptb() -> RunConfig:
    """A 24M-parameter Penn Treebank model of the paper's size (16 layers, d_model 380, adaptive softmax).

    The paper's PTB result also uses variational dropout and weight averaging, which longseq does not implement.
    """
    return RunConfig(
        model=ModelConfig(
            vocab_size=10_000, n_layer=16, d_model=380, n_head=10, d_head=38, d_inner=900, dropout=0.5,
            dropatt=0.2, mem_len=70, cutoffs=[2000, 4000, 8000], div_val=1,
        ),
        data=DataConfig(tokenizer="word", tgt_len=70, batch_size=20, eval_tgt_len=70, eval_batch_size=10),
        train=TrainConfig(
            max_steps=100_000, lr=2.5e-4, min_lr=0.0, warmup_steps=1000, schedule="cosine", clip=0.25,
            eval_interval=2000, log_interval=200,
        ),
    )  # fmt: skip


PRESETS = {
    "tiny-shakespeare": tiny_shakespeare,
    "enwik8-base": enwik8_base,
    "text8-base": text8_base,
    "wt103-base": wt103_base,
    "ptb": ptb,
}


def get_preset(name: str) -> RunConfig:
    """Return a fresh :class:`RunConfig` for a preset name, or raise with the close matches."""
    if name not in PRESETS:
        close = difflib.get_close_matches(name, PRESETS, n=3, cutoff=0.4)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise ConfigError(f"unknown preset {name!r}{hint}; available: {', '.join(PRESETS)}")
    return PRESETS[name]()
