"""Evaluation: loss, perplexity, bits per character or byte, and throughput over one ordered pass."""

from __future__ import annotations

import math
import time

import numpy as np
import torch
from tqdm import tqdm

from longseq.data.batching import OrderedStream
from longseq.model import Memory, TransformerXLLM
from longseq.model.positions import position_encoding


def bits_unit(tokenizer_kind: str) -> str | None:
    """``"bpc"`` where a token is a character or a byte (bits per token are then bits per character), else None."""
    return "bpc" if tokenizer_kind in ("byte", "char") else None


@torch.no_grad()
def evaluate(
    model: TransformerXLLM,
    ids: np.ndarray,
    *,
    batch_size: int,
    tgt_len: int,
    mem_len: int | None = None,
    clamp_len: int | None = None,
    same_length: bool | None = None,
    max_segments: int = 0,
    bits_unit: str | None = None,
    progress: bool = False,
    kv_memory: bool = True,
    doc_ids: np.ndarray | None = None,
) -> dict:
    """One pass over ``ids`` in ``batch_size`` streams of ``tgt_len`` segments, memory carried across.

    ``mem_len``, ``clamp_len`` and ``same_length`` override the model's own settings (``None`` keeps
    them).  ``max_segments`` > 0 stops early.  ``bits_unit`` (``"bpc"``) adds loss / ln 2.  ``kv_memory``
    carries projected keys and values instead of hidden states (same results, less work per segment).
    ``doc_ids`` (one per token) keeps documents apart.
    """
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    stream = OrderedStream(ids, batch_size, tgt_len, doc_ids=doc_ids)
    total = stream.n_segments() if not max_segments else min(max_segments, stream.n_segments())
    c = model.config
    relative = c.arch == "transformer" and position_encoding(c.positions.pos).relative
    kv_memory = kv_memory and relative and not c.memory.compacted and doc_ids is None
    mems = Memory.empty("kv") if kv_memory else None
    nll_sum, n_tokens = 0.0, 0
    start = time.perf_counter()
    with tqdm(total=total, desc="eval", unit="seg", disable=not progress or None, leave=False) as bar:
        for _ in range(total):
            segment = stream.next_segment(cycle=False)
            if segment is None:
                break
            out = model(
                segment.input_ids.to(device),
                mems,
                segment.labels.to(device),
                mem_len=mem_len,
                clamp_len=clamp_len,
                same_length=same_length,
                doc_ids=None if segment.doc_ids is None else segment.doc_ids.to(device),
            )
            mems = out.mems
            nll_sum += float(out.nll.double().sum())
            n_tokens += segment.labels.numel()
            bar.update(1)
    elapsed = time.perf_counter() - start
    model.train(was_training)
    loss = nll_sum / max(n_tokens, 1)
    metrics = {
        "loss": loss,
        "ppl": math.exp(min(loss, 700.0)),
        "tokens": n_tokens,
        "tokens_per_s": n_tokens / elapsed if elapsed > 0 else float("inf"),
    }
    if bits_unit:
        metrics[bits_unit] = loss / math.log(2)
    return metrics
