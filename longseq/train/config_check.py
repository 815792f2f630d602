"""What may change when a run is resumed: the schedule and cadence may, the model, the tokenizer and the data
layout may not (the weights, the optimizer moments and the data position would no longer fit them)."""

from __future__ import annotations

import json
import os

from longseq.config import ConfigError, DataConfig, ModelConfig, RunConfig
from longseq.config.base import leaves
from longseq.model.registry import ignored_options
from longseq.train.checkpoint import load_checkpoint_config

FIXED_DATA = (
    "tokenizer",
    "lowercase",
    "batch_size",
    "tgt_len",
    "varlen",
    "doc_reset",
    "vocab_size",
    "text_column",
    "rc_prob",
    "clip_seconds",
)
FIXED_TRAIN = ("seed", "grad_accum", "runtime.parallel")


# a fine-tuning run's files may lie at a new path; finetune.resumed_run checks their bytes against task.sha256
MOVED_FILES = ("task.train", "task.valid", "task.base")


def changed_fields(old: RunConfig, new: RunConfig) -> list[str]:
    """``section.field: old -> new`` for every field a resume cannot change.  A fine-tuning run's files may lie at
    a new path: their fingerprints (``task.sha256``) may not change."""
    before, after = (leaves(r.to_dict(), keep=("sha256",)) for r in (old, new))
    fixed = [k for k in {**before, **after} if k.startswith(("model.", "task.")) and k not in MOVED_FILES]
    fixed += [f"data.{k}" for k in FIXED_DATA] + [f"train.{k}" for k in FIXED_TRAIN]
    return [f"{k}: {before.get(k)!r} -> {after.get(k)!r}" for k in fixed if before.get(k) != after.get(k)]


def check_resumable(last_dir: str, run: RunConfig, tokenizer) -> RunConfig:
    """Raise one :class:`ConfigError` naming every changed field when ``run`` cannot continue ``last_dir``; returns
    the run config ``last_dir`` holds."""
    saved = load_checkpoint_config(last_dir)
    changes = changed_fields(saved, run)
    with open(os.path.join(last_dir, "tokenizer.json"), encoding="utf-8") as f:
        saved_tokenizer = json.load(f)
    if tokenizer is not None and saved_tokenizer != tokenizer.to_dict():
        changes.append("the tokenizer (its vocabulary differs from the one the checkpoint was trained with)")
    if changes:
        raise ConfigError(
            f"cannot resume {last_dir}: the run's settings changed in {'; '.join(changes)}. Resume with the run's own "
            "settings (drop those --set), or start a new run with --overwrite or another --out"
        )
    return saved


def check_same_data(
    saved: dict | None, current: dict | None, last_dir: str, run: RunConfig, log, saved_path: str | None = None
) -> None:
    """A resume reads the data the run was trained on: the same token ids (``saved``, recorded in ``last_dir``),
    at any path.  Other data is refused, naming the parts that differ; a run that recorded no fingerprint (made
    before they were recorded) continues with a warning, unverified."""
    if current is None:
        return
    where = run.data.path or "the bundled corpus"
    if saved is None:
        log(
            f"warning: {last_dir} records no fingerprint of its data, so a resume cannot tell whether {where} is the "
            "corpus it was trained on"
        )
        return
    differ = [part for part in ("train", "valid") if part in saved and saved[part] != current.get(part)]
    if differ:
        raise ConfigError(
            f"cannot resume {last_dir}: the data at {where} is not the data the run was trained on (the token ids "
            f"of its {' and '.join(differ)} split{'s' if len(differ) > 1 else ''} differ: sha256 recorded at the "
            "start of the run). Resume with the run's own corpus (--data PATH, at its new place if it moved), or "
            "start a new run with --overwrite or another --out"
        )
    if saved_path is not None and run.data.path is not None and os.path.abspath(saved_path) != run.data.path:
        log(f"resuming on {run.data.path}: the same token ids as {saved_path}, where the run started")


def full_in_effect(run: RunConfig) -> list[str]:
    """The sparse patterns of ``run``'s attention layers that allow every pair at the run's lengths (segments of
    ``tgt_len``, up to 15 more with ``varlen``, after the memory, the compressed memory and memory tokens): each
    trains exactly full attention, whatever it is called."""
    from longseq.model.attention.patterns import layer_patterns

    m, d = run.model, run.data
    if m.arch == "lstm" or (run.task is not None and run.task.name != "lm"):
        return []
    qlen = d.tgt_len + (15 if d.varlen else 0)
    klen = m.memory.mem_len + m.memory.cmem_len + m.memory.mem_tokens + qlen
    full = {
        pattern.name
        for pattern, mixer in zip(layer_patterns(m), m.layer_mixers)
        if mixer == "attention" and not pattern.is_full and pattern.allows_every_pair(qlen, klen)
    }
    return sorted(full)


def follow_changes(run: RunConfig, base: RunConfig | None) -> tuple[RunConfig, list[str]]:
    """A new run's settings that follow the ones the user changed from the preset ``base``: ``(run, what to say)``.

    * Setting ``max_steps`` below the preset's and leaving ``warmup_steps`` made a smoke run (100 steps of the
      default preset's 1,200, warm-up 100) warm up from start to end and never decay: the warm-up keeps its share
      of the run (``warmup_steps * max_steps / base.max_steps``, at least 1).
    * Setting ``tgt_len`` and leaving ``eval_tgt_len`` validated on the preset's segments (64 for training segments
      of 32): the evaluation segment follows ``tgt_len``.

    Each change is said.  Without a preset (the Python API, a config file over the configs' defaults) nothing is
    changed, but a warm-up over the whole run and an evaluation segment other than a changed training one are
    said."""
    t, o, d, said = run.train, run.train.optim, run.data, []
    train, data = {}, {}
    if base is not None and t.max_steps < base.train.max_steps and o.warmup_steps == base.train.optim.warmup_steps > 0:
        train["warmup_steps"] = max(1, round(o.warmup_steps * t.max_steps / base.train.max_steps))
        said.append(
            f"max_steps={t.max_steps} is shorter than the preset's {base.train.max_steps}: warmup_steps scaled from "
            f"{o.warmup_steps} to {train['warmup_steps']}, the same share of the run (set warmup_steps to choose)"
        )
    elif o.warmup_steps >= t.max_steps and o.schedule != "constant":
        said.append(
            f"warmup_steps={o.warmup_steps} >= max_steps={t.max_steps}: the learning rate rises for the whole run "
            f"and never reaches its {o.schedule} decay (lower warmup_steps to have one)"
        )
    reference = base.data if base is not None else DataConfig()
    if d.tgt_len != reference.tgt_len and d.eval_tgt_len == reference.eval_tgt_len != d.tgt_len:
        if base is not None:
            data["eval_tgt_len"] = d.tgt_len
            said.append(f"tgt_len={d.tgt_len}: eval_tgt_len follows it (was {d.eval_tgt_len}; set it to choose)")
        else:
            said.append(f"tgt_len={d.tgt_len} but eval_tgt_len={d.eval_tgt_len}: validation reads other segments")
    said += [note] if (note := gated_feed_forward_growth(run, base)) else []
    if train or data:
        run = RunConfig(run.model, run.data.replace(**data), run.train.replace(**train), run.task)
    return run, said


def parameter_count(model: ModelConfig) -> int:
    """The parameters of a model of ``model`` (built on the meta device: no memory, no time; a vocabulary of 0,
    the tokenizer's to come, counted as 1)."""
    import torch

    from longseq.model.registry import build_model

    with torch.device("meta"):
        net = build_model(model.replace(vocab_size=max(model.vocab_size, 1)))
    return sum(p.numel() for p in net.parameters())


def gated_feed_forward_growth(run: RunConfig, base: RunConfig | None) -> str | None:
    """What to say when a new run makes the feed-forward gated (``ff=swiglu`` or ``geglu``) and keeps the hidden width
    ``d_inner`` of ``base`` (the preset; default: the configs' defaults): the first projection is twice as wide, so
    the model grows (865,217 -> 1,129,409 parameters for the default preset); the ``d_inner`` that keeps its size
    is named, as the llama-xl preset sets its own.  None otherwise."""
    from longseq.model.block import feed_forward_kind

    m, reference = run.model, base.model if base is not None else ModelConfig()
    if m.arch != "transformer" or not feed_forward_kind(m.ff).gated or feed_forward_kind(reference.ff).gated:
        return None
    if m.d_inner != reference.d_inner:
        return None  # the width was chosen with the gate
    try:
        plain, gated = parameter_count(m.replace(ff=reference.ff)), parameter_count(m)
        per_unit = parameter_count(m.replace(d_inner=m.d_inner + 1)) - gated
    except (ConfigError, ValueError):
        return None  # the run's own checks say what does not fit
    keep = max(1, round(m.d_inner - (gated - plain) / per_unit))
    share = f"{100 * (gated - plain) / plain:+.0f}%"
    total = f"{plain:,} -> {gated:,}, {share}" if m.vocab_size else f"{share} without the embedding and softmax"
    return (
        f"ff={m.ff} with d_inner={m.d_inner} ({'the preset' if base is not None else 'the default'}'s width): a gated "
        f"feed-forward's first projection is twice as wide, so the model grows by {gated - plain:,} parameters "
        f"({total}); set d_inner={keep} to keep its size (the llama-xl preset resizes d_inner the same way)"
    )


def check_options_apply(run: RunConfig, base: RunConfig | None = None, file: RunConfig | None = None) -> list[str]:
    """A new run refuses a name no registry has, and model options its architecture does not read
    (:func:`~longseq.model.registry.ignored_options`):
    ``arch=lstm`` with ``cmem_len`` would train a plain LSTM while the run says it has a compressed memory.  Only
    what differs from ``base`` (the preset a command line starts from; default: the configs' defaults) counts: a
    preset's transformer settings are not the user's when the user asks for ``arch=lstm``.  With ``file`` (the run
    as a config file gave it, before ``--set``), only what the command line changed from it is refused; what the
    file set is said and accepted (returned), so that one file serves a sweep over architectures.  The preset's own
    options the architecture does not read (llama-xl's attention options under ``mixer=gla``) are said as dropped."""
    ignored = ignored_options(run.model, None if base is None else base.model)
    refused = ignored if file is None else ignored_options(run.model, file.model)
    m = run.model
    what = "arch=lstm" if m.arch == "lstm" else f"this model (mixer={','.join(m.mixer)}, pos={m.positions.pos})"
    if refused:
        raise ConfigError(
            f"{what} does not read {', '.join(refused)}: each would have no effect. Remove them (or set them back "
            "to their defaults), or choose an architecture that reads them"
        )
    said = [f"{what} does not read {', '.join(ignored)}, set by the config file: ignored"] if ignored else []
    dropped = [] if base is None else [o for o in ignored_options(m) if o not in ignored_options(m, base.model)]
    if dropped:  # the preset's own (llama-xl's n_kv_head, qk_norm, pos=rope under mixer=gla): said, not refused
        said.append(
            f"{what} does not read {', '.join(dropped)}, set by the preset: dropped (each would have no effect; the "
            "run trains without them)"
        )
    full = full_in_effect(run)
    if full:
        from longseq.model.attention.patterns import PATTERNS

        d = run.data
        read = sorted(
            {key for name in full for key in PATTERNS[name].reads if key in ("window", "block_size", "stride")}
        )
        settings = ", ".join(f"{key}={getattr(m.pattern, key)}" for key in read)
        raise ConfigError(
            f"attention={','.join(full)} with {settings} allows every pair for segments of {d.tgt_len} tokens after "
            f"a memory of {m.memory.mem_len}: it would train exactly full attention. Narrow the pattern (a window "
            f"below {d.tgt_len + m.memory.mem_len}), lengthen the segment or the memory, or use attention=full"
        )
    return said
