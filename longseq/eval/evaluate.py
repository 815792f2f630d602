"""Evaluation: loss, perplexity, bits per character, bits per byte and throughput over one ordered pass.

Bits per byte (``bpb``), whatever the tokenizer: the total NLL in bits over the UTF-8 bytes of the text the scored
tokens stand for (:meth:`~longseq.data.tokenizers.Tokenizer.text_bytes`: a word tokenizer's text is its words
joined by single spaces, lines ended by a newline).  Only the tokens scored count: with ``max_segments`` the bytes
are those of the segments read.  For a byte tokenizer bpb is the bits per token; for a character tokenizer it
differs from ``bpc`` (bits per character) where the text has characters of several bytes.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Iterator

import numpy as np
import torch
from torch import Tensor

from longseq.config.model import Recurrence
from longseq.data.batching import OrderedStream, Segment
from longseq.model import KVMemory, Memory, TransformerXLLM, build_model
from longseq.model.positions import POSITION_ENCODINGS, position_encoding
from longseq.progress import Meter


def start_memory(model: TransformerXLLM, kv_memory: bool = True, doc_ids=None) -> Memory | None:
    """The memory an ordered pass starts from: projected keys and values when the model allows it."""
    c = model.config
    relative = c.arch == "transformer" and position_encoding(c.positions.pos).relative
    if kv_memory and relative and not c.memory.compacted and doc_ids is None:
        return Memory.empty(KVMemory)
    return None


ROPE_SETTINGS = (
    "rope_scaling",
    "rope_factor",
    "rope_original_len",
)  # EvalConfig.positions: a rope model's own replaced


def refuse_unread_settings(config, given: dict[str, str]) -> None:
    """Evaluation settings the model ``config`` does not read, refused by name, saying why and what applies
    instead (``given``: each setting -> how the user named it, ``--set clamp_len``, ``model_args mem_len``): the
    memory's (``mem_len``, ``clamp_len``, ``same_length``, ``sinks``, ``sink_positions``) and rope's on an LSTM or a
    stack without attention, whose recurrent state reads the whole past; ``clamp_len`` with positions that clamp no
    distance (rope, NoPE, absolute); rope's with positions other than rope."""
    if not given:
        return
    named = lambda names: ", ".join(given[name] for name in names)  # noqa: E731
    if config.arch == "lstm" or "attention" not in config.layer_mixers:
        what = "the lstm" if config.arch == "lstm" else f"this model (mixer={','.join(config.mixer)}) has no attention"
        raise ValueError(
            f"{named(given)}: {what}{' layer: its recurrent state' if config.arch != 'lstm' else ''} reads its whole "
            "past, so these do not apply (they would change nothing): leave them out, its state already carries "
            "every earlier token"
        )
    pos, positions = config.positions.pos, config.positions
    clamps = [
        name for name, e in POSITION_ENCODINGS.items() if "positions.clamp_len" not in e.unread_options(positions)
    ]
    if "clamp_len" in given and pos not in clamps:
        instead = (
            "a shorter mem_len bounds the distances it reads, and rope_scaling=ntk or linear with rope_factor (about "
            "the ratio) stretches its positions for a memory longer than trained"
            if pos == "rope"
            else "a shorter mem_len bounds the distances it reads"
        )
        raise ValueError(
            f"{given['clamp_len']}: pos={pos} clamps no distance (clamp_len is read by pos={', '.join(clamps)}), so "
            f"it would change nothing; {instead}"
        )
    rope = [name for name in ROPE_SETTINGS if name in given]
    if rope and pos != "rope":
        instead = "clamp_len bounds the distances it scores" if pos in clamps else "they need no stretching"
        raise ValueError(
            f"{named(rope)}: rope_scaling stretches rotary positions (pos=rope); this model has pos={pos}, which "
            f"they would not change: {instead}"
        )


def with_positions(model: TransformerXLLM, positions) -> TransformerXLLM:
    """``model`` with its positions config replaced by ``positions`` (an evaluation's rope scaling): a model built
    anew from the changed config with the same weights (rope has none of its own), on the same device and dtype,
    in eval mode.  ``model`` itself is unchanged."""
    if positions == model.config.positions:
        return model
    parameter = next(model.parameters())
    out = build_model(model.config.replace(positions=positions.to_dict())).to(
        device=parameter.device, dtype=parameter.dtype
    )
    out.load_state_dict(model.state_dict())
    return out.eval()


class LongerThanTrainedWarning(UserWarning):
    """An evaluation reads a memory longer than the model was trained with, and its positions do not extrapolate."""


def beyond_trained_memory(config, recurrence: Recurrence) -> str | None:
    """What to tell a user who evaluates a model whose position encoding does not extrapolate (rope:
    ``PositionEncoding.extrapolates`` False) with a memory longer than its training memory (times ``rope_factor``
    when ``rope_scaling`` stretches it); None within the trained length, or for encodings that extrapolate."""
    if config.arch != "transformer" or "attention" not in config.layer_mixers:
        return None
    positions = config.positions
    if position_encoding(positions.pos).extrapolates:
        return None
    trained = config.memory.mem_len
    reach = trained * (positions.rope_factor if positions.rope_scaling != "none" else 1.0)
    if recurrence.mem_len <= reach:
        return None
    ratio = f"{recurrence.mem_len / trained:.3g}x the {trained:,}" if trained else "a model trained without one, 0"
    return (
        f"evaluating a {positions.pos} model with a memory of {recurrence.mem_len:,} positions, {ratio} it was "
        "trained with: its positions do not extrapolate beyond the distances seen in training, so the loss grows "
        "with the memory instead of falling (char PTB trained at 128: rope 2.03 bpc at 1x, 3.38 at 2x, 4.56 at 4x; "
        "ALiBi 2.07 at each). For a longer memory at evaluation, train with pos=alibi (or sinusoidal), or scale "
        "rope: rope_scaling=ntk with rope_factor at least the ratio (2.03 bpc at 2x, no training); "
        "docs/attention.md, 'Longer memories at evaluation'"
    )


def warn_beyond_trained_memory(config, recurrence: Recurrence) -> None:
    """:func:`beyond_trained_memory`'s message as a :class:`LongerThanTrainedWarning`, where there is one."""
    message = beyond_trained_memory(config, recurrence)
    if message is not None:
        warnings.warn(message, LongerThanTrainedWarning, stacklevel=3)


@torch.no_grad()
def scored_segments(
    model: TransformerXLLM,
    ids: np.ndarray,
    *,
    batch_size: int,
    tgt_len: int,
    recurrence: Recurrence | None = None,
    max_segments: int = 0,
    carry: bool = True,
    progress: bool = False,
    progress_interval_s: float = 30.0,
    kv_memory: bool = True,
    doc_ids: np.ndarray | None = None,
) -> Iterator[tuple[Segment, Tensor]]:
    """Every segment of one ordered pass (``batch_size`` streams), in order, with its per-token NLL (B, T).

    The settings are those of :func:`evaluate` (``recurrence`` None: the model's own).  With ``carry=False`` every
    segment starts from an empty memory (the model reads each segment alone).  The model is in eval mode while the
    generator runs.
    """
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    stream = OrderedStream(ids, batch_size, tgt_len, doc_ids=doc_ids)
    total = stream.n_segments() if not max_segments else min(max_segments, stream.n_segments())
    start = start_memory(model, kv_memory, doc_ids)
    mems = start
    try:
        with Meter(total, "eval", enabled=progress, interval_s=progress_interval_s, quiet_start=True) as bar:
            for _ in range(total):
                segment = stream.next_segment(cycle=False)
                if segment is None:
                    break
                out = model(
                    segment.input_ids.to(device),
                    mems if carry else start,
                    segment.labels.to(device),
                    recurrence=recurrence,
                    doc_ids=None if segment.doc_ids is None else segment.doc_ids.to(device),
                )
                mems = out.mems
                bar.update(1)
                yield segment, out.nll
    finally:
        model.train(was_training)


def segment_losses(model: TransformerXLLM, ids: np.ndarray, **settings) -> Iterator[Tensor]:
    """The per-token NLL (B, T) of every segment of one ordered pass (:func:`scored_segments`' settings)."""
    segments = scored_segments(model, ids, **settings)
    try:
        for _, nll in segments:
            yield nll
    finally:
        segments.close()


def evaluate(
    model: TransformerXLLM,
    ids: np.ndarray,
    *,
    batch_size: int,
    tgt_len: int,
    recurrence: Recurrence | None = None,
    max_segments: int = 0,
    skip_segments: int = 0,
    bits_unit: str | None = None,
    progress: bool = False,
    progress_interval_s: float = 30.0,
    kv_memory: bool = True,
    doc_ids: np.ndarray | None = None,
    tokenizer=None,
) -> dict:
    """One pass over ``ids`` in ``batch_size`` streams of ``tgt_len`` segments, memory carried across.

    ``recurrence`` (a :class:`~longseq.config.model.Recurrence`) replaces the model's own
    (``model.config.recurrence()``; ``model.config.recurrence(mem_len=640)``: the model's own with a longer memory).  ``max_segments`` > 0 stops early.  ``skip_segments``
    > 0 reads that many segments first without scoring them (to fill the memory).  ``bits_unit`` (``"bpc"``) adds
    loss / ln 2.  ``kv_memory`` carries projected keys and values instead of hidden states (same results, less work
    per segment).
    ``doc_ids`` (one per token) keeps documents apart.  ``tokenizer`` (the one ``ids`` were made by) adds ``bpb``
    and ``bytes``, the bytes of the scored tokens (see the module docstring).
    """
    if skip_segments < 0:
        raise ValueError(f"skip_segments must be >= 0, got {skip_segments}")
    recurrence = model.config.check_recurrence(recurrence)
    warn_beyond_trained_memory(model.config, recurrence)
    nll_sum, n_tokens, n_bytes = None, 0, 0  # the sum stays on the model's device: read once, at the end
    units = None  # (NLL, count) of the labels the tokenizer's bits metric counts, where it counts only some
    start = time.perf_counter()
    passes = scored_segments(
        model,
        ids,
        batch_size=batch_size,
        tgt_len=tgt_len,
        recurrence=recurrence,
        max_segments=max_segments,
        progress=progress,
        progress_interval_s=progress_interval_s,
        kv_memory=kv_memory,
        doc_ids=doc_ids,
    )
    read = 0
    for index, (segment, nll) in enumerate(passes):
        read += 1
        if index >= skip_segments:
            part = nll.double().sum()
            nll_sum = part if nll_sum is None else nll_sum + part
            n_tokens += nll.numel()
            if tokenizer is not None:
                n_bytes += tokenizer.text_bytes(segment.labels.numpy(), previous=segment.input_ids.numpy())
                units = _count_units(tokenizer, segment.labels, nll, units)
    elapsed = time.perf_counter() - start
    if n_tokens == 0:  # a loss of 0 over nothing would read as a perfect model
        raise ValueError(
            f"no token was scored: the pass read {read} segment(s) of {tgt_len} tokens and skip_segments="
            f"{skip_segments} skips them all; give more data, a larger max_segments or a smaller skip_segments"
        )
    nll_sum = float(nll_sum)
    loss = nll_sum / max(n_tokens, 1)
    metrics = lm_metrics(
        loss, n_tokens, elapsed, bits_unit, nll_sum / math.log(2) / n_bytes if n_bytes else None, n_bytes
    )
    if units is not None and bits_unit:  # the metric over the labels it counts (audio: the samples)
        metrics[bits_unit] = float(units[0]) / math.log(2) / max(units[1], 1)
    return metrics


def _count_units(tokenizer, labels: Tensor, nll: Tensor, units):
    """``units`` (NLL, count) with this segment's labels that ``tokenizer.scored`` counts added (None: it counts
    every label)."""
    mask = tokenizer.scored(labels.numpy())
    if mask is None:
        return units
    mask = torch.as_tensor(mask, device=nll.device)
    part, count = (nll.double() * mask).sum(), int(mask.sum())
    return (part, count) if units is None else (units[0] + part, units[1] + count)


def lm_metrics(
    loss: float, tokens: int, elapsed: float, bits_unit: str | None, bpb: float | None, n_bytes: int
) -> dict:
    """An evaluation's numbers, in the order a person reads them: loss (nats per token), perplexity, bits per
    character (``bits_unit``), bits per byte, what was scored, speed."""
    metrics = {"loss": loss, "ppl": math.exp(min(loss, 700.0))}
    if bits_unit:
        metrics[bits_unit] = loss / math.log(2)
    if bpb is not None:
        metrics["bpb"] = bpb
    metrics["tokens"] = tokens
    if bpb is not None:
        metrics["bytes"] = n_bytes
    metrics["tokens_per_s"] = tokens / elapsed if elapsed > 0 else float("inf")
    return metrics
