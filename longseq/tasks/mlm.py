"""Masked language modeling: the LM's weights in a bidirectional copy (every segment token sees the later ones;
the memory still carries earlier segments), trained to restore BERT-masked tokens (80% [MASK], 10% random, 10%
kept).  Metrics: masked-token accuracy and perplexity; predictions: the input with its [MASK] tokens filled."""

from __future__ import annotations

import math

import torch
from torch import nn

from longseq.config.run import RunConfig
from longseq.config.task import MaskedLMOptions
from longseq.data.tasks import TaskDataError, encode_field, read_jsonl
from longseq.data.tokenizers import TokenizerError
from longseq.model import build_model
from longseq.model.heads import MaskedLM as MaskedLMHead
from longseq.model.heads import mask_tokens
from longseq.tasks.base import (
    TRAIN_SCORED,
    ExampleBatches,
    StepContext,
    StepResult,
    Task,
    chunks,
    load_base,
    padded,
    training_batches,
)


def default_mask_id(tokenizer, mask_token: str | None) -> int:
    """The id that stands for [MASK]: ``mask_token`` if given, else <unk> (word) or byte 0 (byte)."""
    if mask_token is not None:
        try:
            ids = tokenizer.encode(mask_token).tolist()
        except TokenizerError as exc:
            raise TaskDataError(f"--mask-token {mask_token!r}: {exc}") from None
        ids = ids[:1] if tokenizer.kind == "word" and len(ids) == 2 else ids  # drop the <eos> a word line ends with
        if len(ids) != 1:
            raise TaskDataError(f"--mask-token {mask_token!r} must be exactly one token, it is {len(ids)}")
        return ids[0]
    if tokenizer.mask_id is not None:
        return tokenizer.mask_id
    raise TaskDataError(
        "a character vocabulary has no spare symbol for [MASK]; pass --mask-token with one character of the "
        "vocabulary to stand for it"
    )


def bidirectional(run: RunConfig) -> RunConfig:
    """The run with a bidirectional model: the same weights, attending both ways inside a segment."""
    model = run.model.replace(pattern={**run.model.pattern.to_dict(), "bidirectional": True})
    return RunConfig(model, run.data, run.train, run.task)


class MaskedLM(Task):
    name = "mlm"
    Options = MaskedLMOptions

    def prepare(self):
        o = self.options
        if o.mask_id < 0:
            self.set_options(mask_id=default_mask_id(self.tokenizer, o.mask_token))
        self.run = bidirectional(self.run)
        self.train_docs = self.encode(o.train)
        self.valid_docs = self.encode(o.valid) if o.valid else None
        return self.run

    def encode(self, path: str) -> list[list[int]]:
        docs = [
            encode_field(self.tokenizer, r, "text", path, n).tolist()
            for n, r in enumerate(read_jsonl(path, "mlm", {"text": self.options.text_column}), 1)
        ]
        for number, d in enumerate(docs, 1):
            if not d:
                raise TaskDataError(f"{path}: record {number} has an empty text")
        return docs

    def build_model(self) -> nn.Module:
        return MaskedLMHead(build_model(self.run.model))

    def initialize(self, model: MaskedLMHead) -> None:
        if self.base is not None:
            load_base(model.lm, self.base)

    def trainable(self, model: MaskedLMHead) -> list | None:
        return list(model.lm.crit.parameters()) if self.options.head_only else None

    def batches(self, world) -> ExampleBatches:
        return training_batches(
            [len(ids) for ids in self.train_docs], self.options, self.run.data.batch_size, self.run.train.seed
        )

    def masked(self, docs: list[list[int]], generator: torch.Generator):
        """Padded, masked inputs (B, N), their labels (-100 where not chosen, and on filler) and the filler mask."""
        inputs, padding = padded(docs, self.segment_len)
        o = self.options
        masked, labels = mask_tokens(inputs, o.mask_rate, o.mask_id, self.run.model.vocab_size, generator)
        return masked, labels.masked_fill(padding, -100), padding

    def train_step(self, ctx: StepContext, indices: list[int], memory: None) -> StepResult:
        generator = torch.Generator().manual_seed(self.run.train.seed * 1_000_003 + sum(indices) + len(indices))
        picked = [self.train_docs[i] for i in indices][ctx.rows]
        masked, labels, padding = (t.to(ctx.device) for t in self.masked(picked, generator))
        total, count = 0.0, max(1, int((labels != -100).sum()))
        for part in chunks(list(range(len(picked))), ctx.grad_accum):
            rows = slice(part[0], part[-1] + 1)
            with ctx.autocast():
                out = ctx.net(masked[rows], self.segment_len, labels[rows], padding[rows])
            nll = out["nll"]
            ctx.backward(nll / count + out["aux"] * (len(part) / len(picked)))  # aux: a mean over this part's rows
            total = total + nll.detach().float() / count  # read once, by the trainer
        return StepResult(total, None, sum(len(ids) for ids in picked))

    @torch.no_grad()
    def metrics(self, model, docs: list[list[int]]) -> dict:
        """Masked-token accuracy and perplexity on ``docs`` masked with a fixed seed."""
        was_training = model.training
        model.eval()
        generator = torch.Generator().manual_seed(self.run.train.seed + 1)
        device, size = next(model.parameters()).device, self.run.data.batch_size
        nll, correct, count = 0.0, 0, 0
        for first in range(0, len(docs), size):
            masked, labels, padding = (t.to(device) for t in self.masked(docs[first : first + size], generator))
            out = model(masked, self.segment_len, labels, padding)
            nll, correct, count = nll + float(out["nll"]), correct + int(out["correct"]), count + int(out["count"])
        model.train(was_training)
        loss = nll / max(1, count)
        return {"masked_accuracy": correct / max(1, count), "ppl": math.exp(loss), "masked_tokens": count, "loss": loss}

    def validate(self, model, sharded: bool = False) -> dict:
        return self.metrics(model, self.valid_docs) if self.valid_docs else {}

    def report(self, model) -> dict:
        drop_loss = lambda m: {k: v for k, v in m.items() if k != "loss"}  # noqa: E731
        out = {"mask_id": self.options.mask_id, "train": drop_loss(self.metrics(model, self.train_docs[:TRAIN_SCORED]))}
        if self.valid_docs:
            out["valid"] = drop_loss(self.metrics(model, self.valid_docs))
        return out

    @torch.no_grad()
    def predict(self, model, records: list[dict], path: str = "input") -> list[dict]:
        """Every [MASK] token of each record's text replaced by the model's most likely token."""
        model.eval()
        device, out = next(model.parameters()).device, []
        mask_id = self.options.mask_id
        for number, record in enumerate(records, 1):
            if not isinstance(record.get("text"), str):
                raise TaskDataError(f"{path}: record {number} needs a string field text")
            ids = encode_field(self.tokenizer, record, "text", path, number).tolist()
            inputs, padding = (t.to(device) for t in padded([ids], self.segment_len))
            logits = model(inputs, self.segment_len, padding=padding)["logits"]
            where = [i for i, t in enumerate(ids) if t == mask_id]
            probs = logits[0].float().softmax(-1)
            filled = list(ids)
            for i in where:
                filled[i] = int(probs[i].argmax())
            tokens = [self.tokenizer.decode([filled[i]]) for i in where]
            out.append(
                {
                    "prediction": self.tokenizer.decode(filled),
                    "filled": tokens,
                    "scores": [float(probs[i].max()) for i in where],
                }
            )
        return out
