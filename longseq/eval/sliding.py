"""Per-token losses for effective-context measurements, and the vanilla Transformer's sliding-window evaluation.

The vanilla Transformer (Al-Rfou et al., 2018) has no memory: the paper evaluates it by sliding a window of
the training length one token at a time, recomputing the whole window for every prediction.  A recurrent
model (Transformer-XL, LSTM) is evaluated in order with its memory carried; at context length c with
``same_length``, every token of a Transformer-XL sees exactly c positions.
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch
from tqdm import tqdm

from longseq.eval.evaluate import lm_metrics
from longseq.model.transformer import IGNORE_INDEX


@torch.no_grad()
def sliding_window_losses(
    model, ids: np.ndarray, *, context: int, batch_size: int = 16, max_targets: int = 0, progress: bool = False
) -> np.ndarray:
    """NLL of every target ids[1:], each predicted from the ``context`` tokens before it (the first
    ``context`` targets from the shorter prefix), one window per target.  ``max_targets`` > 0 stops early."""
    if context < 1:
        raise ValueError(f"context must be >= 1, got {context}")
    data = torch.as_tensor(np.asarray(ids, dtype=np.int64))
    n_targets = len(data) - 1 if not max_targets else min(max_targets, len(data) - 1)
    if n_targets < 1:
        raise ValueError("sliding-window evaluation needs at least two tokens")
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    first = min(context, n_targets)
    alone = model.config.recurrence(mem_len=0)  # every window read from an empty memory
    out = model(data[None, :first].to(device), None, data[None, 1 : first + 1].to(device), recurrence=alone)
    losses = [out.nll[0].double().cpu()]
    starts = torch.arange(1, n_targets - context + 1)  # window [s, s + context) predicts data[s + context]
    offsets = torch.arange(context)
    with tqdm(total=len(starts), desc="sliding", unit="tok", disable=not progress or None, leave=False) as bar:
        for chunk in starts.split(batch_size):
            windows = data[chunk[:, None] + offsets]  # (b, context)
            labels = torch.full_like(windows, IGNORE_INDEX)
            labels[:, -1] = data[chunk + context]
            nll = model(windows.to(device), None, labels.to(device), recurrence=alone).nll[:, -1]
            losses.append(nll.double().cpu())
            bar.update(len(chunk))
    model.train(was_training)
    return torch.cat(losses).numpy()


@torch.no_grad()
def recurrent_losses(model, ids: np.ndarray, *, context: int, tgt_len: int, max_targets: int = 0) -> np.ndarray:
    """NLL of every target ids[1:] from one ordered stream with the memory carried.  For a Transformer-XL,
    ``mem_len = context`` with ``same_length``: every token attends to exactly ``context`` positions once the
    memory is full."""
    data = torch.as_tensor(np.asarray(ids, dtype=np.int64))
    n_targets = len(data) - 1 if not max_targets else min(max_targets, len(data) - 1)
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    mems, losses = None, []
    recurrence = model.config.recurrence(mem_len=context, same_length=True)
    for start in range(0, n_targets, tgt_len):
        stop = min(n_targets, start + tgt_len)
        x = data[None, start:stop].to(device)
        y = data[None, start + 1 : stop + 1].to(device)
        out = model(x, mems, y, recurrence=recurrence)
        mems = out.mems
        losses.append(out.nll[0].double().cpu())
    model.train(was_training)
    return torch.cat(losses).numpy()


def evaluate_sliding(
    model,
    ids: np.ndarray,
    *,
    context: int,
    batch_size: int = 16,
    max_targets: int = 0,
    bits_unit: str | None = None,
    tokenizer=None,
) -> dict:
    """The metrics of :func:`longseq.eval.evaluate` (loss, ppl, bpc, bpb with ``tokenizer``, tokens, bytes,
    tokens/s) for the vanilla protocol; the bytes are those of the targets scored, ids[1 : n + 1]."""
    start = time.perf_counter()
    losses = sliding_window_losses(model, ids, context=context, batch_size=batch_size, max_targets=max_targets)
    elapsed = time.perf_counter() - start
    loss, n = float(losses.mean()), int(losses.size)
    n_bytes = 0 if tokenizer is None else tokenizer.text_bytes(np.asarray(ids[1 : n + 1]), previous=np.asarray(ids[:n]))
    bpb = float(losses.sum()) / math.log(2) / n_bytes if n_bytes else None
    return {**lm_metrics(loss, n, elapsed, bits_unit, bpb, n_bytes), "protocol": f"sliding window of {context}"}
