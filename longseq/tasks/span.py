"""Extractive question answering over a long input: the question, a separator and the context are read segment by
segment with the memory, and start and end heads score every context token; the answer may lie many segments
after the question.  Metrics: exact match and F1 on the answer text (SQuAD's normalisation); predictions: the answer
text, its character span and its score."""

from __future__ import annotations

import collections
import re
import string

import numpy as np
import torch
from torch import nn

from longseq.config.task import SpanOptions
from longseq.data.tasks import TaskDataError, encode_field, read_jsonl
from longseq.data.tokenizers import TokenizerError
from longseq.model import build_model
from longseq.model.heads import SpanExtractor, best_spans
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


def normalize_answer(text: str) -> str:
    """SQuAD's normalisation: lower case, no punctuation, no articles, single spaces."""
    text = "".join(ch for ch in text.lower() if ch not in set(string.punctuation))
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", text).split())


def span_metrics(predicted: list[str], gold: list[str]) -> dict:
    """Exact match and token F1 (SQuAD's definitions, one gold answer per question), as fractions."""
    exact, f1 = 0.0, 0.0
    for p, g in zip(predicted, gold):
        p_tokens, g_tokens = normalize_answer(p).split(), normalize_answer(g).split()
        exact += float(p_tokens == g_tokens)
        common = sum((collections.Counter(p_tokens) & collections.Counter(g_tokens)).values())
        if not p_tokens or not g_tokens:
            f1 += float(p_tokens == g_tokens)
        elif common:
            precision, recall = common / len(p_tokens), common / len(g_tokens)
            f1 += 2 * precision * recall / (precision + recall)
    n = max(1, len(gold))
    return {"exact_match": exact / n, "f1": f1 / n}


def separator(tokenizer) -> list[int]:
    try:
        return tokenizer.encode("\n").tolist()
    except TokenizerError:  # a character vocabulary without a newline: question and context simply abut
        return []


def encode_spans(records: list[dict], tokenizer, path: str) -> list[dict]:
    """Token ids of question + newline + context, and the first and last token (inclusive) that overlap the
    answer's characters (a word tokenizer keeps punctuation on its words: "mill," holds the answer "mill")."""
    sep, out = separator(tokenizer), []
    for number, record in enumerate(records, 1):
        question = encode_field(tokenizer, record, "question", path, number).tolist()
        context = encode_field(tokenizer, record, "context", path, number)
        offsets = tokenizer.offsets(record["context"])
        a0 = record["answer_start"]
        a1 = a0 + len(record["answer_text"])
        inside = np.nonzero((offsets[:, 0] < a1) & (offsets[:, 1] > a0))[0]  # tokens overlapping the answer
        if not record["answer_text"].strip() or not len(inside):
            raise TaskDataError(f"{path}: record {number}: the answer is empty or overlaps no token of the context")
        prefix = len(question) + len(sep)
        out.append(
            {
                "ids": question + sep + context.tolist(),
                "prefix": prefix,
                "start": prefix + int(inside[0]),
                "end": prefix + int(inside[-1]),
                "context": record["context"],
                "offsets": offsets,
                "answer": record["answer_text"],
            }
        )
    return out


def encode_questions(records: list[dict], tokenizer, path: str) -> list[dict]:
    """Question + separator + context ids of records without answers (prediction)."""
    sep, out = separator(tokenizer), []
    for number, record in enumerate(records, 1):
        if not isinstance(record.get("question"), str) or not isinstance(record.get("context"), str):
            raise TaskDataError(f"{path}: record {number} needs the string fields question and context")
        question = encode_field(tokenizer, record, "question", path, number).tolist()
        context = encode_field(tokenizer, record, "context", path, number)
        prefix = len(question) + len(sep)
        out.append(
            {
                "ids": question + sep + context.tolist(),
                "prefix": prefix,
                "context": record["context"],
                "offsets": tokenizer.offsets(record["context"]),
            }
        )
    return out


class Span(Task):
    name = "span"
    Options = SpanOptions
    gold_field = "answer_text"

    def prepare(self):
        o = self.options
        self.train_examples = encode_spans(read_jsonl(o.train, "span"), self.tokenizer, o.train)
        self.valid_examples = encode_spans(read_jsonl(o.valid, "span"), self.tokenizer, o.valid) if o.valid else None
        return self.run

    def build_model(self) -> nn.Module:
        return SpanExtractor(build_model(self.run.model))

    def initialize(self, model: SpanExtractor) -> None:
        if self.base is not None:
            load_base(model.lm, self.base)

    def trainable(self, model: SpanExtractor) -> list | None:
        return list(model.qa.parameters()) if self.options.head_only else None

    def batches(self, world) -> ExampleBatches:
        return training_batches(
            [len(e["ids"]) for e in self.train_examples], self.options, self.run.data.batch_size, self.run.train.seed
        )

    def _batch(self, examples: list[dict]):
        inputs, padding = padded([e["ids"] for e in examples], self.segment_len)
        allowed = torch.zeros_like(padding)
        for row, e in enumerate(examples):
            allowed[row, e["prefix"] : len(e["ids"])] = True  # the context only
        starts = torch.as_tensor([e.get("start", 0) for e in examples])
        ends = torch.as_tensor([e.get("end", 0) for e in examples])
        return inputs, allowed, starts, ends, padding

    def train_step(self, ctx: StepContext, indices: list[int], memory: None) -> StepResult:
        picked = [self.train_examples[i] for i in indices][ctx.rows]
        total = 0.0
        for part in chunks(picked, ctx.grad_accum):
            inputs, allowed, starts, ends, padding = (t.to(ctx.device) for t in self._batch(part))
            with ctx.autocast():
                loss = ctx.net(inputs, self.segment_len, allowed, starts, ends, padding)["loss"]
            ctx.backward(loss * len(part) / len(picked))
            total = total + loss.detach().float() * (len(part) / len(picked))  # read once, by the trainer
        return StepResult(total, None, sum(len(e["ids"]) for e in picked))

    @torch.no_grad()
    def answers(self, model, examples: list[dict]) -> tuple[list[dict], float]:
        """Each example's best answer (text, character span, score) and the mean start/end cross-entropy."""
        was_training, found, losses = model.training, [], []
        model.eval()
        device, size = next(model.parameters()).device, self.run.data.batch_size
        for first in range(0, len(examples), size):
            chunk = examples[first : first + size]
            inputs, allowed, starts, ends, padding = (t.to(device) for t in self._batch(chunk))
            out = model(inputs, self.segment_len, allowed, padding=padding)
            if "start" in chunk[0]:
                ce = torch.nn.functional.cross_entropy
                losses.append(float(ce(out["start_logits"], starts) + ce(out["end_logits"], ends)) / 2 * len(chunk))
            spans = best_spans(out["start_logits"], out["end_logits"], self.options.max_answer_len)
            for row, (e, (s, t)) in enumerate(zip(chunk, spans.tolist())):
                score = float(out["start_logits"][row, s] + out["end_logits"][row, t])
                offsets, a, b = e["offsets"], s - e["prefix"], t - e["prefix"]
                inside = 0 <= a <= b < len(offsets)  # a row with no finite score picks nothing
                span = (int(offsets[a, 0]), int(offsets[b, 1])) if inside else (0, 0)
                found.append(
                    {"prediction": e["context"][span[0] : span[1]], "start": span[0], "end": span[1], "score": score}
                )
        model.train(was_training)
        return found, sum(losses) / max(1, len(examples))

    def metrics(self, model, examples: list[dict]) -> dict:
        found, loss = self.answers(model, examples)
        return {**span_metrics([f["prediction"] for f in found], [e["answer"] for e in examples]), "loss": loss}

    def validate(self, model, sharded: bool = False) -> dict:
        return self.metrics(model, self.valid_examples) if self.valid_examples else {}

    def report(self, model) -> dict:
        drop_loss = lambda m: {k: v for k, v in m.items() if k != "loss"}  # noqa: E731
        out = {"train": drop_loss(self.metrics(model, self.train_examples[:TRAIN_SCORED]))}
        if self.valid_examples:
            out["valid"] = drop_loss(self.metrics(model, self.valid_examples))
        return out

    def score_predictions(self, records: list[dict], outputs: list[dict]) -> dict:
        return span_metrics([o["prediction"] for o in outputs], [r["answer_text"] for r in records])

    def predict(self, model, records: list[dict], path: str = "input") -> list[dict]:
        return self.answers(model, encode_questions(records, self.tokenizer, path))[0]
