"""Fine-tuning an LM checkpoint for long-document classification (``longseq finetune --task classify``).

Documents are tokenized with the checkpoint's tokenizer, left-padded within a batch to a whole number of
segments (so the last position is every document's real last token), and read segment by segment with the
memory carried.  Full fine-tuning uses layer-wise learning-rate decay (``layer_lr_decay``); ``head_only`` trains
the classifier alone.  The result directory holds ``model.safetensors`` (backbone + head) and ``finetune.json``
(label names, pooling, segment length, the LM's run config and the metrics).
"""

from __future__ import annotations

import json
import math
import os
import random

import torch
from safetensors.torch import save_model

from longseq.config import TrainConfig
from longseq.data.tasks import TaskDataError, read_jsonl
from longseq.model.heads import DocumentClassifier
from longseq.train.checkpoint import load_checkpoint
from longseq.train.optim import build_optimizer


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


def _batch(docs, segment_len: int):
    longest = max(len(ids) for ids, _ in docs)
    length = -(-longest // segment_len) * segment_len
    inputs = torch.zeros(len(docs), length, dtype=torch.long)  # left padding with token 0
    for row, (ids, _) in enumerate(docs):
        inputs[row, length - len(ids) :] = torch.as_tensor(ids)
    return inputs, torch.as_tensor([label for _, label in docs])


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
        inputs, labels = _batch(docs[start : start + batch_size], segment_len)
        predicted += model(inputs, segment_len)["logits"].argmax(-1).tolist()
        gold += labels.tolist()
    model.train()
    return classification_metrics(predicted, gold, n_classes)


def finetune_classifier(
    checkpoint: str,
    train_path: str,
    out_dir: str,
    *,
    valid_path: str | None = None,
    steps: int = 200,
    batch_size: int = 8,
    segment_len: int | None = None,
    lr: float = 1e-3,
    layer_lr_decay: float = 0.8,
    head_only: bool = False,
    pooling: str = "last",
    lm_weight: float = 0.0,
    seed: int = 0,
    log=None,
) -> dict:
    log = log or (lambda message: None)
    lm, tokenizer, run, _ = load_checkpoint(checkpoint)
    records = read_jsonl(train_path, "classify")
    names = sorted({r["label"] for r in records}, key=lambda x: (str(type(x)), x))
    label_index = {name: i for i, name in enumerate(names)}
    if len(names) < 2:
        raise TaskDataError(f"{train_path}: classification needs at least 2 labels, found {names}")
    train_docs = _encode(records, tokenizer, label_index, train_path)
    valid_docs = _encode(read_jsonl(valid_path, "classify"), tokenizer, label_index, valid_path) if valid_path else None
    segment_len = segment_len or run.data.tgt_len
    torch.manual_seed(seed)
    model = DocumentClassifier(lm, len(names), pooling).train()
    if head_only:
        for p in model.lm.parameters():
            p.requires_grad_(False)
    config = TrainConfig(lr=lr, layer_lr_decay=layer_lr_decay if not head_only else 1.0, max_steps=steps)
    optimizer = build_optimizer(model, config)
    rng = random.Random(seed)
    order: list[int] = []
    losses = []
    for step in range(steps):
        if len(order) < batch_size:
            order += rng.sample(range(len(train_docs)), len(train_docs))
        batch = [train_docs[order.pop()] for _ in range(min(batch_size, len(train_docs)))]
        inputs, labels = _batch(batch, segment_len)
        warm = min(1.0, (step + 1) / max(1, steps // 10))
        for group in optimizer.param_groups:
            group["lr"] = lr * warm * group.get("lr_scale", 1.0)
        loss = model(inputs, segment_len, labels, lm_weight=lm_weight)["loss"]
        if not math.isfinite(loss.item()):
            raise TaskDataError(f"fine-tuning loss is {loss.item()} at step {step + 1}; lower the learning rate")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
        if (step + 1) % max(1, steps // 10) == 0:
            log(f"step {step + 1}: loss {loss.item():.4f}")
    metrics = {"train_loss": sum(losses[-10:]) / len(losses[-10:]), "steps": steps, "labels": names}
    metrics["train"] = evaluate_classifier(model, train_docs, segment_len, batch_size, len(names))
    if valid_docs:
        metrics["valid"] = evaluate_classifier(model, valid_docs, segment_len, batch_size, len(names))
    os.makedirs(out_dir, exist_ok=True)
    save_model(model, os.path.join(out_dir, "model.safetensors"))
    with open(os.path.join(out_dir, "finetune.json"), "w", encoding="utf-8") as f:
        json.dump({"task": "classify", "pooling": pooling, "segment_len": segment_len, "run": run.to_dict(),
                   "metrics": metrics}, f, indent=2)  # fmt: skip
    return metrics
