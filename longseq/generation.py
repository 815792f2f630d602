"""Sampling with the recurrence memory: the prompt is read in segments, then one token at a time.

Every step feeds only the newest token; everything before it is in a key/value memory, so the
context is never recomputed and its keys and values are never projected again.  The memory keeps
the last ``mem_len`` positions.  The vanilla Transformer (absolute positions, no memory) has no such cache: every step
reads the window of the last ``segment_len`` tokens again, at the positions it was trained on.
"""

from __future__ import annotations

import math
from functools import partial

import torch
from torch import Tensor

from longseq.config.model import Recurrence
from longseq.model import HiddenMemory, Memory, RingMemory, TransformerXLLM
from longseq.model.positions import position_encoding


def filter_logits(logits: Tensor, top_k: int = 0, top_p: float = 1.0) -> Tensor:
    """Set to -inf every logit outside the ``top_k`` largest and outside the nucleus of mass ``top_p``."""
    if top_k > 0 and top_k < logits.size(-1):
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs  # mass of the strictly more likely tokens
        drop_sorted = mass_before >= top_p  # the most likely token always stays
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def check_sampling(max_new_tokens: int, temperature: float, top_k: int, top_p: float) -> None:
    """Each sampling argument in its range, or a ``ValueError`` naming the one that is not (the memory's are the
    :class:`~longseq.config.Recurrence`'s to check)."""
    if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
    if not math.isfinite(temperature) or temperature < 0:
        raise ValueError(f"temperature must be a finite number >= 0 (0: greedy), got {temperature}")
    if top_k < 0:
        raise ValueError(f"top_k must be >= 0 (0: off), got {top_k}")
    if not (math.isfinite(top_p) and 0.0 < top_p <= 1.0):
        raise ValueError(f"top_p must be in (0, 1] (1: off), got {top_p}")


@torch.no_grad()
def generate_stream(
    model: TransformerXLLM,
    prompt_ids: Tensor,  # (B, P)
    max_new_tokens: int,
    *,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    recurrence: Recurrence | None = None,
    segment_len: int = 128,
    generator: torch.Generator | None = None,
):
    """Yield the sampled tokens (B, 1) one step at a time, as they are drawn; ``temperature=0`` is greedy.  Every
    call of the model reads and writes the memory with ``recurrence`` (None: the model's own;
    ``model.config.recurrence(mem_len=...)`` another, e.g. its own memory plus a segment, as ``longseq generate``)."""
    if prompt_ids.dim() != 2 or prompt_ids.size(1) == 0:
        raise ValueError(f"prompt_ids must be a non-empty (batch, time) tensor, got shape {tuple(prompt_ids.shape)}")
    check_sampling(max_new_tokens, temperature, top_k, top_p)
    recurrence = model.config.check_recurrence(recurrence)
    was_training = model.training
    model.eval()
    draw = partial(_draw, temperature=temperature, top_k=top_k, top_p=top_p, generator=generator)
    prompt_ids = prompt_ids.to(next(model.parameters()).device)
    try:
        if windowed(model):
            yield from _windowed(model, prompt_ids, max_new_tokens, segment_len, draw)
            return
        mems = read_prompt(model, prompt_ids[:, :-1], segment_len, recurrence)
        token = prompt_ids[:, -1:]
        for _ in range(max_new_tokens):
            scores, mems = model.next_token_scores(token, mems, recurrence=recurrence)  # (B, V)
            token = draw(scores)
            yield token
    finally:
        model.train(was_training)


def windowed(model: TransformerXLLM) -> bool:
    """Whether ``model`` samples without a memory (the vanilla Transformer: absolute positions, no recurrence)."""
    return model.config.arch == "transformer" and not position_encoding(model.config.positions.pos).relative


def read_prompt(
    model: TransformerXLLM,
    context: Tensor,
    segment_len: int,
    recurrence: Recurrence | None = None,
    mems: Memory | None = None,
) -> Memory:
    """The memory after reading ``context`` (B, C) in segments of ``segment_len`` after ``mems`` (None: a new
    one) with ``recurrence`` (None: the model's own): what sampling starts from (the prompt's last token is then
    fed alone).  Ring storage: never projected twice, never copied."""
    if mems is None:
        mems = Memory.empty(HiddenMemory if model.config.memory.compacted else RingMemory)
    for start in range(0, context.size(1), segment_len):
        mems = model.read(context[:, start : start + segment_len], mems, recurrence=recurrence)
    return mems


def _windowed(model, prompt_ids: Tensor, max_new_tokens: int, window: int, draw):
    """Sampling without a memory: each token from the last ``window`` tokens, read again (B, 1) per step."""
    ids = prompt_ids
    for _ in range(max_new_tokens):
        scores, _ = model.next_token_scores(
            ids[:, -window:], None, recurrence=model.config.recurrence(mem_len=0)
        )  # (B, V)
        token = draw(scores)
        ids = torch.cat([ids[:, -window:], token], dim=1)
        yield token


def _draw(scores: Tensor, *, temperature: float, top_k: int, top_p: float, generator) -> Tensor:
    """The next token (B, 1) from scores (B, V): the argmax at ``temperature`` 0, else a filtered sample."""
    if temperature == 0:
        return scores.argmax(dim=-1, keepdim=True)
    probs = torch.softmax(filter_logits(scores.float() / temperature, top_k, top_p), dim=-1)
    if generator is not None and generator.device != probs.device:  # a CPU generator draws for a CUDA model
        return torch.multinomial(probs.to(generator.device), 1, generator=generator).to(probs.device)
    return torch.multinomial(probs, 1, generator=generator)


def generate(model: TransformerXLLM, prompt_ids: Tensor, max_new_tokens: int, **sampling) -> Tensor:
    """Return (B, max_new_tokens) sampled continuations (arguments as :func:`generate_stream`)."""
    out = list(generate_stream(model, prompt_ids, max_new_tokens, **sampling))
    return torch.cat(out, dim=1) if out else prompt_ids.new_zeros(prompt_ids.size(0), 0)


@torch.no_grad()
def forecast(
    model: TransformerXLLM,
    tokenizer,
    context,
    horizon: int,
    *,
    num_samples: int = 20,
    quantiles: tuple[float, ...] = (0.1, 0.5, 0.9),
    temperature: float = 1.0,
    top_k: int = 0,
    segment_len: int = 128,
    mem_len: int | None = None,
    generator: torch.Generator | None = None,
) -> dict:
    """Chronos's forecast: ``num_samples`` continuations of the series ``context`` (its values, a 1-d array) for
    ``horizon`` steps, drawn from ``model`` over a ``chronos`` tokenizer's bins, and their ``quantiles``.  The context
    is mean-scaled and quantized; PAD, EOS and the bin below all are never drawn (Chronos asks for exactly
    ``prediction_length`` tokens); the draws are the bins' centres times the context's scale.  Returns ``samples``
    (num_samples, horizon), ``median``, ``mean``, ``quantiles`` ({q: (horizon,)}) and ``scale``, numpy arrays."""
    import numpy as np

    from longseq.data.tokenizers.chronos import SPECIAL, ChronosTokenizer, scale_encode, unscale

    if not isinstance(tokenizer, ChronosTokenizer):
        raise TypeError(f"forecast reads a chronos tokenizer's bins; this model's tokenizer is {tokenizer.kind}")
    if horizon < 1 or num_samples < 1 or len(context) < 1:
        raise ValueError(f"forecast needs horizon >= 1, num_samples >= 1 and a context, got {horizon}, {num_samples}")
    if windowed(model):
        raise ValueError("forecast samples with the memory; a vanilla Transformer (no memory) cannot")
    check_sampling(horizon, temperature, top_k, 1.0)
    ids, scale = scale_encode(tokenizer, np.asarray(context, dtype=np.float64))
    device = next(model.parameters()).device
    prompt = torch.as_tensor(ids, device=device)[None].repeat(num_samples, 1)  # (S, C)
    recurrence = model.config.recurrence(mem_len=mem_len)
    was_training = model.training
    model.eval()
    try:
        mems = read_prompt(model, prompt[:, :-1], segment_len, recurrence)
        token, drawn = prompt[:, -1:], []
        for _ in range(horizon):
            scores, mems = model.next_token_scores(token, mems, recurrence=recurrence)  # (S, V)
            scores[:, : SPECIAL + 1] = float("-inf")
            token = _draw(scores, temperature=temperature, top_k=top_k, top_p=1.0, generator=generator)
            drawn.append(token)
    finally:
        model.train(was_training)
    samples = unscale(tokenizer, torch.cat(drawn, dim=1).cpu().numpy(), scale)  # (S, H)
    return {
        "samples": samples,
        "median": np.quantile(samples, 0.5, axis=0),
        "mean": samples.mean(axis=0),
        "quantiles": {q: np.quantile(samples, q, axis=0) for q in quantiles},
        "scale": scale,
    }
