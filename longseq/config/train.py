"""The training run's config, in sections by the module that reads each: ``optim`` (train/optim.py), ``checkpoint``
(the Trainer's saving, train/checkpoint.py), ``logging`` (metrics, progress, train/tracking.py), ``sample``
(tasks/lm.py), ``curriculum`` (tasks/lm.py) and ``runtime`` (train/distributed.py, runtime.py); the loop's own
fields are at the top.

``TrainConfig(lr=3e-4, keep_last=2)`` takes its sections' fields by name, as ``--set lr=3e-4`` and a ``[train]``
table with ``lr = 3e-4`` do (``--set optim.lr=3e-4``, ``train.lr`` and ``train.optim.lr`` name the same field).  A
run config stored before the sections (every field flat under ``train``) reads the same.
"""

from __future__ import annotations

from dataclasses import field

from longseq.config.base import JsonConfig, check, check_choice, check_finite, config

SCHEDULES = ("cosine", "linear", "inv_sqrt", "constant")


@config
class OptimConfig(JsonConfig):
    """The optimizer and the learning-rate schedule (:mod:`longseq.train.optim`).

    ``optimizer``: adamw or lamb.  The learning rate warms up linearly over ``warmup_steps``, then follows
    ``schedule`` (``cosine`` and ``linear`` decay from ``lr`` to ``min_lr`` at ``max_steps``; ``inv_sqrt``;
    ``constant``).  ``clip`` bounds the gradient norm (0: off).  ``layer_lr_decay`` < 1 scales each layer's
    learning rate by decay^(depth from the top)."""

    lr: float = 1e-3
    min_lr: float = 1e-5
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    warmup_steps: int = 100
    schedule: str = "cosine"
    clip: float = 0.25
    optimizer: str = "adamw"
    layer_lr_decay: float = 1.0

    def __post_init__(self) -> None:
        check_finite(self)
        check(self.optimizer in ("adamw", "lamb"), f"optim.optimizer must be adamw or lamb, got {self.optimizer!r}")
        check(0 < self.layer_lr_decay <= 1, f"optim.layer_lr_decay must be in (0, 1], got {self.layer_lr_decay}")
        check(self.lr > 0, f"optim.lr must be > 0, got {self.lr}")
        check(0 <= self.min_lr <= self.lr, f"optim.min_lr must be in [0, lr], got {self.min_lr}")
        check(self.schedule in SCHEDULES, f"optim.schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        check(self.warmup_steps >= 0, f"optim.warmup_steps must be >= 0, got {self.warmup_steps}")
        check(self.clip >= 0, f"optim.clip must be >= 0 (0 disables), got {self.clip}")
        check(self.weight_decay >= 0, f"optim.weight_decay must be >= 0, got {self.weight_decay}")
        for name in ("beta1", "beta2"):
            check(0 <= getattr(self, name) < 1, f"optim.{name} must be in [0, 1), got {getattr(self, name)}")
        check(self.eps > 0, f"optim.eps must be > 0, got {self.eps}")


@config
class CheckpointConfig(JsonConfig):
    """When ``last/`` is written besides every validation and a stop: every ``save_interval`` steps (0: off), and
    at the first step boundary ``save_every_s`` seconds after the previous save (default 600: a SIGKILL loses at
    most ten minutes; 0: off).  ``keep_last`` > 1 keeps that many training checkpoints (``last`` plus
    ``history/step-N``); ``best`` is kept apart."""

    save_interval: int = 0
    save_every_s: float = 600.0
    keep_last: int = 1

    def __post_init__(self) -> None:
        check_finite(self)
        check(self.save_interval >= 0, f"checkpoint.save_interval must be >= 0, got {self.save_interval}")
        check(self.save_every_s >= 0, f"checkpoint.save_every_s must be >= 0 (0 disables), got {self.save_every_s}")
        check(self.keep_last >= 1, f"checkpoint.keep_last must be >= 1, got {self.keep_last}")


@config
class LoggingConfig(JsonConfig):
    """What the run writes for people and tools (:mod:`longseq.train.tracking`, :mod:`longseq.progress`).

    ``metrics.jsonl`` gets the loss every ``log_interval`` steps; ``grad_norm_interval`` = N logs every layer's
    gradient norm every N steps (0: off).  On a terminal a progress bar; elsewhere (a log, CI, nohup) a plain line
    after the first step, then at most every ``progress_interval_s`` seconds (0: none).  ``tensorboard`` also
    writes the metrics as TensorBoard events (the tensorboard package); ``wandb`` logs them to Weights & Biases,
    project ``wandb_project`` (the ``wandb`` extra; ``WANDB_MODE=offline`` keeps them on disk)."""

    log_interval: int = 20
    progress_interval_s: float = 30.0
    grad_norm_interval: int = 0
    tensorboard: bool = False
    wandb: bool = False
    wandb_project: str = "longseq"

    def __post_init__(self) -> None:
        check_finite(self)
        check(self.log_interval >= 1, f"logging.log_interval must be >= 1, got {self.log_interval}")
        check(
            self.progress_interval_s >= 0,
            f"logging.progress_interval_s must be >= 0 (0 disables), got {self.progress_interval_s}",
        )
        check(self.grad_norm_interval >= 0, f"logging.grad_norm_interval must be >= 0, got {self.grad_norm_interval}")
        bad = sorted(set(self.wandb_project) & set("/\\#?%:"))  # W&B's own rule, checked before a run starts
        check(
            0 < len(self.wandb_project) <= 128 and not bad,
            f"logging.wandb_project {self.wandb_project!r} is not a W&B project name: 1 to 128 characters, none "
            f"of / \\ # ? % :" + (f" (it has {' '.join(bad)})" if bad else ""),
        )


@config
class SampleConfig(JsonConfig):
    """Samples while training a language model (:mod:`longseq.tasks.lm`): every ``sample_interval`` steps (0:
    never) the run prints ``sample_tokens`` tokens the model writes after ``sample_prompt`` (empty: the first 16
    tokens of the validation text) at ``sample_temperature`` (0: greedy), drawn from a generator of their own
    (seeded by ``seed`` and the step), so a run with samples trains exactly as one without."""

    sample_interval: int = 0
    sample_tokens: int = 100
    sample_prompt: str = ""
    sample_temperature: float = 0.8

    def __post_init__(self) -> None:
        check_finite(self)
        check(self.sample_interval >= 0, f"sample.sample_interval must be >= 0 (0: off), got {self.sample_interval}")
        check(self.sample_tokens >= 1, f"sample.sample_tokens must be >= 1, got {self.sample_tokens}")
        check(
            self.sample_temperature >= 0,
            f"sample.sample_temperature must be >= 0 (0: greedy), got {self.sample_temperature}",
        )


@config
class CurriculumConfig(JsonConfig):
    """The memory-length curriculum (gradual context expansion, :mod:`longseq.tasks.lm`): with ``mem_len_start``
    >= 0 training reads a memory of ``mem_len_start`` positions at first, growing linearly to the model's
    ``mem_len`` over ``mem_len_warmup_steps``, or over the fraction ``mem_len_warmup_frac`` of ``max_steps`` (one
    of the two), which keeps its share of a run whose ``max_steps`` is changed.  -1: off."""

    mem_len_start: int = -1
    mem_len_warmup_steps: int = 0
    mem_len_warmup_frac: float = 0.0

    def __post_init__(self) -> None:
        check_finite(self)
        check(
            self.mem_len_start >= -1,
            f"curriculum.mem_len_start must be >= 0 (or -1: off), got {self.mem_len_start}",
        )
        check(
            self.mem_len_warmup_steps >= 0,
            f"curriculum.mem_len_warmup_steps must be >= 0, got {self.mem_len_warmup_steps}",
        )
        check(
            0.0 <= self.mem_len_warmup_frac <= 1.0,
            f"curriculum.mem_len_warmup_frac must be in [0, 1], got {self.mem_len_warmup_frac}",
        )
        check(
            not (self.mem_len_warmup_frac and self.mem_len_warmup_steps),
            "set one of curriculum.mem_len_warmup_steps and mem_len_warmup_frac, not both",
        )


@config
class RuntimeConfig(JsonConfig):
    """Where and how the steps run (:mod:`longseq.train.distributed`, :mod:`longseq.runtime`): none of it changes
    what is computed beyond rounding.

    ``device``: auto (cuda when available), cpu or cuda[:N]; under torchrun each rank takes cuda:LOCAL_RANK.
    ``parallel``: how torchrun processes share the model, ddp (every rank holds all weights) or fsdp (weights,
    gradients and optimizer moments sharded across ranks, PyTorch's ``fully_shard``, one unit per layer of the
    stack); one process ignores it.  ``precision``: fp32, bf16 (autocast, CPU or GPU) or fp16 (autocast with
    dynamic loss scaling; on CPU it runs, slowly, for testing); attention logits, softmax and the loss stay in
    float32.  ``matmul_precision`` on a GPU: ``high`` (the default) lets float32 matmuls use TensorFloat-32,
    ``highest`` keeps full float32, ``medium`` allows bfloat16 (:func:`longseq.runtime.set_matmul_precision`; no
    effect on the CPU).  ``compile`` = ``inductor`` runs a language model's training step through
    ``torch.compile(fullgraph=True)``: forward and backward in one graph each, compiled again only while the
    memory first fills (a few steps; then its length is dynamic, the memory-length curriculum included);
    validation stays eager.  ``aot_eager`` and ``eager`` trace without generating code (checks); ``none``, the
    default, is off.  ``activation_checkpointing`` = k recomputes every k-th layer in the backward pass instead of
    keeping its activations (0: off)."""

    device: str = "auto"
    parallel: str = "ddp"
    precision: str = "fp32"
    matmul_precision: str = "high"
    compile: str = "none"
    activation_checkpointing: int = 0

    def __post_init__(self) -> None:
        check(
            self.device == "auto" or self.device.split(":")[0] in ("cpu", "cuda"),
            f"runtime.device must be auto, cpu or cuda[:N], got {self.device!r}",
        )
        check(self.parallel in ("ddp", "fsdp"), f"runtime.parallel must be ddp or fsdp, got {self.parallel!r}")
        check(
            self.precision in ("fp32", "bf16", "fp16"),
            f"runtime.precision must be fp32, bf16 or fp16, got {self.precision!r}",
        )
        check_choice("runtime.matmul_precision", self.matmul_precision, ("highest", "high", "medium"))
        check_choice("runtime.compile", self.compile, ("none", "inductor", "aot_eager", "eager"))
        check(
            self.activation_checkpointing >= 0,
            f"runtime.activation_checkpointing must be >= 0, got {self.activation_checkpointing}",
        )


@config
class TrainConfig(JsonConfig):
    """The training loop: how long it runs, how it validates, its seed and its NaN guard; each other concern in
    the section of the module that reads it (:mod:`longseq.config.train`).

    The run ends at ``max_steps``, or at the first step boundary once its training wall time reaches
    ``max_time_s`` seconds (> 0), whichever comes first: it validates (so ``best/`` is right), saves ``last/`` and
    says that it stopped on time at step N.  The time counted is the run's, across resumes (``elapsed_s`` in
    ``metrics.jsonl``, which a resume continues), as ``max_steps`` counts the run's steps: a run resumed with the
    budget it reached stops at once, one resumed with a larger budget (or only a larger ``max_steps``, when it
    ended on steps) continues exactly.  Time decides only where a run stops, never which batches or random
    numbers it uses.  ``grad_accum`` splits each step's batch into that many chunks.  Validation runs every
    ``eval_interval`` steps, over at most ``eval_max_segments`` segments (0: all), and writes ``last/`` and
    (when better) ``best/``.

    NaN guard: a step whose loss or gradient norm is NaN or Inf is skipped (no update, the memory of the step
    before is kept) and logged; after ``nan_patience`` consecutive bad steps the run rolls back to the last
    checkpoint and multiplies the learning rate by ``nan_lr_factor`` (``nan_patience=0``: stop with an error at
    the first bad step).
    """

    max_steps: int = 1200
    max_time_s: float = 0.0
    grad_accum: int = 1
    eval_interval: int = 300
    eval_max_segments: int = 0
    seed: int = 1111
    nan_patience: int = 3
    nan_lr_factor: float = 0.5
    optim: OptimConfig = field(default_factory=OptimConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    sample: SampleConfig = field(default_factory=SampleConfig)
    curriculum: CurriculumConfig = field(default_factory=CurriculumConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)

    def __post_init__(self) -> None:
        check_finite(self)
        check(self.max_steps >= 1, f"TrainConfig.max_steps must be >= 1, got {self.max_steps}")
        check(self.max_time_s >= 0, f"TrainConfig.max_time_s must be >= 0 (0 disables), got {self.max_time_s}")
        for name in ("grad_accum", "eval_interval"):
            check(getattr(self, name) >= 1, f"TrainConfig.{name} must be >= 1, got {getattr(self, name)}")
        check(self.eval_max_segments >= 0, f"TrainConfig.eval_max_segments must be >= 0, got {self.eval_max_segments}")
        check(self.nan_patience >= 0, f"TrainConfig.nan_patience must be >= 0, got {self.nan_patience}")
        check(0 < self.nan_lr_factor <= 1, f"TrainConfig.nan_lr_factor must be in (0, 1], got {self.nan_lr_factor}")

    @property
    def mem_len_ramp_steps(self) -> int:
        """The steps over which the memory-length curriculum grows: ``mem_len_warmup_steps``, or
        ``mem_len_warmup_frac`` of ``max_steps``."""
        c = self.curriculum
        return c.mem_len_warmup_steps or round(c.mem_len_warmup_frac * self.max_steps)
