"""The run's typed configs: data and evaluation, and the run that holds them with the model, the training
(:mod:`longseq.config.train`) and the task's options (:mod:`longseq.config.task`)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from longseq.config.base import ConfigError, JsonConfig, check, config
from longseq.config.model import SINK_POSITIONS, ModelConfig, PositionConfig, Recurrence
from longseq.config.stored import stored_run
from longseq.config.task import RECALL_TASKS, TaskConfig
from longseq.config.train import SCHEDULES, TrainConfig

__all__ = [
    "RECALL_TASKS",
    "SCHEDULES",
    "DataConfig",
    "EvalConfig",
    "RunConfig",
    "TaskConfig",
    "TrainConfig",
]


@config
class DataConfig(JsonConfig):
    """Corpus, tokenizer and ordered LM batching.

    ``path`` is a file, a directory in a standard layout or a directory prepared by ``longseq data prepare``
    (``None`` = the bundled tiny-shakespeare).  ``tokenizer``: a kind of :data:`longseq.data.tokenizers.TOKENIZERS`
    (byte, char, word, bpe: a byte-level BPE of ``vocab_size`` tokens learnt from the training text, ...; the data
    layer names the kinds when a run reads its corpus), or the path of a tokenizer file (``.json``: ours, or an HF
    ``tokenizer.json`` such as GPT-2's).  ``varlen`` draws segment lengths around ``tgt_len`` as the paper's code does.
    ``doc_reset`` keeps documents apart (a directory of documents): no token attends to another document,
    in the segment or in the memory.  ``text_column``: the column that holds the text when ``path`` is a table
    (parquet, arrow, JSON lines; read through ``datasets``), its rows joined by newlines.  ``rc_prob``: reverse-complement
    augmentation of DNA (a tokenizer with a complement, ``nucleotide``): language modeling reads each row of the
    stream as its other strand for a whole pass with this probability (the memory always holds the strand's own
    past), classification and masked LM read each training example so.  ``clip_seconds``: audio files are cut into clips of this length, each a line of the
    text (0: every file whole; docs/modalities.md).
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
    rc_prob: float = 0.0
    clip_seconds: float = 0.0

    def __post_init__(self) -> None:
        check(bool(self.text_column), "DataConfig.text_column must name a column")
        check(0.0 <= self.rc_prob <= 1.0, f"DataConfig.rc_prob must be in [0, 1], got {self.rc_prob}")
        check(self.clip_seconds >= 0, f"DataConfig.clip_seconds must be >= 0 (0: whole files), got {self.clip_seconds}")
        check(
            bool(self.tokenizer.strip()),
            "DataConfig.tokenizer must name a tokenizer kind (byte, char, word, bpe, ...) or a tokenizer .json file",
        )
        check(256 <= self.vocab_size < 1 << 24, f"DataConfig.vocab_size must be in [256, 2**24), got {self.vocab_size}")
        for name in ("tgt_len", "batch_size", "eval_tgt_len", "eval_batch_size"):
            check(getattr(self, name) >= 1, f"DataConfig.{name} must be >= 1, got {getattr(self, name)}")


@config
class EvalConfig(JsonConfig):
    """Evaluation-time settings; ``None`` keeps the checkpoint's own value.

    The paper evaluates with a much longer memory than it trains with, e.g. WikiText-103 with
    ``tgt_len=64, mem_len=640, clamp_len=400, same_length=True``.  ``mem_len``, ``clamp_len``, ``same_length``,
    ``sinks`` and ``sink_positions`` (attention sinks, :class:`~longseq.config.model.MemoryConfig`) are one
    :class:`~longseq.config.model.Recurrence` for a model: :meth:`recurrence`.  ``rope_scaling``, ``rope_factor`` and
    ``rope_original_len`` replace a rope model's own (:class:`~longseq.config.model.PositionConfig`) for the
    evaluation, e.g. ``rope_scaling=ntk, rope_factor=4`` with a memory four times the trained one: :meth:`positions`.
    """

    split: str = "valid"
    tgt_len: int | None = None
    mem_len: int | None = None
    clamp_len: int | None = None
    same_length: bool | None = None
    sinks: int | None = None
    sink_positions: str | None = None
    batch_size: int | None = None
    max_segments: int = 0
    rope_scaling: str | None = None
    rope_factor: float | None = None
    rope_original_len: int | None = None

    def __post_init__(self) -> None:
        check(
            self.split in ("train", "valid", "test"),
            f"EvalConfig.split must be train, valid or test, got {self.split!r}",
        )
        for name in ("tgt_len", "batch_size"):
            value = getattr(self, name)
            check(value is None or value >= 1, f"EvalConfig.{name} must be >= 1, got {value}")
        check(self.mem_len is None or self.mem_len >= 0, f"EvalConfig.mem_len must be >= 0, got {self.mem_len}")
        check(self.sinks is None or self.sinks >= 0, f"EvalConfig.sinks must be >= 0, got {self.sinks}")
        check(
            self.sink_positions in (None, *SINK_POSITIONS),
            f"EvalConfig.sink_positions must be one of {', '.join(SINK_POSITIONS)}, got {self.sink_positions!r}",
        )
        check(self.max_segments >= 0, f"EvalConfig.max_segments must be >= 0, got {self.max_segments}")

    ROPE = ("rope_scaling", "rope_factor", "rope_original_len")

    def positions(self, model: ModelConfig) -> PositionConfig:
        """The positions of an evaluation of a ``model``: its own, with the rope settings given here in place of its
        own (checked as a training config's)."""
        given = {name: getattr(self, name) for name in self.ROPE if getattr(self, name) is not None}
        return replace(model.positions, **given)

    def recurrence(self, model: ModelConfig) -> Recurrence:
        """The recurrence of an evaluation of a ``model``: its own, with the values set here in place of its own."""
        return model.recurrence(
            mem_len=self.mem_len,
            clamp_len=self.clamp_len,
            same_length=self.same_length,
            sinks=self.sinks,
            sink_positions=self.sink_positions,
        )


@dataclass
class RunConfig:
    """The configs of a training run, stored together in every checkpoint: the model, the data, the training, and
    the task's options (:class:`~longseq.config.task.TaskConfig`, the class of the task its ``name`` chooses; None:
    language modeling).  :meth:`from_dict` reads a stored run of any version (one without a format number: its keys
    say, :func:`~longseq.config.stored.stored_run`)."""

    model: ModelConfig
    data: DataConfig
    train: TrainConfig
    task: TaskConfig | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {"model": self.model.to_dict(), "data": self.data.to_dict(), "train": self.train.to_dict()}
        return out if self.task is None else {**out, "task": self.task.to_dict()}

    @property
    def is_language_model(self) -> bool:
        """Whether the run's checkpoints are language models (``eval``, ``generate``, ``convert`` read them):
        language modeling, distillation and attention transfer (their students), fine-tuning one on a text (``clm``)."""
        return self.task is None or self.task.is_language_model

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
        data = stored_run(data)
        return cls(
            model=ModelConfig.from_dict(data["model"]),
            data=DataConfig.from_dict(data["data"]),
            train=TrainConfig.from_dict(data["train"]),
            task=TaskConfig.from_dict(data["task"]) if data.get("task") is not None else None,
        )
