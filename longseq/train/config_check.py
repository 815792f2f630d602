"""What may change when a run is resumed: the schedule and cadence may, the model, the tokenizer and the data
layout may not (the weights, the optimizer moments and the data position would no longer fit them)."""

from __future__ import annotations

import json
import os

from longseq.config import ConfigError, RunConfig
from longseq.train.checkpoint import load_checkpoint_config

FIXED_DATA = ("tokenizer", "lowercase", "batch_size", "tgt_len", "varlen", "doc_reset", "vocab_size")
FIXED_TRAIN = ("seed", "grad_accum", "parallel")


# a fine-tuning run's files may lie at a new path; finetune.resumed_run checks their bytes against task.options.sha256
MOVED_FILES = ("task.options.train", "task.options.valid", "task.options.base")


def _flat(data: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in data.items():
        if isinstance(value, dict) and key != "sha256":
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def changed_fields(old: RunConfig, new: RunConfig) -> list[str]:
    """``section.field: old -> new`` for every field a resume cannot change.  A fine-tuning run's files may lie at
    a new path: their fingerprints (``task.options.sha256``) may not change."""
    before, after = _flat(old.to_dict()), _flat(new.to_dict())
    fixed = [k for k in {**before, **after} if k.startswith(("model.", "task.")) and k not in MOVED_FILES]
    fixed += [f"data.{k}" for k in FIXED_DATA] + [f"train.{k}" for k in FIXED_TRAIN]
    return [f"{k}: {before.get(k)!r} -> {after.get(k)!r}" for k in fixed if before.get(k) != after.get(k)]


def check_resumable(last_dir: str, run: RunConfig, tokenizer) -> None:
    """Raise one :class:`ConfigError` naming every changed field when ``run`` cannot continue ``last_dir``."""
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
