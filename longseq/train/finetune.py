"""Fine-tuning an LM checkpoint on a task: ``longseq finetune --task classify|span|mlm``.

Texts are tokenized with the checkpoint's tokenizer and read segment by segment with the memory carried.

* ``classify``: documents are left-padded within a batch to a whole number of segments, so the last position
  is every document's real last token; accuracy and macro-F1.
* ``span``: the question, a newline and the context, right-padded; start and end heads score the context
  tokens; exact match and F1 on the answer text (SQuAD's normalisation).
* ``mlm``: the model is rebuilt bidirectional (same weights), 80/10/10 masking at ``mask_rate``; masked-token
  accuracy and perplexity.

Full fine-tuning uses layer-wise learning-rate decay (``layer_lr_decay``); ``head_only`` trains the task head
alone (for MLM, the softmax).  The result directory holds ``model.safetensors`` and ``finetune.json`` (the task,
its settings, the LM's run config and the metrics).  The ``train`` metrics score at most the first
:data:`TRAIN_SCORED` training examples; ``valid`` scores the whole validation file.
"""

from __future__ import annotations

import collections
import json
import math
import os
import random
import re
import string
from dataclasses import dataclass

import numpy as np
import torch
from safetensors.torch import save_model

from longseq.config.base import JsonConfig, check
from longseq.config.run import TrainConfig
from longseq.data.tasks import TaskDataError, read_jsonl
from longseq.data.tokenizers import TokenizerError
from longseq.model import build_model
from longseq.model.heads import DocumentClassifier, SpanExtractor, best_spans, mask_tokens, padding_segments
from longseq.train.checkpoint import load_checkpoint
from longseq.train.optim import build_optimizer

TRAIN_SCORED = 1000  # the "train" metrics score the first this many training examples (a large set takes long)


@dataclass
class FinetuneConfig(JsonConfig):
    """What every task's fine-tuning shares.  ``segment_len`` 0 takes the checkpoint's ``tgt_len``;
    ``layer_lr_decay`` < 1 scales each layer's learning rate by decay^(depth from the top); ``head_only`` trains
    the task head alone."""

    steps: int = 200
    batch_size: int = 8
    segment_len: int = 0
    lr: float = 1e-3
    layer_lr_decay: float = 0.8
    head_only: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size"):
            check(getattr(self, name) >= 1, f"FinetuneConfig.{name} must be >= 1, got {getattr(self, name)}")
        check(self.segment_len >= 0, f"FinetuneConfig.segment_len must be >= 0, got {self.segment_len}")
        check(self.lr > 0, f"FinetuneConfig.lr must be > 0, got {self.lr}")
        check(
            0 < self.layer_lr_decay <= 1, f"FinetuneConfig.layer_lr_decay must be in (0, 1], got {self.layer_lr_decay}"
        )


def _encode(records, tokenizer, label_index, path):
    docs = []
    for number, record in enumerate(records, 1):
        ids = tokenizer.encode(record["text"])
        if len(ids) == 0:
            raise TaskDataError(f"{path}: record {number} has an empty text")
        if record["label"] not in label_index:
            raise TaskDataError(f"{path}: record {number} has label {record['label']!r}, unseen in training")
        docs.append((list(ids), label_index[record["label"]]))
    return docs


def _padded(seqs: list[list[int]], segment_len: int, left: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
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


def _batch(docs, segment_len: int):
    """Left-padded (the last position is every document's last token), labels, filler mask."""
    inputs, padding = _padded([ids for ids, _ in docs], segment_len, left=True)
    return inputs, torch.as_tensor([label for _, label in docs]), padding


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


@torch.no_grad()
def evaluate_classifier(model: DocumentClassifier, docs, segment_len: int, batch_size: int, n_classes: int) -> dict:
    model.eval()
    predicted, gold = [], []
    for start in range(0, len(docs), batch_size):
        inputs, labels, padding = _batch(docs[start : start + batch_size], segment_len)
        predicted += model(inputs, segment_len, padding=padding)["logits"].argmax(-1).tolist()
        gold += labels.tolist()
    model.train()
    return classification_metrics(predicted, gold, n_classes)


def _fit(model, trainable, batches, config: FinetuneConfig, log) -> list[float]:
    """AdamW with linear warmup over the first tenth of the steps; ``batches()`` gives the loss of a fresh batch."""
    for p in model.parameters():
        p.requires_grad_(False)
    for p in trainable:
        p.requires_grad_(True)
    steps, lr = config.steps, config.lr
    decay = 1.0 if config.head_only else config.layer_lr_decay
    optimizer = build_optimizer(model, TrainConfig(lr=lr, min_lr=0.0, layer_lr_decay=decay, max_steps=steps))
    model.train()
    losses = []
    for step in range(steps):
        warm = min(1.0, (step + 1) / max(1, steps // 10))
        for group in optimizer.param_groups:
            group["lr"] = lr * warm * group.get("lr_scale", 1.0)
        loss = batches()
        if not math.isfinite(loss.item()):
            raise TaskDataError(f"fine-tuning loss is {loss.item()} at step {step + 1}; lower the learning rate")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
        if (step + 1) % max(1, steps // 10) == 0:
            log(f"step {step + 1}: loss {loss.item():.4f}")
    return losses


def _sampler(n: int, batch_size: int, seed: int):
    """Indices of shuffled batches, epoch after epoch."""
    rng, order = random.Random(seed), []

    def draw() -> list[int]:
        while len(order) < batch_size:
            order.extend(rng.sample(range(n), n))
        return [order.pop() for _ in range(min(batch_size, n))]

    return draw


def _save(model, out_dir: str, info: dict) -> None:
    os.makedirs(out_dir, exist_ok=True)
    save_model(model, os.path.join(out_dir, "model.safetensors"))
    with open(os.path.join(out_dir, "finetune.json"), "w", encoding="utf-8") as f:
        json.dump(info, f, indent=2)


def finetune_classifier(
    checkpoint: str,
    train_path: str,
    out_dir: str,
    config: FinetuneConfig | None = None,
    *,
    valid_path: str | None = None,
    pooling: str = "last",
    lm_weight: float = 0.0,
    log=None,
) -> dict:
    log, config = log or (lambda message: None), config or FinetuneConfig()
    lm, tokenizer, run, _ = load_checkpoint(checkpoint)
    records = read_jsonl(train_path, "classify")
    names = sorted({r["label"] for r in records}, key=lambda x: (str(type(x)), x))
    label_index = {name: i for i, name in enumerate(names)}
    if len(names) < 2:
        raise TaskDataError(f"{train_path}: classification needs at least 2 labels, found {names}")
    train_docs = _encode(records, tokenizer, label_index, train_path)
    valid_docs = _encode(read_jsonl(valid_path, "classify"), tokenizer, label_index, valid_path) if valid_path else None
    segment_len = config.segment_len or run.data.tgt_len
    torch.manual_seed(config.seed)
    model = DocumentClassifier(lm, len(names), pooling)
    draw = _sampler(len(train_docs), config.batch_size, config.seed)

    def batch_loss():
        inputs, labels, padding = _batch([train_docs[i] for i in draw()], segment_len)
        return model(inputs, segment_len, labels, lm_weight=lm_weight, padding=padding)["loss"]

    trainable = model.classifier.parameters() if config.head_only else model.parameters()
    losses = _fit(model, list(trainable), batch_loss, config, log)
    metrics = {"train_loss": sum(losses[-10:]) / len(losses[-10:]), "steps": config.steps, "labels": names}
    metrics["train"] = evaluate_classifier(model, train_docs[:TRAIN_SCORED], segment_len, config.batch_size, len(names))
    if valid_docs:
        metrics["valid"] = evaluate_classifier(model, valid_docs, segment_len, config.batch_size, len(names))
    info = {"task": "classify", "pooling": pooling, "segment_len": segment_len, "run": run.to_dict()}
    _save(model, out_dir, {**info, "metrics": metrics})
    return metrics


# --- span extraction -------------------------------------------------------------------------------------------


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


def _separator(tokenizer) -> list[int]:
    try:
        return tokenizer.encode("\n").tolist()
    except TokenizerError:  # a character vocabulary without a newline: question and context simply abut
        return []


def encode_spans(records: list[dict], tokenizer, path: str) -> list[dict]:
    """Token ids of question + newline + context, and the first and last token (inclusive) that overlap the
    answer's characters (a word tokenizer keeps punctuation on its words: "mill," holds the answer "mill")."""
    sep, out = _separator(tokenizer), []
    for number, record in enumerate(records, 1):
        question, context = tokenizer.encode(record["question"]).tolist(), tokenizer.encode(record["context"])
        offsets = tokenizer.offsets(record["context"])
        a0 = record["answer_start"]
        a1 = a0 + len(record["answer_text"])
        inside = np.nonzero((offsets[:, 0] < a1) & (offsets[:, 1] > a0))[0]  # tokens overlapping the answer
        if not record["answer_text"].strip() or not len(inside):
            raise TaskDataError(f"{path}: record {number}: the answer is empty or overlaps no token of the context")
        prefix = len(question) + len(sep)
        out.append({"ids": question + sep + context.tolist(), "prefix": prefix, "start": prefix + int(inside[0]),
                    "end": prefix + int(inside[-1]), "context": record["context"], "offsets": offsets,
                    "answer": record["answer_text"]})  # fmt: skip
    return out


def _span_batch(examples: list[dict], segment_len: int):
    inputs, padding = _padded([e["ids"] for e in examples], segment_len)
    allowed = torch.zeros_like(padding)
    for row, e in enumerate(examples):
        allowed[row, e["prefix"] : len(e["ids"])] = True  # the context only
    starts = torch.as_tensor([e["start"] for e in examples])
    ends = torch.as_tensor([e["end"] for e in examples])
    return inputs, allowed, starts, ends, padding


@torch.no_grad()
def evaluate_spans(model: SpanExtractor, examples, segment_len: int, batch_size: int, max_answer_len: int) -> dict:
    model.eval()
    predicted = []
    for first in range(0, len(examples), batch_size):
        chunk = examples[first : first + batch_size]
        inputs, allowed, _, _, padding = _span_batch(chunk, segment_len)
        out = model(inputs, segment_len, allowed, padding=padding)
        for e, (s, t) in zip(chunk, best_spans(out["start_logits"], out["end_logits"], max_answer_len).tolist()):
            offsets, first, last = e["offsets"], s - e["prefix"], t - e["prefix"]
            inside = 0 <= first <= last < len(offsets)  # a row with no finite score picks nothing
            predicted.append(e["context"][offsets[first, 0] : offsets[last, 1]] if inside else "")
    model.train()
    return span_metrics(predicted, [e["answer"] for e in examples])


def finetune_span(
    checkpoint: str,
    train_path: str,
    out_dir: str,
    config: FinetuneConfig | None = None,
    *,
    valid_path: str | None = None,
    max_answer_len: int = 64,
    log=None,
) -> dict:
    log, config = log or (lambda message: None), config or FinetuneConfig()
    if max_answer_len < 1:
        raise ValueError(f"max_answer_len must be >= 1 token, got {max_answer_len}")
    lm, tokenizer, run, _ = load_checkpoint(checkpoint)
    train_examples = encode_spans(read_jsonl(train_path, "span"), tokenizer, train_path)
    valid_examples = encode_spans(read_jsonl(valid_path, "span"), tokenizer, valid_path) if valid_path else None
    segment_len = config.segment_len or run.data.tgt_len
    torch.manual_seed(config.seed)
    model = SpanExtractor(lm)
    draw = _sampler(len(train_examples), config.batch_size, config.seed)

    def batch_loss():
        inputs, allowed, starts, ends, padding = _span_batch([train_examples[i] for i in draw()], segment_len)
        return model(inputs, segment_len, allowed, starts, ends, padding)["loss"]

    trainable = model.qa.parameters() if config.head_only else model.parameters()
    losses = _fit(model, list(trainable), batch_loss, config, log)
    metrics = {"train_loss": sum(losses[-10:]) / len(losses[-10:]), "steps": config.steps}
    metrics["train"] = evaluate_spans(
        model, train_examples[:TRAIN_SCORED], segment_len, config.batch_size, max_answer_len
    )
    if valid_examples:
        metrics["valid"] = evaluate_spans(model, valid_examples, segment_len, config.batch_size, max_answer_len)
    info = {"task": "span", "segment_len": segment_len, "max_answer_len": max_answer_len, "run": run.to_dict()}
    _save(model, out_dir, {**info, "metrics": metrics})
    return metrics


# --- masked language modeling ----------------------------------------------------------------------------------


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
    if tokenizer.kind == "word":
        return tokenizer.unk_id
    if tokenizer.kind == "byte":
        return 0
    raise TaskDataError(
        "a character vocabulary has no spare symbol for [MASK]; pass --mask-token with one character of the "
        "vocabulary to stand for it"
    )


def _masked(inputs, padding, rate, mask_id, vocab_size, generator):
    masked, labels = mask_tokens(inputs, rate, mask_id, vocab_size, generator)
    return masked, labels.masked_fill(padding, -100)  # filler is never a target


def mlm_loss(model, inputs: torch.Tensor, labels: torch.Tensor, segment_len: int, padding: torch.Tensor):
    """Summed NLL and count of the labelled tokens, reading (B, N) in segments with the memory carried; the
    ``padding`` (B, N) is a document of its own, so no real token attends to it."""
    mems, total, count = None, inputs.new_zeros((), dtype=torch.float32), 0
    pads = padding_segments(padding, inputs, segment_len)
    for x, y, pad in zip(inputs.split(segment_len, dim=1), labels.split(segment_len, dim=1), pads):
        out = model(x, mems, y, doc_ids=None if pad is None else pad.long())
        mems = out.mems
        total = total + out.nll.float().sum()
        count += int((y != -100).sum())
    return total, count


@torch.no_grad()
def evaluate_mlm(model, docs, segment_len, batch_size, rate, mask_id, seed: int) -> dict:
    """Masked-token accuracy and perplexity on ``docs`` masked with a fixed seed."""
    model.eval()
    generator = torch.Generator().manual_seed(seed)
    nll, correct, count = 0.0, 0, 0
    for first in range(0, len(docs), batch_size):
        inputs, padding = _padded(docs[first : first + batch_size], segment_len)
        masked, labels = _masked(inputs, padding, rate, mask_id, model.config.vocab_size, generator)
        mems, pads = None, padding_segments(padding, inputs, segment_len)
        for x, y, pad in zip(masked.split(segment_len, dim=1), labels.split(segment_len, dim=1), pads):
            out = model(x, mems, doc_ids=None if pad is None else pad.long())
            mems = out.mems
            scores = out.logits.float().log_softmax(-1)  # (B, T, V); log_softmax leaves log-probabilities as they are
            keep = y != -100
            nll -= float(scores[keep].gather(-1, y[keep].unsqueeze(-1)).sum())
            correct += int((scores[keep].argmax(-1) == y[keep]).sum())
            count += int(keep.sum())
    model.train()
    return {"masked_accuracy": correct / max(1, count), "ppl": math.exp(nll / max(1, count)), "masked_tokens": count}


def finetune_mlm(
    checkpoint: str,
    train_path: str,
    out_dir: str,
    config: FinetuneConfig | None = None,
    *,
    valid_path: str | None = None,
    mask_rate: float = 0.15,
    mask_token: str | None = None,
    log=None,
) -> dict:
    log, config = log or (lambda message: None), config or FinetuneConfig()
    lm, tokenizer, run, _ = load_checkpoint(checkpoint)
    mask_id = default_mask_id(tokenizer, mask_token)

    def encode(path):
        docs = [tokenizer.encode(r["text"]).tolist() for r in read_jsonl(path, "mlm")]
        for number, d in enumerate(docs, 1):
            if not d:
                raise TaskDataError(f"{path}: record {number} has an empty text")
        return docs

    train_docs = encode(train_path)
    valid_docs = encode(valid_path) if valid_path else None
    segment_len = config.segment_len or run.data.tgt_len
    torch.manual_seed(config.seed)
    bidi = lm.config.replace(pattern={**lm.config.pattern.to_dict(), "bidirectional": True})
    model = build_model(bidi)  # the same weights, attending both ways inside a segment
    model.load_state_dict(lm.state_dict())
    draw, generator = (
        _sampler(len(train_docs), config.batch_size, config.seed),
        torch.Generator().manual_seed(config.seed),
    )

    def batch_loss():
        inputs, padding = _padded([train_docs[i] for i in draw()], segment_len)
        masked, labels = _masked(inputs, padding, mask_rate, mask_id, bidi.vocab_size, generator)
        total, count = mlm_loss(model, masked, labels, segment_len, padding)
        return total / max(1, count)

    trainable = model.crit.parameters() if config.head_only else model.parameters()
    losses = _fit(model, list(trainable), batch_loss, config, log)
    metrics = {"train_loss": sum(losses[-10:]) / len(losses[-10:]), "steps": config.steps, "mask_id": mask_id}
    args = (segment_len, config.batch_size, mask_rate, mask_id, config.seed + 1)
    metrics["train"] = evaluate_mlm(model, train_docs[:TRAIN_SCORED], *args)
    if valid_docs:
        metrics["valid"] = evaluate_mlm(model, valid_docs, *args)
    info = {"task": "mlm", "segment_len": segment_len, "mask_rate": mask_rate, "mask_id": mask_id}
    _save(model, out_dir, {**info, "run": {**run.to_dict(), "model": bidi.to_dict()}, "metrics": metrics})
    return metrics
