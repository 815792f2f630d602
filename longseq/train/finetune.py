"""The run config of fine-tuning an LM checkpoint on a task, new or resumed; :func:`longseq.api.finetune` trains it
on the one :class:`~longseq.train.trainer.Trainer`:

    finetune("runs/lm/best", "runs/cls", task="classify", train="train.jsonl", valid="valid.jsonl", max_steps=500)

The settings are the run config's keys, as ``--set`` takes them (a field's path or a unique tail of it:
``pooling``, ``lr``, ``batch_size``, ``task.segment_len``; ``steps`` is ``train.max_steps``), laid over
fine-tuning's defaults, the one file ``longseq/config/presets/finetune.toml`` (the steps, the batch, the learning
rate and its schedule, clipping, layer-wise learning-rate decay, the seed), and over the rules that follow what is
given: the learning rate warms up over the first tenth of the steps, validation runs at the end and the loss is
logged every tenth of them, the segment is the checkpoint's ``tgt_len``, and ``head_only`` trains the head with no
layer-wise decay.

The output directory is a run like any other (``last/`` to resume, ``best/``, ``metrics.jsonl``); its checkpoints
are task checkpoints that :func:`~longseq.train.checkpoint.load_checkpoint` and ``longseq predict`` read.  A resume
continues the run's own settings; it may change what a language model's resume may (the steps, the learning rate,
the cadence, the device: :mod:`longseq.train.config_check`) and find the run's files at a new path by their
sha256.  The reported metrics are those of the model in ``best/`` as read back from disk, so they are exactly
what ``longseq predict`` reproduces.
"""

from __future__ import annotations

import os
from typing import Any

from longseq.config import ConfigError, DataConfig, ModelConfig, RunConfig, TrainConfig
from longseq.config.base import apply_values, leaf_paths, resolve_key
from longseq.config.files import finetune_defaults
from longseq.config.task import FinetuneOptions, TaskConfig
from longseq.data.sources import file_sha256
from longseq.train.checkpoint import (
    load_checkpoint,
    load_checkpoint_config,
    resolve_checkpoint,
    weights_sha256,
)

ALIASES = {"steps": "train.max_steps"}
MOVABLE = ("task.train", "task.valid")  # the files a run reads, which a resume may find at another path
FLAGS = {"task.train": "--data", "task.valid": "--valid", "task.base": "--checkpoint"}  # named in messages
SECTIONS = {"model": ModelConfig, "data": DataConfig, "train": TrainConfig, "task": TaskConfig}


def resolved(settings: dict[str, Any]) -> dict[str, Any]:
    """``settings`` by their full path in a fine-tuning run's config (``pooling`` -> ``task.pooling``), None values
    left out; the files' paths made absolute."""
    paths = [f"{name}.{p}" for name, cls in SECTIONS.items() for p in leaf_paths(cls)]
    out = {}
    for key, value in settings.items():
        if value is not None:
            out[ALIASES.get(key) or resolve_key(key, paths)] = value
    for key in MOVABLE:
        if out.get(key):
            out[key] = os.path.abspath(os.path.expanduser(out[key]))
    return out


def finetune_run(base: RunConfig, base_path: str, task: str, settings: dict[str, Any]) -> RunConfig:
    """The run config of a new fine-tuning run from an LM checkpoint's run config ``base``: ``settings`` (as
    :func:`resolved` gives them) over fine-tuning's defaults (:func:`~longseq.config.files.finetune_defaults`), and
    the rules that follow the steps, the batch and the segment given (see the module docstring)."""
    defaults = finetune_defaults()
    steps = int(settings.get("train.max_steps", defaults.train.max_steps))
    segment = int(settings.get("task.segment_len") or base.data.tgt_len)
    batch = int(settings.get("data.batch_size", defaults.data.batch_size))
    data = defaults.data.replace(
        tokenizer=base.data.tokenizer,
        lowercase=base.data.lowercase,
        tgt_len=segment,
        eval_tgt_len=segment,
        batch_size=batch,
        eval_batch_size=batch,
    )
    head_only = {"layer_lr_decay": 1.0} if settings.get("task.head_only") else {}  # the head alone: no decay
    train = defaults.train.replace(
        max_steps=steps,
        warmup_steps=max(1, steps // 10),
        eval_interval=steps,
        log_interval=max(1, steps // 10),
        **head_only,
    )
    if "task.train" not in settings:
        raise ConfigError("a new fine-tuning run needs its training file (--data FILE.jsonl)")
    task_config = TaskConfig(name=task, train=settings["task.train"], base=os.path.abspath(base_path))
    sections = {"model": base.model, "data": data, "train": train, "task": task_config}
    run = RunConfig(**apply_values(sections, list(settings.items())))
    return RunConfig(run.model, run.data, run.train, run.task.replace(sha256=fingerprints(run.task)))


def new_run(base_checkpoint: str | None, task: str | None, given: dict, log):
    """The base model, its tokenizer and the run config of a new fine-tuning run."""
    if task is None:
        raise ValueError("a new fine-tuning run needs its task (classify, span or mlm)")
    if base_checkpoint is None:
        raise ValueError("fine-tuning needs --checkpoint: the LM checkpoint to start from")
    path = resolve_checkpoint(base_checkpoint, log)
    base, tokenizer, base_run, _ = load_checkpoint(path)
    if base_run.task is not None:
        raise ValueError(f"{path} is already fine-tuned for {base_run.task.name}; start from a language model")
    if base_run.model.arch != "transformer":
        raise ConfigError(
            f"{path} is an arch={base_run.model.arch} baseline: the task heads read a transformer stack's hidden "
            "states (any mixer, pattern or memory), which it has none of; fine-tune a transformer checkpoint"
        )
    run = finetune_run(base_run, path, task, given)
    recorded = run.task.sha256
    if "valid" in recorded and recorded.get("train") == recorded["valid"]:
        log(
            f"warning: --valid {run.task.valid} holds the same bytes as --data {run.task.train}: validation will "
            "measure memorisation, and best/ is chosen by it"
        )
    return base, tokenizer, run


def note_stretched_decay(run: RunConfig, saved: RunConfig, log) -> None:
    if run.train.optim.schedule != "constant" and run.train.max_steps != saved.train.max_steps:
        log(
            f"note: the {run.train.optim.schedule} decay now ends at step {run.train.max_steps}, not "
            f"{saved.train.max_steps}: the learning rate follows the new schedule from here"
        )


def fingerprints(task: FinetuneOptions) -> dict:
    """The sha256 of a fine-tuning run's training and validation files and of its base checkpoint's weights
    (those that exist), by which a resume recognises them at another path."""
    out = {
        key: file_sha256(path)
        for key, path in (("train", task.train), ("valid", task.valid))
        if path and os.path.isfile(path)
    }
    weights = weights_sha256(task.base) if task.base else None
    return {**out, "base": weights} if weights else out


def _same_file(recorded: dict, key: str, path: str) -> bool:
    """Whether ``path`` holds the very file the run recorded as ``key`` (by its sha256), wherever it lies."""
    return key in recorded and os.path.isfile(path) and file_sha256(path) == recorded[key]


def _moved_base(task: FinetuneOptions, given: str) -> str | None:
    """The base checkpoint directory at ``given`` (or the run's own leaf, best or last, under it) when it holds
    the weights the run started from; else None."""
    base, recorded = task.base or "", task.sha256
    for candidate in (given, os.path.join(given, os.path.basename(base))):
        if "base" in recorded and weights_sha256(candidate) == recorded["base"]:
            return candidate
    return None


def _files_found(task: FinetuneOptions, given: dict, base_checkpoint: str | None) -> tuple[list, dict]:
    """The run's files given at a new path: those that hold the recorded bytes (``{path: new}``, accepted) and what
    a resume cannot take (a file with other bytes, a gone file, other base weights), named by flag."""
    changed, moved, recorded = [], {}, task.sha256
    for key in MOVABLE:
        name, saved = key.split(".")[1], getattr(task, key.split(".")[1])
        new = given.get(key)
        if new is not None and new != saved:
            if _same_file(recorded, name, new):
                moved[key] = new
            else:
                other = " (not the run's file: its sha256 differs)" if name in recorded and os.path.isfile(new) else ""
                changed.append(f"{FLAGS[key]} {saved!r} -> {new!r}{other}")
        elif saved and not os.path.isfile(saved):
            hint = (
                f"give its new place with {FLAGS[key]}; the same bytes are recognised by their sha256"
                if name in recorded
                else "the run records no sha256 of its files, so it resumes from that path only"
            )
            changed.append(f"{FLAGS[key]}: the run's file {saved} is gone ({hint})")
        elif saved and name in recorded and file_sha256(saved) != recorded[name]:
            changed.append(f"{FLAGS[key]}: {saved} is not the file the run started with (its sha256 differs)")
    base = task.base
    if base_checkpoint is not None and os.path.abspath(base_checkpoint) not in (base, os.path.dirname(base or "")):
        found = _moved_base(task, os.path.abspath(base_checkpoint))
        if found is None:
            why = " (not the weights the run started from)" if "base" in recorded else ""
            changed.append(f"--checkpoint {base!r} -> {os.path.abspath(base_checkpoint)!r}{why}")
        else:
            moved["task.base"] = found
    return changed, moved


def resumed_run(last: str, base_checkpoint: str | None, task: str | None, given: dict) -> RunConfig:
    """The run config that continues ``last``: its own, with the settings ``given`` (as :func:`resolved` gives
    them) laid over it; the Trainer then refuses, naming them, the changes a resume cannot take (the model, the
    task's options, the data layout: :func:`~longseq.train.config_check.check_resumable`).  The training and
    validation files and the base checkpoint may be given at a new path when they hold the same bytes (a moved or
    re-cloned project)."""
    run = load_checkpoint_config(last)
    if run.task is None:
        raise ValueError(f"{last} is a language-model run; continue it with longseq train --resume")
    changed, moved = _files_found(run.task, given, base_checkpoint)
    if task is not None and task != run.task.name:
        changed.insert(0, f"--task {run.task.name!r} -> {task!r}")
    if changed:
        raise ConfigError(
            f"cannot resume {last}: {'; '.join(changed)}. A resume continues the run's own task, data and model, and "
            "finds the run's own files at a new path by their sha256; start a new run with --overwrite or another "
            "--out to change them"
        )
    settings = {k: v for k, v in given.items() if k not in MOVABLE} | moved
    return RunConfig(**apply_values(run.sections(), list(settings.items())))


def reading_files_of(saved: RunConfig, run: RunConfig) -> RunConfig:
    """``saved`` (the run ``best/`` records) reading its files where this session's ``run`` found them: a moved
    run's ``best/`` may predate the resume and name the old paths."""
    files = {key: getattr(run.task, key) for key in ("train", "valid", "base") if getattr(run.task, key)}
    return RunConfig(saved.model, saved.data, saved.train, saved.task.replace(**files))
