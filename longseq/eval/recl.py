"""Relative Effective Context Length (Dai et al., 2019, section 4.2 and appendix C).

For a group of models, ``losses[m][c]`` is model m's per-token loss l_m(c, t) over the same tokens t when
each token is predicted with context length c.  At a short length c the group's baseline is the best model
per token, b(c, t) = min_m l_m(c, t).  The relative loss of model m when its context grows to c' >= c is

    f_m(c, c') = mean over t in T of  min(b(c, t), l_m(c', t))

where T is the top-r fraction of tokens with the largest b(c, t) (those where the short context is not
enough); only improvements over the common baseline count.  The relative gain is the relative perplexity
reduction g_m(c, c') = (exp f_m(c, c) - exp f_m(c, c')) / exp f_m(c, c).  Starting from the smallest
length, c grows one step at a time while g_m(c, c_next) >= ``threshold`` (0.01 in the paper); RECL is
the length where it stops.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np


def relative_gain(losses: Mapping[str, Mapping[int, np.ndarray]], model: str, short: int, long: int, r: float):
    """g_m(c, c') of ``model`` for context lengths ``short`` (c) and ``long`` (c')."""
    if not 0.0 < r <= 1.0:
        raise ValueError(f"r must be in (0, 1], got {r}")
    baseline = np.min(np.stack([np.asarray(per_model[short], dtype=np.float64) for per_model in losses.values()]), 0)
    n_top = max(1, int(math.ceil(r * baseline.size)))
    top = np.argsort(-baseline, kind="stable")[:n_top]  # the positions where the short context does worst
    short_loss = np.asarray(losses[model][short], dtype=np.float64)[top]
    long_loss = np.asarray(losses[model][long], dtype=np.float64)[top]
    f_short = np.minimum(baseline[top], short_loss).mean()
    f_long = np.minimum(baseline[top], long_loss).mean()
    return (math.exp(f_short) - math.exp(f_long)) / math.exp(f_short)


def recl(losses: Mapping[str, Mapping[int, np.ndarray]], r: float = 1.0, threshold: float = 0.01) -> dict[str, int]:
    """RECL of every model of the group: ``losses[model][context_length]`` is a per-token loss array, the same
    tokens for every model and length.  The lengths are the evaluated grid; its spacing is the paper's step."""
    if not losses:
        raise ValueError("RECL needs at least one model")
    lengths = sorted(next(iter(losses.values())))
    for name, per_model in losses.items():
        if sorted(per_model) != lengths:
            raise ValueError(f"model {name!r} was evaluated at {sorted(per_model)}, the others at {lengths}")
        sizes = {np.asarray(v).shape for v in per_model.values()}
        if len(sizes) != 1:
            raise ValueError(f"model {name!r}: per-token losses of different lengths {sorted(sizes)}")
    sizes = {np.asarray(v).shape for per_model in losses.values() for v in per_model.values()}
    if len(sizes) != 1:
        raise ValueError(f"every model must be scored on the same tokens, got loss arrays of shapes {sorted(sizes)}")
    result = {}
    for name in losses:
        c = lengths[0]
        for longer in lengths[1:]:
            if relative_gain(losses, name, c, longer, r) < threshold:
                break
            c = longer
        result[name] = c
    return result


def context_read_by(config) -> str:
    """How a model is held to a context length c: ``"memory"``, a Transformer-XL (relative positions) whose every
    layer attends (a fixed hourglass's shortened layers too), read in order with ``mem_len = c``; ``"windows"``,
    a model whose context a memory length cannot bound, read by sliding windows of c tokens: the vanilla Transformer
    (absolute positions), the LSTM, a stack with a recurrent layer (ssm, conv, rnn, the linear family: its state
    carries the whole past, so every ``mem_len`` gave the same losses and RECL the smallest length) and learned or
    entropy chunks (a memory of chunks of any length)."""
    from longseq.model.positions import position_encoding

    bounded = (
        config.arch == "transformer"
        and position_encoding(config.positions.pos).relative
        and all(name == "attention" for name in config.layer_mixers)
        and not config.hourglass.dynamic
    )
    return "memory" if bounded else "windows"


def context_losses(model, run, ids: np.ndarray, context: int, *, max_targets: int = 0, progress: bool = False):
    """Per-token losses of one model at context length ``context``, as :func:`context_read_by` says: in order with
    ``mem_len = context``, or by sliding windows of that length."""
    from longseq.eval.sliding import recurrent_losses, sliding_window_losses

    if context_read_by(model.config) == "windows":
        return sliding_window_losses(model, ids, context=context, max_targets=max_targets, progress=progress)
    return recurrent_losses(model, ids, context=context, tgt_len=run.data.eval_tgt_len, max_targets=max_targets)


def group_losses(models: Mapping, ids: np.ndarray, contexts: list[int], *, max_targets: int = 0, progress=False):
    """``losses[name][c]`` for every model (name -> (model, run)) and context length, over the targets after the
    first max(contexts) tokens, so that every length sees a full context."""
    skip = max(contexts)
    total = max_targets + skip if max_targets else 0
    if len(ids) - 1 <= skip:
        raise ValueError(f"RECL needs more than {skip} tokens (the longest context), the split has {len(ids)}")
    return {
        name: {c: context_losses(model, run, ids, c, max_targets=total, progress=progress)[skip:] for c in contexts}
        for name, (model, run) in models.items()
    }
