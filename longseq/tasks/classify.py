"""Long-document classification: the document is read segment by segment with the memory, and a summary is
classified: the last position, the mean of the final segment, or the mean of the whole document.  Documents are
left-padded within a batch to a whole number of segments, so the last position is every document's real last token.  Metrics: accuracy
and macro-F1; predictions: the label and every label's probability."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from longseq.config.base import check_choice
from longseq.config.task import ClassifyOptions
from longseq.data.tasks import TaskDataError, encode_field, read_jsonl
from longseq.model import build_model
from longseq.model.heads import POOLING, DocumentClassifier
from longseq.tasks.base import (
    TRAIN_SCORED,
    ExampleBatches,
    StepContext,
    StepResult,
    Task,
    check_reverse_complement,
    chunks,
    load_base,
    padded,
    reverse_complements,
    training_batches,
)


def reach_warning(lengths: list[int], segment_len: int, model, o: ClassifyOptions) -> str | None:
    """What a run says at its start when training documents are longer than the classification loss's gradient
    reaches: the final ``segments_per_step`` segments under ``last`` and ``mean`` pooling (every segment under
    ``document``), with how far back the final segment sees at all (attention only: ``effective_range``)."""
    block = model.segments_per_step
    reach = block * segment_len
    longer = [n for n in lengths if n > reach]
    if o.pooling == "document" or not longer:
        return None
    longest = max(longer)
    what = (
        f"classify: {len(longer):,} of {len(lengths):,} training documents are longer than the {block} segment(s) "
        f"the classification loss's gradient reaches (segment_len {segment_len} x {block} = {reach} tokens; the "
        f"longest has {longest:,} tokens, {-(-longest // segment_len)} segments).  With pooling={o.pooling} and a "
        f"stop-gradient memory (mem_bptt={model.memory.mem_bptt}) only the final {reach} tokens' computation "
        "trains for the label; earlier tokens reach the summary only through a memory that is not trained for it"
    )
    if o.lm_weight > 0:
        what += " (the joint LM loss trains every segment, but not for the label)"
    attention_only = model.arch == "transformer" and set(model.layer_mixers) == {"attention"}
    if attention_only and not model.memory.mem_tokens:
        seen = segment_len + model.effective_range
        beyond = sum(n > seen for n in lengths)
        what += (
            f", and {beyond:,} are longer than the final segment sees at all (segment_len {segment_len} + "
            f"n_layer {model.n_layer} x memory {model.effective_range // model.n_layer} = {seen} tokens)"
        )
    return what + ".  pooling=document trains every segment of a document."


def label_name(value) -> str:
    """One name per label: 0 and "0" are the same class (JSON numbers and strings alike)."""
    return str(value)


def classification_metrics(predicted: list[int], gold: list[int], n_classes: int) -> dict:
    """Accuracy and macro-F1 (the mean of per-class F1 over classes present in gold or predictions)."""
    accuracy = sum(p == g for p, g in zip(predicted, gold)) / max(1, len(gold))
    f1s = []
    for c in range(n_classes):
        tp = sum(p == c and g == c for p, g in zip(predicted, gold))
        fp = sum(p == c and g != c for p, g in zip(predicted, gold))
        fn = sum(p != c and g == c for p, g in zip(predicted, gold))
        if tp + fp + fn:
            f1s.append(2 * tp / (2 * tp + fp + fn))
    return {"accuracy": accuracy, "macro_f1": sum(f1s) / max(1, len(f1s))}


class Classify(Task):
    """Options (:class:`~longseq.config.task.ClassifyOptions`): ``labels``, ``pooling`` (``document``, the default;
    ``last``, ``mean``), ``lm_weight``, ``text_column``, ``label_column``.

    Why ``document``: with the stop-gradient memory only the final segment's computation trains under ``last`` and
    ``mean``, so a label carried early in a document longer than a segment is learned only by chance.  Measured
    (``benchmarks/results/finetune-defaults``: 3 classes, the label word first in documents of 3-4 segments, 200
    steps of ``longseq finetune``'s defaults, 3 seeds): document 1.00 validation accuracy, last 0.36, mean 0.35,
    chance 0.33.  Runs made when ``last`` was the default recorded no pooling, and keep it
    (:mod:`longseq.config.stored`)."""

    name = "classify"
    Options = ClassifyOptions
    gold_field = "label"

    def prepare(self):
        o = self.options
        check_choice("task.pooling", o.pooling, POOLING)
        columns = {"text": o.text_column, "label": o.label_column}
        records = read_jsonl(o.train, "classify", columns)
        if not o.labels:  # a new run: the classes are the training file's labels
            names = sorted({label_name(r["label"]) for r in records})
            if len(names) < 2:
                raise TaskDataError(f"{o.train}: classification needs at least 2 labels, found {names}")
            self.set_options(labels=names)
        o = self.options
        self.index = {name: i for i, name in enumerate(self.options.labels)}
        self.train_docs = self.encode(records, o.train, labelled=True)
        self.valid_docs = (
            self.encode(read_jsonl(o.valid, "classify", columns), o.valid, labelled=True) if o.valid else None
        )
        check_reverse_complement(self.run, self.tokenizer)
        self.complement = self.tokenizer.complement_ids()
        message = reach_warning([len(ids) for ids, _ in self.train_docs], self.segment_len, self.run.model, o)
        if message:
            self.log(message)
        return self.run

    def encode(self, records: list[dict], path: str, labelled: bool) -> list[tuple[list[int], int]]:
        docs = []
        for number, record in enumerate(records, 1):
            if not isinstance(record.get("text"), str):
                raise TaskDataError(f"{path}: record {number} has no text field")
            ids = encode_field(self.tokenizer, record, "text", path, number).tolist()
            if not ids:
                raise TaskDataError(f"{path}: record {number} has an empty text")
            label = -1
            if labelled:
                name = label_name(record["label"])
                if name not in self.index:
                    raise TaskDataError(f"{path}: record {number} has label {record['label']!r}, unseen in training")
                label = self.index[name]
            docs.append((ids, label))
        return docs

    def build_model(self) -> nn.Module:
        o = self.options
        return DocumentClassifier(build_model(self.run.model), len(o.labels), o.pooling)

    def initialize(self, model: DocumentClassifier) -> None:
        if self.base is not None:
            load_base(model.lm, self.base)

    def trainable(self, model: DocumentClassifier) -> list | None:
        return list(model.classifier.parameters()) if self.options.head_only else None

    def batches(self, world) -> ExampleBatches:
        return training_batches(
            [len(ids) for ids, _ in self.train_docs], self.options, self.run.data.batch_size, self.run.train.seed
        )

    def _batch(self, docs):
        inputs, padding = padded([ids for ids, _ in docs], self.segment_len, left=True)
        return inputs, torch.as_tensor([label for _, label in docs]), padding

    def train_step(self, ctx: StepContext, indices: list[int], memory: None) -> StepResult:
        docs = [self.train_docs[i] for i in indices]
        if self.run.data.rc_prob:  # reverse-complement augmentation: a read's label is its other strand's
            turned = reverse_complements([ids for ids, _ in docs], self.complement, self.run.data.rc_prob,
                                         self.run.train.seed, ctx.step)  # fmt: skip
            docs = [(ids, label) for ids, (_, label) in zip(turned, docs)]
        picked = docs[ctx.rows]
        parts, total = chunks(picked, ctx.grad_accum), 0.0
        for part in parts:
            inputs, labels, padding = (t.to(ctx.device) for t in self._batch(part))
            with ctx.autocast():
                loss = ctx.net(inputs, self.segment_len, labels, self.options.lm_weight, padding)["loss"]
            ctx.backward(loss * len(part) / len(picked))
            total = total + loss.detach().float() * (len(part) / len(picked))  # read once, by the trainer
        return StepResult(total, None, sum(len(ids) for ids, _ in picked))

    @torch.no_grad()
    def scores(self, model, docs) -> torch.Tensor:
        """Class probabilities (n, C) of encoded documents, in batches."""
        was_training, out = model.training, []
        model.eval()
        device = next(model.parameters()).device
        for start in range(0, len(docs), self.run.data.batch_size):
            inputs, _, padding = (t.to(device) for t in self._batch(docs[start : start + self.run.data.batch_size]))
            out.append(model(inputs, self.segment_len, padding=padding)["logits"].float().softmax(-1).cpu())
        model.train(was_training)
        return torch.cat(out)

    def metrics(self, model, docs) -> dict:
        probs = self.scores(model, docs)
        gold = torch.as_tensor([label for _, label in docs])
        metrics = classification_metrics(probs.argmax(-1).tolist(), gold.tolist(), len(self.options.labels))
        return {**metrics, "loss": float(F.nll_loss(probs.clamp(min=1e-30).log(), gold))}

    def validate(self, model, sharded: bool = False) -> dict:
        return self.metrics(model, self.valid_docs) if self.valid_docs else {}

    def report(self, model) -> dict:
        drop_loss = lambda m: {k: v for k, v in m.items() if k != "loss"}  # noqa: E731
        out = {"labels": self.options.labels, "train": drop_loss(self.metrics(model, self.train_docs[:TRAIN_SCORED]))}
        if self.valid_docs:
            out["valid"] = drop_loss(self.metrics(model, self.valid_docs))
        return out

    def check_gold(self, located: list[tuple[str, dict]], data: str, checkpoint: str) -> None:
        labelled = [(where, record["label"]) for where, record in located if "label" in record]
        for where, gold in labelled:
            if isinstance(gold, bool) or not isinstance(gold, (str, int)):
                raise TaskDataError(f"{where}: field 'label' has the wrong type {type(gold).__name__}")
        unknown = sorted({label_name(gold) for _, gold in labelled} - set(self.options.labels))
        if unknown:
            shown = ", ".join(repr(u) for u in unknown[:5]) + (", ..." if len(unknown) > 5 else "")
            raise TaskDataError(
                f"{data} has gold labels the classifier {checkpoint} does not know ({shown}); it knows "
                f"{', '.join(repr(x) for x in self.options.labels)}: give data labelled for this model, or leave the "
                "labels out"
            )

    def score_predictions(self, records: list[dict], outputs: list[dict]) -> dict:
        names = self.options.labels
        gold = [names.index(label_name(r["label"])) for r in records]
        return classification_metrics([names.index(o["prediction"]) for o in outputs], gold, len(names))

    def predict(self, model, records: list[dict], path: str = "input") -> list[dict]:
        probs = self.scores(model, self.encode(records, path, labelled=False))
        names = self.options.labels
        return [
            {"prediction": names[int(p.argmax())], "scores": {n: float(v) for n, v in zip(names, p)}} for p in probs
        ]
