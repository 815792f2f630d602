"""Recall across segments: a sequence of a recall task (:mod:`longseq.data.recall`) read segment by segment with
the memory (or a recurrent state) carried, so that the answer may lie many segments back; accuracy by the
distance of the answer and by the length of the sequence.

    cells = recall_grid(model.lm, task, segment_len=64, distances=[16, 64, 256, 1024], n=64)

The cost is linear in the length: one forward per segment, the softmax only where a label is asked.
"""

from __future__ import annotations

import math
import os

import torch
from torch import Tensor

from longseq.config.task import RecallOptions
from longseq.data.recall import IGNORE, RecallBatch, chance, recall_batch
from longseq.model.heads import read_segments
from longseq.progress import Meter

EVAL_STREAM = 7_777_777  # eval batches come from this stream offset of the seed, apart from training's


BYTES_PER_TOKEN = 24  # a batch holds three int64 arrays of (rows, length): inputs, labels and distances


def available_memory() -> int:
    """Bytes of RAM a new allocation can take now (Linux's MemAvailable; else the free pages)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def check_fits(lengths: list[int], n: int, batch_size: int) -> None:
    """A ``ValueError`` before any work when a batch of the longest sequence would not fit in memory: ``recall
    --distances 1000000000`` ran for minutes, filling 1.5 TB of host arrays, before it could fail."""
    rows, longest = min(n, batch_size), max(lengths)
    need, free = rows * longest * BYTES_PER_TOKEN, available_memory()
    if need > free:
        fits = free // (longest * BYTES_PER_TOKEN)
        raise ValueError(
            f"a batch of {rows} sequences of {longest:,} tokens needs {need / 2**30:,.1f} GiB of host memory, "
            f"{free / 2**30:,.1f} GiB are free: "
            + (f"lower --batch-size to {fits} or less" if fits else "that length does not fit; choose a shorter one")
        )


@torch.no_grad()
def recall_scores(lm, batch: RecallBatch, segment_len: int, on_segment=None) -> tuple[Tensor, Tensor]:
    """Whether the argmax at each asked position is right (K,) and its distance (K,), reading ``batch`` in
    segments of ``segment_len`` with the memory carried (the model's own ``mem_len``); ``on_segment()`` is
    called after each segment (a progress bar)."""
    was_training = lm.training
    lm.eval()
    device = next(lm.parameters()).device
    inputs, labels = batch.inputs.to(device), batch.labels.split(segment_len, dim=1)
    distances = batch.distance.split(segment_len, dim=1)
    correct, distance = [], []
    try:
        for i, _, _, hidden, _ in read_segments(lm, inputs, segment_len):
            keep = labels[i] != IGNORE  # (B, T), on the host with the labels: no device read per segment
            if keep.any():
                logits = lm.head(hidden[keep.to(device)][None]).logits[0]  # (K, V)
                correct.append(logits.argmax(-1).cpu() == labels[i][keep])
                distance.append(distances[i][keep])
            if on_segment is not None:
                on_segment()
    finally:
        lm.train(was_training)
    return torch.cat(correct), torch.cat(distance)


def passkey_length(options: RecallOptions, distance: int, segment_len: int) -> int:
    """The length a passkey eval at ``distance`` uses: the shortest whole number of segments it fits in."""
    need = distance + options.key_len + 1
    return -(-need // segment_len) * segment_len


def recall_cell(
    lm,
    options: RecallOptions,
    segment_len: int,
    length: int,
    distance: int | None = None,
    n: int = 64,
    batch_size: int = 64,
    seed: int = 0,
    progress: bool = False,
) -> dict:
    """Accuracy over ``n`` sequences of ``length`` tokens (passkey: the key at ``distance``): ``accuracy``,
    ``asked`` (the labels scored) and, by powers of two of the distance, ``by_distance``.  ``progress``: the
    segments read, on stderr (a bar on a terminal, lines elsewhere)."""
    correct, distance_of = [], []
    segments = -(-length // segment_len)
    what = f"recall length {length:,}" + ("" if distance is None else f" distance {distance:,}")
    with Meter(segments * -(-n // batch_size), what, enabled=progress, quiet_start=True) as bar:
        for first in range(0, n, batch_size):
            rows = min(batch_size, n - first)
            batch = recall_batch(options, seed + EVAL_STREAM, first // batch_size, rows, length, distance)
            c, d = recall_scores(lm, batch, segment_len, on_segment=lambda: bar.update(1))
            correct.append(c)
            distance_of.append(d)
    hits, far = torch.cat(correct).float(), torch.cat(distance_of)
    bucket_of, buckets = torch.as_tensor([_bucket(int(x)) for x in far]), {}
    for bucket in bucket_of.unique().tolist():  # ascending
        where = bucket_of == bucket
        buckets[str(bucket)] = {"accuracy": float(hits[where].mean()), "asked": int(where.sum())}
    cell = {"length": length, "accuracy": float(hits.mean()), "asked": len(hits), "by_distance": buckets}
    return cell if distance is None else {"distance": distance, **cell}


def _bucket(distance: int) -> int:
    """The power of two at or above ``distance`` (1 for 0 and 1)."""
    return 1 << max(0, math.ceil(math.log2(max(1, distance))))


def recall_grid(
    lm,
    options: RecallOptions,
    segment_len: int,
    *,
    distances: list[int] | None = None,
    lengths: list[int] | None = None,
    n: int = 64,
    batch_size: int = 64,
    seed: int = 0,
    progress: bool = False,
) -> dict:
    """Accuracy against distance (passkey: ``distances``, each at the shortest whole number of segments it fits
    in) or against length (``lengths``; every task), with what the model reaches: ``effective_range`` (attention's
    n_layer x mem_len, as the model reports it) and the task's ``chance``.  A batch that cannot fit in memory is
    refused before any work (:func:`check_fits`)."""
    if not distances and not lengths:
        raise ValueError("give distances (passkey) or lengths to evaluate recall at")
    if distances and options.name != "passkey":
        raise ValueError(f"distances are chosen by the passkey task; evaluate {options.name} at lengths")
    asked = [(passkey_length(options, d, segment_len), d) for d in distances or []]
    asked += [(length, None) for length in lengths or []]
    check_fits([length for length, _ in asked], n, batch_size)
    cells = [
        recall_cell(lm, options, segment_len, length, d, n, batch_size, seed, progress=progress) for length, d in asked
    ]
    c = lm.config
    reach = c.effective_range if "attention" in c.layer_mixers else 0  # mem_len is read by attention layers only
    return {
        "task": options.name,
        "segment_len": segment_len,
        "mem_len": c.memory.mem_len,
        "effective_range": reach,
        "chance": chance(options),
        "n": n,
        "cells": cells,
    }
