"""The run's typed configs: data, training and evaluation, and the run that holds them with the model."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from longseq.config.base import ConfigError, JsonConfig, check, check_choice, check_finite, config
from longseq.config.model import ModelConfig

TOKENIZERS = ("byte", "char", "word", "bpe")
RECALL_TASKS = ("passkey", "mqar", "copying", "induction")  # generated tasks: no training file


@config
class DataConfig(JsonConfig):
    """Corpus, tokenizer and ordered LM batching.

    ``path`` is a file, a directory in a standard layout or a directory prepared by ``longseq data prepare``
    (``None`` = the bundled tiny-shakespeare).  ``tokenizer``: byte, char, word, bpe (a byte-level BPE of
    ``vocab_size`` tokens learnt from the training text), or the path of a tokenizer file (``.json``: ours, or
    an HF ``tokenizer.json`` such as GPT-2's).  ``varlen`` draws segment lengths around ``tgt_len`` as the paper's code does.
    ``doc_reset`` keeps documents apart (a directory of documents): no token attends to another document,
    in the segment or in the memory.  ``text_column``: the column that holds the text when ``path`` is a table
    (parquet, arrow, JSON lines; read through ``datasets``), its rows joined by newlines.
    """

    path: str | None = None
    tokenizer: str = "char"
    vocab_size: int = 8192
    lowercase: bool = False
    tgt_len: int = 64
    batch_size: int = 16
    eval_tgt_len: int = 64
    eval_batch_size: int = 16
    varlen: bool = False
    doc_reset: bool = False
    text_column: str = "text"

    def __post_init__(self) -> None:
        check(bool(self.text_column), "DataConfig.text_column must name a column")
        check(
            self.tokenizer in TOKENIZERS or self.tokenizer.endswith(".json"),
            f"DataConfig.tokenizer must be byte, char, word, bpe or the path of a tokenizer .json file, "
            f"got {self.tokenizer!r}",
        )
        check(256 <= self.vocab_size < 1 << 24, f"DataConfig.vocab_size must be in [256, 2**24), got {self.vocab_size}")
        for name in ("tgt_len", "batch_size", "eval_tgt_len", "eval_batch_size"):
            check(getattr(self, name) >= 1, f"DataConfig.{name} must be >= 1, got {getattr(self, name)}")


SCHEDULES = ("cosine", "linear", "inv_sqrt", "constant")


@config
class TrainConfig(JsonConfig):
    """Optimisation, schedule, evaluation cadence and checkpointing.

    NaN guard: a step whose loss or gradient norm is NaN or Inf is skipped (no update, the memory of the
    step before is kept) and logged; after ``nan_patience`` consecutive bad steps the run rolls back to the
    last checkpoint and multiplies the learning rate by ``nan_lr_factor`` (``nan_patience=0``: stop with an
    error at the first bad step).  ``keep_last`` > 1 keeps that many training checkpoints (``last`` plus
    ``history/step-N``); ``best`` is kept apart.

    Memory-length curriculum (gradual context expansion): with ``mem_len_start`` >= 0 training reads a memory of
    ``mem_len_start`` positions at first, growing linearly to the model's ``mem_len`` over ``mem_len_warmup_steps``,
    or over the fraction ``mem_len_warmup_frac`` of ``max_steps`` (one of the two), which keeps its share of a run
    whose ``max_steps`` is changed.

    Checkpoints of ``last`` are written at every validation (``eval_interval``), every ``save_interval`` steps
    (0: off), and at the first step boundary ``save_every_s`` seconds after the previous save (default 600: a
    SIGKILL loses at most ten minutes; 0: off), and when SIGINT, SIGTERM or SIGHUP asks the run to stop.

    Time budget: with ``max_time_s`` > 0 the run also ends at the first step boundary once its training wall time
    reaches ``max_time_s`` seconds, whichever of ``max_steps`` and ``max_time_s`` comes first: it validates (so
    ``best/`` is right), saves ``last/`` and says that it stopped on time at step N.  The time counted is the run's,
    across resumes (``elapsed_s`` in ``metrics.jsonl``, which a resume continues), as ``max_steps`` counts the
    run's steps: a run resumed with the budget it reached stops at once, one resumed with a larger budget (or
    only a larger ``max_steps``, when it ended on steps) continues exactly.  Time decides only where a run stops,
    never which batches or random numbers it uses.

    Progress: on a terminal a bar; elsewhere (a log, CI, a notebook, nohup) a plain line on the run's log after
    the first step, then at most every ``progress_interval_s`` seconds (0: none): step, loss, learning rate,
    tokens/s, elapsed time and the ETA (from the speed measured in this session; with ``max_time_s``, the
    earlier end).  Samples (language modeling only): every ``sample_interval`` steps (0: never) the run prints
    ``sample_tokens`` tokens the model writes after ``sample_prompt`` (empty: the first 16 tokens of the validation
    text) at ``sample_temperature`` (0: greedy), drawn from a generator of their own (seeded by ``seed`` and the
    step), so a run with samples trains exactly as one without.

    ``optimizer``: adamw or lamb; ``layer_lr_decay`` < 1 scales each layer's learning rate by decay^(depth from the
    top).  ``precision``: fp32, bf16 (autocast, CPU or GPU) or fp16 (autocast with dynamic loss scaling;
    on CPU it runs, slowly, for testing); attention logits, softmax and the loss stay in float32.  ``activation_checkpointing`` = k recomputes
    every k-th decoder layer in the backward pass instead of keeping its activations (0: off).
    ``grad_norm_interval`` = N logs every layer's gradient norm every N steps; ``tensorboard`` also writes the
    metrics as TensorBoard events (needs the tensorboard package), ``wandb`` logs them to Weights & Biases, project
    ``wandb_project`` (the ``wandb`` extra; ``WANDB_MODE=offline`` keeps them on disk: :mod:`longseq.train.tracking`).  ``device``: auto (cuda when available),
    cpu or cuda[:N]; under torchrun each rank takes cuda:LOCAL_RANK.  ``parallel``: how torchrun processes share
    the model, ddp (every rank holds all weights) or fsdp (weights, gradients and optimizer moments sharded
    across ranks, PyTorch's ``fully_shard``, one unit per decoder layer); one process ignores it.
    ``matmul_precision`` on a GPU: ``high`` (the default) lets float32 matmuls use TensorFloat-32, ``highest``
    keeps full float32, ``medium`` allows bfloat16 (:func:`longseq.runtime.set_matmul_precision`; no effect on
    the CPU).  ``compile`` = ``inductor`` runs a language model's training step through
    ``torch.compile(fullgraph=True)``: forward and backward in one graph each, compiled again only while the memory
    first fills (a few steps; then its length is dynamic, the memory-length curriculum included); validation stays
    eager.  ``aot_eager`` and ``eager`` trace without generating code (checks); ``none``, the default, is off.
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
    save_every_s: float = 600.0
    max_time_s: float = 0.0
    progress_interval_s: float = 30.0
    sample_interval: int = 0
    sample_tokens: int = 100
    sample_prompt: str = ""
    sample_temperature: float = 0.8
    mem_len_start: int = -1
    mem_len_warmup_steps: int = 0
    mem_len_warmup_frac: float = 0.0
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
    wandb: bool = False
    wandb_project: str = "longseq"
    device: str = "auto"
    parallel: str = "ddp"
    matmul_precision: str = "high"
    compile: str = "none"

    def __post_init__(self) -> None:
        check_finite(self)
        check(self.max_steps >= 1, f"TrainConfig.max_steps must be >= 1, got {self.max_steps}")
        check(self.nan_patience >= 0, f"TrainConfig.nan_patience must be >= 0, got {self.nan_patience}")
        check(0 < self.nan_lr_factor <= 1, f"TrainConfig.nan_lr_factor must be in (0, 1], got {self.nan_lr_factor}")
        check(self.keep_last >= 1, f"TrainConfig.keep_last must be >= 1, got {self.keep_last}")
        bad = sorted(set(self.wandb_project) & set("/\\#?%:"))  # W&B's own rule, checked before a run starts
        check(
            0 < len(self.wandb_project) <= 128 and not bad,
            f"TrainConfig.wandb_project {self.wandb_project!r} is not a W&B project name: 1 to 128 characters, none "
            f"of / \\ # ? % :" + (f" (it has {' '.join(bad)})" if bad else ""),
        )
        check(
            self.optimizer in ("adamw", "lamb"), f"TrainConfig.optimizer must be adamw or lamb, got {self.optimizer!r}"
        )
        check(0 < self.layer_lr_decay <= 1, f"TrainConfig.layer_lr_decay must be in (0, 1], got {self.layer_lr_decay}")
        check(
            self.precision in ("fp32", "bf16", "fp16"),
            f"TrainConfig.precision must be fp32, bf16 or fp16, got {self.precision!r}",
        )
        for name in ("activation_checkpointing", "grad_norm_interval"):
            check(getattr(self, name) >= 0, f"TrainConfig.{name} must be >= 0, got {getattr(self, name)}")
        check(
            self.device == "auto" or self.device.split(":")[0] in ("cpu", "cuda"),
            f"TrainConfig.device must be auto, cpu or cuda[:N], got {self.device!r}",
        )
        check(self.parallel in ("ddp", "fsdp"), f"TrainConfig.parallel must be ddp or fsdp, got {self.parallel!r}")
        check_choice("TrainConfig.matmul_precision", self.matmul_precision, ("highest", "high", "medium"))
        check_choice("TrainConfig.compile", self.compile, ("none", "inductor", "aot_eager", "eager"))
        check(self.lr > 0, f"TrainConfig.lr must be > 0, got {self.lr}")
        check(0 <= self.min_lr <= self.lr, f"TrainConfig.min_lr must be in [0, lr], got {self.min_lr}")
        check(self.schedule in SCHEDULES, f"TrainConfig.schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        check(
            self.mem_len_start >= -1, f"TrainConfig.mem_len_start must be >= 0 (or -1: off), got {self.mem_len_start}"
        )
        check(
            self.mem_len_warmup_steps >= 0,
            f"TrainConfig.mem_len_warmup_steps must be >= 0, got {self.mem_len_warmup_steps}",
        )
        check(
            0.0 <= self.mem_len_warmup_frac <= 1.0,
            f"TrainConfig.mem_len_warmup_frac must be in [0, 1], got {self.mem_len_warmup_frac}",
        )
        check(
            not (self.mem_len_warmup_frac and self.mem_len_warmup_steps),
            "set one of TrainConfig.mem_len_warmup_steps and mem_len_warmup_frac, not both",
        )
        for name in ("save_every_s", "max_time_s", "progress_interval_s"):
            check(getattr(self, name) >= 0, f"TrainConfig.{name} must be >= 0 (0 disables), got {getattr(self, name)}")
        check(
            self.sample_interval >= 0, f"TrainConfig.sample_interval must be >= 0 (0: off), got {self.sample_interval}"
        )
        check(self.sample_tokens >= 1, f"TrainConfig.sample_tokens must be >= 1, got {self.sample_tokens}")
        check(
            self.sample_temperature >= 0,
            f"TrainConfig.sample_temperature must be >= 0 (0: greedy), got {self.sample_temperature}",
        )
        for name in ("warmup_steps", "eval_max_segments", "save_interval"):
            check(getattr(self, name) >= 0, f"TrainConfig.{name} must be >= 0, got {getattr(self, name)}")
        for name in ("grad_accum", "eval_interval", "log_interval"):
            check(getattr(self, name) >= 1, f"TrainConfig.{name} must be >= 1, got {getattr(self, name)}")
        check(self.clip >= 0, f"TrainConfig.clip must be >= 0 (0 disables), got {self.clip}")
        check(self.weight_decay >= 0, f"TrainConfig.weight_decay must be >= 0, got {self.weight_decay}")
        for name in ("beta1", "beta2"):
            check(0 <= getattr(self, name) < 1, f"TrainConfig.{name} must be in [0, 1), got {getattr(self, name)}")
        check(self.eps > 0, f"TrainConfig.eps must be > 0, got {self.eps}")

    @property
    def mem_len_ramp_steps(self) -> int:
        """The steps over which the memory-length curriculum grows: ``mem_len_warmup_steps``, or
        ``mem_len_warmup_frac`` of ``max_steps``."""
        return self.mem_len_warmup_steps or round(self.mem_len_warmup_frac * self.max_steps)


@config
class EvalConfig(JsonConfig):
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
        check(
            self.split in ("train", "valid", "test"),
            f"EvalConfig.split must be train, valid or test, got {self.split!r}",
        )
        for name in ("tgt_len", "batch_size"):
            value = getattr(self, name)
            check(value is None or value >= 1, f"EvalConfig.{name} must be >= 1, got {value}")
        check(self.mem_len is None or self.mem_len >= 0, f"EvalConfig.mem_len must be >= 0, got {self.mem_len}")
        check(self.max_segments >= 0, f"EvalConfig.max_segments must be >= 0, got {self.max_segments}")


@config
class TaskConfig(JsonConfig):
    """What a run trains for: ``lm`` (language modeling on ``data``) or a fine-tuning task (``classify``, ``span``,
    ``mlm``; :mod:`longseq.tasks`), with its options, reachable by ``--set`` and in a config file's ``[task]`` table.

    Every fine-tuning task reads: ``train`` and ``valid`` (JSONL files), ``segment_len`` (the length a document is
    read in; 0: the LM's ``tgt_len``), ``base`` (the LM checkpoint it starts from), ``head_only`` (train the head
    alone), ``group_by_length`` (batches of documents of similar length) and ``sha256`` (the fingerprints of the
    files and of the base weights, written when the run starts: a resume finds them at a new path by them).
    ``classify`` reads ``labels`` (the training file's, written when the run starts), ``pooling`` (``document``:
    the mean over the whole document, every segment trained; ``last`` position or ``mean`` of the final segment)
    and ``lm_weight`` (a joint next-token loss); ``span`` reads ``max_answer_len`` (tokens); ``mlm`` reads
    ``mask_rate`` and ``mask_token`` (``mask_id``: its id, found when the run starts).  ``classify`` and ``mlm``
    read ``text_column`` (and ``classify`` ``label_column``): the names of those fields in the files (JSON lines,
    or parquet and arrow tables read through ``datasets``).  An option another task reads is refused for this
    one.

    The recall tasks (``passkey``, ``mqar``, ``copying``, ``induction``; :mod:`longseq.data.recall`) make their
    data: ``seq_len`` tokens a training sequence, read in segments of ``segment_len`` with the memory carried;
    ``min_distance``/``max_distance`` bound the passkey's distance (0: any that fits); ``key_len`` digits a
    passkey; ``alphabet`` random tokens (filler, induction, copying); ``n_pairs`` key-value pairs (mqar);
    ``n_copy`` tokens to copy (copying); ``valid_size`` validation sequences."""

    name: str = "lm"
    train: str = ""
    valid: str | None = None
    segment_len: int = 0
    base: str | None = None
    head_only: bool = False
    group_by_length: bool = False
    sha256: dict = field(default_factory=dict)
    labels: list[str] = field(default_factory=list)
    pooling: str = "document"
    lm_weight: float = 0.0
    max_answer_len: int = 64
    mask_rate: float = 0.15
    mask_token: str | None = None
    mask_id: int = -1
    text_column: str = "text"
    label_column: str = "label"
    seq_len: int = 256
    min_distance: int = 0
    max_distance: int = 0
    key_len: int = 3
    alphabet: int = 16
    n_pairs: int = 4
    n_copy: int = 16
    valid_size: int = 256

    def __post_init__(self) -> None:
        check_finite(self)
        check(bool(self.name), "task.name must name a task (lm, or a fine-tuning task)")
        check(
            self.name in ("lm", *RECALL_TASKS) or bool(self.train),
            f"the {self.name} task needs its training file (--data FILE.jsonl)",
        )
        for name in ("seq_len", "key_len", "n_pairs", "n_copy", "valid_size"):
            check(getattr(self, name) >= 1, f"task.{name} must be >= 1, got {getattr(self, name)}")
        check(2 <= self.alphabet <= 200, f"task.alphabet must be in [2, 200], got {self.alphabet}")
        check(
            self.name != "copying" or self.alphabet >= 3,
            f"task.alphabet must be >= 3 for copying (a noise token, a separator and a token to copy), got {self.alphabet}",
        )
        check(
            0 <= self.min_distance and (self.max_distance == 0 or self.min_distance <= self.max_distance),
            f"task.min_distance and max_distance must satisfy 0 <= min <= max (max 0: any), got "
            f"{self.min_distance}, {self.max_distance}",
        )
        check(self.segment_len >= 0, f"task.segment_len must be >= 0, got {self.segment_len}")
        check(self.lm_weight >= 0, f"task.lm_weight must be >= 0, got {self.lm_weight}")
        check(self.max_answer_len >= 1, f"task.max_answer_len must be >= 1 token, got {self.max_answer_len}")
        check(0.0 < self.mask_rate < 1.0, f"task.mask_rate must be in (0, 1), got {self.mask_rate}")


@dataclass
class RunConfig:
    """The configs of a training run, stored together in every checkpoint: the model, the data, the training, and
    for fine-tuning the task (None: language modeling)."""

    model: ModelConfig
    data: DataConfig
    train: TrainConfig
    task: TaskConfig | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {"model": self.model.to_dict(), "data": self.data.to_dict(), "train": self.train.to_dict()}
        return out if self.task is None else {**out, "task": self.task.to_dict()}

    def sections(self) -> dict[str, JsonConfig]:
        """The configs by section name (the task's too, when there is one), as
        :func:`~longseq.config.base.apply_overrides` takes them and ``RunConfig(**sections)`` puts them back."""
        out = {"model": self.model, "data": self.data, "train": self.train}
        return out if self.task is None else {**out, "task": self.task}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunConfig:
        if not isinstance(data, dict) or not {"model", "data", "train"} <= set(data) <= {
            "model",
            "data",
            "train",
            "task",
        }:
            keys = sorted(data) if isinstance(data, dict) else type(data).__name__
            raise ConfigError(
                f"a run config needs the sections model, data and train (and optionally task), got {keys}"
            )
        return cls(
            model=ModelConfig.from_dict(data["model"]),
            data=DataConfig.from_dict(data["data"]),
            train=TrainConfig.from_dict(data["train"]),
            task=TaskConfig.from_dict(data["task"]) if data.get("task") is not None else None,
        )
