"""Is the long context used?  Loss by position inside the segment, and loss as the evaluation memory grows.

* :func:`per_position_losses` is the picture of context fragmentation and its cure.  A model without memory
  predicts the first positions of a segment from almost nothing, so its loss is high there and falls along the
  segment; a memory that works flattens the curve.  Both curves come from the same model on the same segments.
* :func:`context_curve` is the loss when every token sees a given number of positions (``same_length``): it
  shows whether context beyond the training memory is used (the paper's models improve up to several times
  their training memory).

Losses are in nats per token.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import replace

import numpy as np
import torch

from longseq.config.model import Recurrence
from longseq.eval.evaluate import LongerThanTrainedWarning, evaluate, segment_losses, warn_beyond_trained_memory


def _full_memory_segments(tgt_len: int, mem_len: int) -> int:
    """Segments an ordered pass reads before the memory holds ``mem_len`` positions (at least 1)."""
    return max(1, math.ceil(mem_len / tgt_len))


@torch.no_grad()
def per_position_losses(
    model,
    ids: np.ndarray,
    *,
    tgt_len: int,
    batch_size: int,
    recurrence: Recurrence | None = None,
    max_segments: int = 0,
    skip_segments: int | None = None,
    progress: bool = False,
) -> dict:
    """Mean NLL at each position 0 .. ``tgt_len`` - 1 inside the segment, with the memory and without it.

    One ordered pass over ``ids`` (``batch_size`` streams of ``tgt_len`` segments, at most ``max_segments``
    of them) gives ``loss_memory``: the memory carried across segments, with ``recurrence`` or the model's own.  A
    second pass over the same segments gives ``loss_no_memory``: every segment read alone from an empty memory
    (``mem_len`` 0, causal attention inside the segment, the same ``clamp_len``), the same weights.

    The first segments of a pass have an empty or partly filled memory in both passes, so they are read but
    not scored: ``skip_segments`` of them, by default as many as fill the memory (ceil(mem_len / tgt_len),
    at least 1).  Both curves average the same tokens.  A last segment shorter than ``tgt_len`` counts at the
    positions it has; ``tokens`` gives the count per position.
    """
    recurrence = model.config.check_recurrence(recurrence)
    warn_beyond_trained_memory(model.config, recurrence)
    if skip_segments is None:
        skip_segments = _full_memory_segments(tgt_len, recurrence.mem_len)
    if skip_segments < 0:
        raise ValueError(f"skip_segments must be >= 0, got {skip_segments}")
    common = dict(batch_size=batch_size, tgt_len=tgt_len, max_segments=max_segments)
    was_training = model.training
    with_memory = segment_losses(model, ids, recurrence=recurrence, progress=progress, **common)
    alone = segment_losses(
        model, ids, recurrence=replace(recurrence, mem_len=0, same_length=False), carry=False, **common
    )
    sums = {"memory": torch.zeros(tgt_len, dtype=torch.float64), "alone": torch.zeros(tgt_len, dtype=torch.float64)}
    counts = torch.zeros(tgt_len, dtype=torch.float64)
    scored = 0
    try:
        for index, (nll_memory, nll_alone) in enumerate(zip(with_memory, alone)):
            if index < skip_segments:
                continue
            length = nll_memory.size(1)  # (B, T)
            sums["memory"][:length] += nll_memory.double().sum(0).cpu()
            sums["alone"][:length] += nll_alone.double().sum(0).cpu()
            counts[:length] += nll_memory.size(0)
            scored += 1
    finally:
        with_memory.close()
        alone.close()
        model.train(was_training)
    if not scored:
        raise ValueError(
            f"no segment left to score: the pass has at most {max_segments or 'all'} segments and the first "
            f"{skip_segments} only fill the memory; give more data, a larger max_segments or a smaller skip_segments"
        )
    keep = counts > 0
    return {
        "positions": torch.arange(tgt_len)[keep].tolist(),
        "loss_memory": (sums["memory"][keep] / counts[keep]).tolist(),
        "loss_no_memory": (sums["alone"][keep] / counts[keep]).tolist(),
        "tokens": counts[keep].long().tolist(),
        "segments": scored,
        "skip_segments": skip_segments,
        "unit": "nats per token",
    }


def context_curve(
    model,
    ids: np.ndarray,
    contexts: list[int],
    *,
    tgt_len: int,
    batch_size: int,
    recurrence: Recurrence | None = None,
    max_segments: int = 0,
    skip_segments: int = 0,
    progress: bool = False,
) -> dict:
    """Loss of one ordered pass for every evaluation memory length in ``contexts``.

    Context c is :func:`~longseq.eval.evaluate.evaluate` with ``recurrence`` at ``mem_len=c`` (None: the model's
    own with ``same_length`` on, but for learned or entropy chunks, which cannot take it: every token then sees
    exactly the last c positions once the memory is full); context 0 is ``mem_len`` 0, causal
    attention inside the segment (``same_length`` needs a memory).  Only the attention memory is varied: what
    else a model carries from segment to segment (a compressed memory, memory tokens, ssm, conv or LSTM states)
    is kept at every point, context 0 included, and the result names it under ``kept`` (the segment truly alone
    is the "memory cut" curve of :func:`per_position_losses`).  A ``clamp_len`` > 0 in ``recurrence`` clamps
    relative distances, as the paper does when it evaluates with long memories.  ``skip_segments``
    reads that many segments first without scoring them; ceil(max(contexts) / tgt_len) scores every context on
    tokens whose memory is full.
    """
    if model.config.arch != "transformer":
        raise ValueError(
            f"a context curve sets the memory length, and the {model.config.arch} reads its whole past whatever it "
            "is; compare contexts with longseq eval recl, which limits every model to each length"
        )
    if not contexts:
        raise ValueError("context_curve needs at least one context length")
    if any(c < 0 for c in contexts):
        raise ValueError(f"context lengths must be >= 0, got {list(contexts)}")
    if recurrence is None:
        recurrence = model.config.recurrence(same_length=not model.config.hourglass.dynamic)
    recurrence = model.config.check_recurrence(recurrence)
    losses, tokens = [], 0
    warn_beyond_trained_memory(model.config, model.config.recurrence(mem_len=max(contexts)))  # once, the longest
    for c in contexts:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", LongerThanTrainedWarning)
            metrics = evaluate(
                model,
                ids,
                batch_size=batch_size,
                tgt_len=tgt_len,
                recurrence=replace(recurrence, mem_len=c, same_length=recurrence.same_length and c > 0),
                max_segments=max_segments,
                skip_segments=skip_segments,
                progress=progress,
            )
        losses.append(metrics["loss"])
        tokens = metrics["tokens"]
    return {
        "contexts": list(contexts),
        "loss": losses,
        "tokens": tokens,
        "same_length": recurrence.same_length,
        "clamp_len": recurrence.clamp_len,
        "skip_segments": skip_segments,
        "kept": carried_beyond_mem_len(model.config),
        "unit": "nats per token",
    }


def carried_beyond_mem_len(config) -> list[str]:
    """What a model carries across segments besides its attention memory of ``mem_len`` positions."""
    m = config.memory
    kept = [f"compressed memory ({m.cmem_len} slots)"] if m.cmem_len else []
    kept += [f"memory tokens ({m.mem_tokens})"] if m.mem_tokens else []
    return kept + [f"{mixer} state" for mixer in dict.fromkeys(config.layer_mixers) if mixer != "attention"]
