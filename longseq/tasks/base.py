"""The task interface the one :class:`~longseq.train.trainer.Trainer` trains, and what tasks share.

A task says how a run's examples are read, encoded and batched, what one optimizer step computes, how a model is
scored and how it predicts.  Language modeling is a task (:mod:`longseq.tasks.lm`) like the fine-tuning ones
(classify, span, mlm); a new task is one file with a :class:`Task` subclass, registered in :mod:`longseq.tasks`.

Batches are drawn by a stateful, JSON-serialisable iterator, so a resumed run reads exactly the batches the
uninterrupted run would have read.  The trainer hands each step a :class:`StepContext`: the (possibly
DDP-wrapped) model, the device, this rank's rows, mixed-precision autocast and the loss-scaling backward.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn

from longseq.config.base import ConfigError
from longseq.config.run import RunConfig
from longseq.config.task import FinetuneOptions, LMOptions, TaskConfig
from longseq.model.attention.lowrank import LowRankProjection
from longseq.model.memory import Memory


@dataclass
class StepContext:
    """What the trainer lends a task for one optimizer step."""

    net: nn.Module  # the model as it runs (DDP-wrapped under torchrun)
    device: torch.device
    rows: slice  # this rank's share of the batch rows
    grad_accum: int
    autocast_dtype: torch.dtype | None = None
    scaler: object | None = None  # the fp16 GradScaler, or None
    step: int = 0  # the optimizer step being computed (0-based), for schedules a task follows

    def autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def backward(self, loss: Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()


@dataclass
class StepResult:
    """One optimizer step's mean training loss (this rank; a 0-d tensor on the model's device, or a float), the
    memory carried to the next step (the LM's, else None) and the tokens it consumed: for the example tasks, the
    documents' tokens before padding."""

    loss: Tensor | float
    memory: Memory | None
    tokens: int


class Task:
    """The interface; see the module docstring.  Subclasses set ``name`` and ``Options``: the class of their options
    (:mod:`longseq.config.task`), the run's ``task`` section; an option the task does not read has no field there."""

    name = ""
    Options: type[TaskConfig] = LMOptions
    writes_samples = False  # whether :meth:`sample` is implemented (``TrainConfig.sample.sample_interval``)
    gold_field: str | None = None  # the field of an input record holding the answer :meth:`predict` gives (scored)
    progress = False  # whether :meth:`validate` may show its progress (the Trainer says, for the run's main rank)

    @classmethod
    def checkpoint_kind(cls) -> str:
        """What a checkpoint of this task is, and the command that reads it: the words of the commands that cannot
        (``eval``, ``generate`` and ``predict`` say which one can)."""
        return f"fine-tuned for {cls.name}: longseq predict gives its predictions"

    def __init__(self, run: RunConfig, tokenizer, log=None, base: nn.Module | None = None) -> None:
        self.run, self.tokenizer, self.base = run, tokenizer, base  # base: the LM a new fine-tuning run starts from
        self.run_dir: str | None = None  # the run's directory (the Trainer says), for what a task writes beside it
        self.log = log or (lambda message: None)

    @property
    def options(self) -> TaskConfig:
        """The run's task section: this task's options (an instance of ``Options``)."""
        return self.run.task

    @property
    def segment_len(self) -> int:
        """The segment a task reads at a time: its own ``segment_len``, else the run's ``tgt_len``."""
        return self.options.segment_len or self.run.data.tgt_len

    def set_options(self, **values) -> None:
        """Record what the run found when it started (labels, a mask token's id) in its task section."""
        self.run = RunConfig(self.run.model, self.run.data, self.run.train, self.run.task.replace(**values))

    def prepare(self) -> RunConfig:
        """Read what the run needs (data, labels) and return the run config completed by it."""
        return self.run

    def build_model(self) -> nn.Module:
        """A fresh model for the run (initialised; the trainer then restores or :meth:`initialize`-s it)."""
        raise NotImplementedError

    def initialize(self, model: nn.Module) -> None:
        """Prepare a new run's model (fine-tuning: load the base LM's weights)."""

    def trainable(self, model: nn.Module) -> list | None:
        """The parameters that train (head-only fine-tuning), or None for all; applied on every build."""
        return None

    def data_fingerprint(self) -> dict | None:
        """The sha256 of what the run trains and validates on, by part (``{"train": ..., "valid": ...}``), recorded
        in every training checkpoint: a resume on other data is refused, on the same data at a new path accepted.
        None: the task checks its files itself (fine-tuning records them in its options)."""
        return None

    def batches(self, world):
        """The stateful training batch iterator (``next()``, ``state_dict()``, ``load_state_dict()``)."""
        raise NotImplementedError

    def train_step(self, ctx: StepContext, batch, memory: Memory | None) -> StepResult:
        """Forward and backward of one optimizer step (``ctx.backward`` each loss part)."""
        raise NotImplementedError

    def validate(self, model: nn.Module, sharded: bool = False) -> dict:
        """Validation metrics; ``loss`` (lower is better) picks the best checkpoint.  Empty without validation data."""
        return {}

    def unigram_bpc(self) -> float | None:
        """Bits per character of a unigram model of the training data on the validation data: the baseline a
        character or byte model must beat (language modeling); None where it means nothing."""
        return None

    def report(self, model: nn.Module) -> dict:
        """The task's final metrics (fine-tuning: train and valid), for the command line."""
        return {}

    def sample(self, model: nn.Module, step: int) -> tuple[str, str]:
        """What the model writes at optimizer step ``step``, as (a header naming the settings, the text), drawn from a
        generator of its own: the global RNG is not read.  Tasks with ``writes_samples`` only."""
        raise ConfigError(f"the {self.name} task writes no samples")

    def predict(self, model: nn.Module, records: list[dict], path: str = "input") -> list[dict]:
        """One output per input record of ``path`` (named in errors): ``prediction`` plus scores."""
        raise ConfigError(f"the {self.name} task has no predictions: a checkpoint of it is {self.checkpoint_kind()}")

    def check_gold(self, located: list[tuple[str, dict]], data: str, checkpoint: str) -> None:
        """Refuse, naming where, a record of ``located`` ((its place in ``data``, the record)) whose
        :attr:`gold_field` this model cannot score (its type, a label it does not know): it would be counted as a
        wrong prediction.  Records without the field are not scored and pass."""

    def score_predictions(self, records: list[dict], outputs: list[dict]) -> dict:
        """The metrics of ``outputs`` (:meth:`predict`'s, one per record) against the records' :attr:`gold_field`
        (every record given has it), as validation reports them."""
        return {}


class ExampleBatches:
    """Shuffled batches of example indices, epoch after epoch; the order of epoch e is a permutation drawn from
    (seed, e), so the state is two integers and a resumed run draws the same batches."""

    def __init__(self, n: int, batch_size: int, seed: int) -> None:
        if n < 1:
            raise ConfigError("no training examples")
        self.n, self.batch_size, self.seed = n, batch_size, seed
        self.epoch, self.position = 0, 0

    def _order(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, epoch]).permutation(self.n)

    def next(self) -> list[int]:
        picked: list[int] = []
        while len(picked) < min(self.batch_size, self.n):
            order = self._order(self.epoch)
            take = order[self.position : self.position + self.batch_size - len(picked)]
            picked += take.tolist()
            self.position += len(take)
            if self.position >= self.n:
                self.epoch, self.position = self.epoch + 1, 0
        return picked

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])


class LengthGroupedBatches(ExampleBatches):
    """Batches of documents of similar length, epoch after epoch, so a batch pads few documents to its longest: the
    epoch's permutation, drawn from (seed, epoch) as in :class:`ExampleBatches`, is cut into pools of ``pool``
    batches; each pool is sorted by length and cut into batches, and the epoch's batches are shuffled.  Every
    batch is full: the ``n % batch_size`` documents left over are skipped that epoch (others the next).  A batch of
    long documents reads as many segments as before; one of short documents, far fewer.  The state is the epoch
    and the batch within it (the state of :class:`ExampleBatches`), so a resumed run draws the same batches."""

    def __init__(self, lengths: list[int], batch_size: int, seed: int, pool: int = 50) -> None:
        super().__init__(len(lengths), min(batch_size, max(1, len(lengths))), seed)
        self.lengths, self.pool = np.asarray(lengths), pool
        self._cached: tuple[int, list[list[int]]] | None = None

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        if self._cached is None or self._cached[0] != epoch:
            rng = np.random.default_rng([self.seed, epoch])
            order, size = rng.permutation(len(self.lengths)), self.batch_size * self.pool
            pools = [order[i : i + size] for i in range(0, len(order), size)]
            grouped = np.concatenate([p[np.argsort(self.lengths[p], kind="stable")] for p in pools])
            batches = [grouped[i : i + self.batch_size].tolist() for i in range(0, len(grouped), self.batch_size)]
            batches = [b for b in batches if len(b) == self.batch_size]
            self._cached = (epoch, [batches[i] for i in rng.permutation(len(batches))])
        return self._cached[1]

    def next(self) -> list[int]:
        batches = self.epoch_batches(self.epoch)
        picked = batches[self.position]
        self.position += 1
        if self.position == len(batches):
            self.epoch, self.position = self.epoch + 1, 0
        return picked


def training_batches(lengths: list[int], options: FinetuneOptions, batch_size: int, seed: int) -> ExampleBatches:
    """The sampler of a fine-tuning run: shuffled batches, or batches grouped by length (``group_by_length``)."""
    if options.group_by_length:
        return LengthGroupedBatches(lengths, batch_size, seed)
    return ExampleBatches(len(lengths), batch_size, seed)


def check_reverse_complement(run: RunConfig, tokenizer) -> None:
    """``data.rc_prob`` > 0 needs a tokenizer whose ids have complements (DNA), and, for a stream, no documents."""
    d = run.data
    if d.rc_prob and tokenizer.complement_ids() is None:
        raise ConfigError(
            f"data.rc_prob={d.rc_prob} reverse-complements DNA: the {tokenizer.kind} tokenizer has no complement "
            "(use --tokenizer nucleotide or nucleotide_cased, or rc_prob=0)"
        )
    if d.rc_prob and d.doc_reset and (run.task is None or run.task.name == "lm"):
        raise ConfigError("data.rc_prob reads a row of the stream as its other strand: it cannot keep documents apart "
                          "(doc_reset=true); set one of them off")  # fmt: skip


def reverse_complements(docs: list, complement, rate: float, seed: int, step: int) -> list:
    """Training examples (lists of ids) each read as its reverse complement with probability ``rate``: the draws
    come from the run's ``seed`` and the optimizer ``step``, one per example of the whole batch (every rank draws
    the same), so a resumed run reads the same."""
    if not rate:
        return docs
    flips = np.random.default_rng([seed, step, 0x5243]).random(len(docs)) < rate
    return [complement[np.asarray(ids)[::-1]].tolist() if flip else ids for ids, flip in zip(docs, flips)]


def padded(seqs: list[list[int]], segment_len: int, left: bool = False) -> tuple[Tensor, Tensor]:
    """Token ids (B, N) padded with token 0 to a whole number of segments, on the left or the right, and the
    (B, N) mask of the filler."""
    length = -(-max(len(ids) for ids in seqs) // segment_len) * segment_len
    inputs = torch.zeros(len(seqs), length, dtype=torch.long)
    padding = torch.ones(len(seqs), length, dtype=torch.bool)
    for row, ids in enumerate(seqs):
        where = slice(length - len(ids), length) if left else slice(0, len(ids))
        inputs[row, where] = torch.as_tensor(ids)
        padding[row, where] = False
    return inputs, padding


def load_base(lm: nn.Module, base: nn.Module) -> None:
    """The base language model's weights into a task's backbone.  Only the weights a causal language model cannot
    have may be missing from it: Linformer's projections (``pattern.lowrank``), which start from their
    initialisation; anything else missing or unexpected is the error ``load_state_dict`` gives."""
    fresh = {
        f"{name}.{weight}"
        for name, module in lm.named_modules(remove_duplicate=False)
        if isinstance(module, LowRankProjection)
        for weight, _ in module.named_parameters()
    }
    missing, unexpected = lm.load_state_dict(base.state_dict(), strict=False)
    if unexpected or set(missing) - fresh:
        lm.load_state_dict(base.state_dict())  # raises, naming them


def set_trainable(model: nn.Module, trainable) -> None:
    """Train only the parameters in ``trainable`` (head-only fine-tuning), or all of them when it is None."""
    keep = None if trainable is None else {id(p) for p in trainable}
    for p in model.parameters():
        p.requires_grad_(keep is None or id(p) in keep)


def chunks(items: list, n: int) -> list[list]:
    """``items`` cut into ``n`` nearly equal consecutive parts (gradient accumulation); empty parts dropped."""
    size = -(-len(items) // n)
    return [items[i : i + size] for i in range(0, len(items), size)]


TRAIN_SCORED = 1000  # the "train" metrics score the first this many training examples (a large set takes long)
