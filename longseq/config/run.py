"""The run's typed configs: data, evaluation and the task, and the run that holds them with the model and the
training (:mod:`longseq.config.train`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from longseq.config.base import ConfigError, JsonConfig, check, check_finite, config
from longseq.config.model import ModelConfig, Recurrence
from longseq.config.train import SCHEDULES, TrainConfig

__all__ = [
    "RECALL_TASKS",
    "SCHEDULES",
    "TOKENIZERS",
    "DataConfig",
    "EvalConfig",
    "RunConfig",
    "TaskConfig",
    "TrainConfig",
]

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


@config
class EvalConfig(JsonConfig):
    """Evaluation-time settings; ``None`` keeps the checkpoint's own value.

    The paper evaluates with a much longer memory than it trains with, e.g. WikiText-103 with
    ``tgt_len=64, mem_len=640, clamp_len=400, same_length=True``.  ``mem_len``, ``clamp_len`` and ``same_length``
    are one :class:`~longseq.config.model.Recurrence` for a model: :meth:`recurrence`.
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

    def recurrence(self, model: ModelConfig) -> Recurrence:
        """The recurrence of an evaluation of a ``model``: its own, with the values set here in place of its own."""
        return model.recurrence(mem_len=self.mem_len, clamp_len=self.clamp_len, same_length=self.same_length)


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
