"""The recall tasks (passkey, mqar, copying, induction; :mod:`longseq.data.recall`) trained from scratch: each step
draws a fresh batch of ``seq_len``-token sequences from the run's seed, reads them in segments of
``segment_len`` (0: ``tgt_len``) with the memory carried from segment to segment (reset between sequences; the
gradient through the memory as ``segments_per_step`` allows), and scores the asked positions only.  Metrics:
``accuracy`` (argmax right at an asked position) on ``valid_size`` sequences of the training length;
:mod:`longseq.eval.recall` measures it against distance and length (``longseq recall``)."""

from __future__ import annotations

import torch
from torch import nn

from longseq.config.base import ConfigError
from longseq.config.run import RunConfig
from longseq.config.task import RecallOptions
from longseq.data.recall import IGNORE, RecallBatch, RecallBatches, chance, recall_batch, shortest
from longseq.data.tokenizers import ByteTokenizer
from longseq.model import build_model
from longseq.model.heads import MaskedLM as AskedPositions  # an LM read in segments, scored where labels are asked
from longseq.tasks.base import StepContext, StepResult, Task, chunks


class Recall(Task):
    """One class for the four generated tasks; the run's ``task.name`` picks the generator."""

    name = "recall"
    Options = RecallOptions

    @classmethod
    def checkpoint_kind(cls) -> str:
        return (
            f"trained from scratch on the {cls.name} recall task: longseq recall CHECKPOINT measures its accuracy "
            "by distance and length"
        )

    def prepare(self) -> RunConfig:
        o, m = self.options, self.run.model
        if self.tokenizer is None:
            self.tokenizer = ByteTokenizer()  # the tasks' ids lie below 256
        if m.vocab_size not in (0, 256):
            raise ConfigError(f"the {o.name} task uses the 256-token byte vocabulary; got vocab_size={m.vocab_size}")
        if o.seq_len < shortest(o):
            raise ConfigError(f"task.seq_len={o.seq_len} is too short for {o.name}: it needs >= {shortest(o)} tokens")
        self.run = RunConfig(m.replace(vocab_size=256), self.run.data, self.run.train, self.run.task)
        # training draws index >= 1; this also refuses options that do not fit (a passkey distance) by name
        self.valid = recall_batch(o, self.run.train.seed, 0, o.valid_size, o.seq_len)
        self.log(
            f"{o.name}: sequences of {o.seq_len} tokens in segments of {self.segment_len}; "
            f"chance accuracy {chance(o):.3f}"
        )
        return self.run

    def build_model(self) -> nn.Module:
        return AskedPositions(build_model(self.run.model))

    def batches(self, world) -> RecallBatches:
        return RecallBatches(self.options, self.run.train.seed, self.run.data.batch_size)

    def train_step(self, ctx: StepContext, batch: RecallBatch, memory: None) -> StepResult:
        mine = batch.rows(ctx.rows)
        inputs, labels = mine.inputs.to(ctx.device), mine.labels.to(ctx.device)
        count, total = (labels != IGNORE).sum().clamp(min=1), 0.0
        for part in chunks(list(range(len(inputs))), ctx.grad_accum):
            rows = slice(part[0], part[-1] + 1)
            with ctx.autocast():
                out = ctx.net(inputs[rows], self.segment_len, labels[rows])
            nll = out["nll"]
            ctx.backward(nll / count + out["aux"] * (len(part) / len(inputs)))  # aux: a mean over this part's rows
            total = total + nll.detach().float() / count  # read once, by the trainer
        return StepResult(total, None, inputs.numel())

    @torch.no_grad()
    def validate(self, model: nn.Module, sharded: bool = False) -> dict:
        was_training = model.training
        model.eval()
        device, size = next(model.parameters()).device, self.run.data.eval_batch_size
        nll, correct, count = 0.0, 0, 0
        for first in range(0, len(self.valid.inputs), size):
            part = self.valid.rows(slice(first, first + size))
            out = model(part.inputs.to(device), self.segment_len, part.labels.to(device))
            nll, correct, count = nll + float(out["nll"]), correct + int(out["correct"]), count + int(out["count"])
        model.train(was_training)
        return {"accuracy": correct / max(1, count), "loss": nll / max(1, count), "chance": chance(self.options)}

    def report(self, model: nn.Module) -> dict:
        return {"valid": self.validate(model)}
