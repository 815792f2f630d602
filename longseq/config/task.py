"""What a run trains for, and the options of each task: one config class per task, of which a run holds the one its
``name`` chooses (:class:`TaskConfig`, a tagged union).  Each task's class in :mod:`longseq.tasks` names its options
class (``Classify.Options`` is :class:`ClassifyOptions`); they live here, at the bottom of the house, because a
stored run loads without the tasks and the recall generators (:mod:`longseq.data.recall`) read their options.

An option the chosen task does not read has no field to be set in: ``TaskConfig(name="span", pooling="mean")``,
``--set pooling=mean`` on a span run and a ``[task]`` table that sets it are unknown-key errors naming the option
and the tasks that read it.  Runs stored by the one flat class that held every task's options load through
:func:`longseq.config.stored.stored_task`."""

from __future__ import annotations

from dataclasses import field
from typing import ClassVar

from longseq.config.base import Variants, check, check_finite, config

RECALL_TASKS = ("passkey", "mqar", "copying", "induction")  # generated tasks: no training file


@config
class TaskConfig(Variants):
    """What a run trains for: ``lm`` (language modeling on ``data``; no options of its own, the run's
    ``RunConfig.task`` is None or this), a fine-tuning task (``classify``, ``span``, ``mlm``) or a recall task
    (``passkey``, ``mqar``, ``copying``, ``induction``).  ``TaskConfig(name=..., **options)`` and
    ``TaskConfig.from_dict`` give the task's options class; reachable by ``--set`` and in a config file's ``[task]``
    table."""

    name: str = "lm"
    VARIANTS: ClassVar[dict[str, type]] = {}  # each task's options class, filled below (TASK_OPTIONS)
    sees_whole_document: ClassVar[bool] = False  # its model reads a whole document at once (pattern.lowrank serves it)

    @classmethod
    def elsewhere(cls, key: str, owners: list[str], tag: str) -> str:
        return f"--{key.replace('_', '-')} (task.{key}) is an option of the {', '.join(owners)} task, not of {tag}"


@config
class LMOptions(TaskConfig):
    """Language modeling has no task options: its sampling and memory curriculum are the training config's
    (``TrainConfig.sample``, ``TrainConfig.curriculum``)."""

    name: str = "lm"


@config
class FinetuneOptions(TaskConfig):
    """What every fine-tuning task reads.  Each option's docstring is its ``longseq finetune`` flag's help
    (``--head-only``); ``written`` are the fields a run writes when it starts, which no one sets."""

    train: str = ""
    """training file: JSON lines (or a parquet/arrow table for classify and mlm)"""
    valid: str | None = None
    """validation file, in the same formats as the training file"""
    segment_len: int = 0
    """the length a document is read in (0: the checkpoint's tgt_len)"""
    base: str | None = None
    """the LM checkpoint it starts from"""
    head_only: bool = False
    """train the task head only"""
    group_by_length: bool = False
    """batches of documents of similar length (fewer filler segments per batch)"""
    sha256: dict = field(default_factory=dict)
    """the fingerprints of the files and of the base weights (a resume finds them at a new path by them)"""
    written: ClassVar[tuple[str, ...]] = ("sha256",)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_finite(self)
        check(bool(self.train), f"the {self.name} task needs its training file (--data FILE.jsonl)")
        check(self.segment_len >= 0, f"task.segment_len must be >= 0, got {self.segment_len}")


@config
class ClassifyOptions(FinetuneOptions):
    """Long-document classification (:mod:`longseq.tasks.classify`)."""

    name: str = "classify"
    labels: list[str] = field(default_factory=list)
    """the label set: the training file's"""
    pooling: str = "document"
    """document: the mean of the whole document, every segment trains; last: the last position, mean: the mean of
    the final segment (with a stop-gradient memory, last and mean train only the final segment)"""
    lm_weight: float = 0.0
    """lambda of a joint next-token loss"""
    text_column: str = "text"
    """the name of the text field in the files"""
    label_column: str = "label"
    """the name of the label field in the files"""
    sees_whole_document: ClassVar[bool] = True
    written: ClassVar[tuple[str, ...]] = ("sha256", "labels")

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.lm_weight >= 0, f"task.lm_weight must be >= 0, got {self.lm_weight}")


@config
class SpanOptions(FinetuneOptions):
    """Span extraction (:mod:`longseq.tasks.span`)."""

    name: str = "span"
    max_answer_len: int = 64
    """the longest answer in tokens"""

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.max_answer_len >= 1, f"task.max_answer_len must be >= 1 token, got {self.max_answer_len}")


@config
class MaskedLMOptions(FinetuneOptions):
    """Masked language modeling (:mod:`longseq.tasks.mlm`)."""

    name: str = "mlm"
    mask_rate: float = 0.15
    """the fraction of tokens chosen for masking"""
    mask_token: str | None = None
    """the token standing for [MASK] (unset: <unk>, or byte 0)"""
    mask_id: int = -1
    """the id of mask_token"""
    text_column: str = "text"
    """the name of the text field in the files"""
    sees_whole_document: ClassVar[bool] = True
    written: ClassVar[tuple[str, ...]] = ("sha256", "mask_id")

    def __post_init__(self) -> None:
        super().__post_init__()
        check(0.0 < self.mask_rate < 1.0, f"task.mask_rate must be in (0, 1), got {self.mask_rate}")


@config
class RecallOptions(TaskConfig):
    """The recall tasks (``passkey``, ``mqar``, ``copying``, ``induction``; :mod:`longseq.data.recall`) make their
    data: ``seq_len`` tokens a training sequence, read in segments of ``segment_len`` (0: ``tgt_len``) with the
    memory carried; ``min_distance``/``max_distance`` bound the passkey's distance (0: any that fits); ``key_len``
    digits a passkey; ``alphabet`` random tokens (filler, induction, copying); ``n_pairs`` key-value pairs (mqar);
    ``n_copy`` tokens to copy (copying); ``valid_size`` validation sequences."""

    name: str = "passkey"
    segment_len: int = 0
    seq_len: int = 256
    min_distance: int = 0
    max_distance: int = 0
    key_len: int = 3
    alphabet: int = 16
    n_pairs: int = 4
    n_copy: int = 16
    valid_size: int = 256

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.segment_len >= 0, f"task.segment_len must be >= 0, got {self.segment_len}")
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


@config
class DistillOptions(TaskConfig):
    """Knowledge distillation (:mod:`longseq.tasks.distill`): a language model (the run's model, the student) learns
    from ``teacher`` (a longseq checkpoint of the same tokenizer) through the KL divergence of their next-token
    distributions softened by ``temperature`` (Hinton et al., 2015), weighed by ``alpha`` beside the next-token loss
    (``1 - alpha``).  The teacher's distributions come from ``cache`` (a directory of its ``top_k`` logits at every
    position of the training split, written by ``longseq distill-cache`` or, when it is missing, at the start of the
    run into the run directory); ``teacher_sha256`` is the teacher's weights' fingerprint, written when the run
    starts."""

    name: str = "distill"
    teacher: str = ""
    cache: str | None = None
    top_k: int = 16
    temperature: float = 2.0
    alpha: float = 0.5
    teacher_sha256: str = ""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_finite(self)
        check(bool(self.teacher), "the distill task needs its teacher: a longseq checkpoint (--teacher DIR)")
        check(self.top_k >= 1, f"task.top_k must be >= 1, got {self.top_k}")
        check(self.temperature > 0, f"task.temperature must be > 0, got {self.temperature}")
        check(0.0 <= self.alpha <= 1.0, f"task.alpha must be in [0, 1], got {self.alpha}")


TASK_OPTIONS: dict[str, type[TaskConfig]] = {
    "lm": LMOptions,
    "classify": ClassifyOptions,
    "span": SpanOptions,
    "mlm": MaskedLMOptions,
    "distill": DistillOptions,
    **dict.fromkeys(RECALL_TASKS, RecallOptions),
}
TaskConfig.VARIANTS.update(TASK_OPTIONS)
FINETUNE_TASKS = tuple(name for name, options in TASK_OPTIONS.items() if issubclass(options, FinetuneOptions))
