"""Fine-tuning an LM checkpoint on a task, on the one :class:`~longseq.train.trainer.Trainer`.

    finetune("runs/lm/best", "runs/cls", task="classify", train="train.jsonl", valid="valid.jsonl", steps=500)

The output directory is a run like any other (``last/`` to resume, ``best/``, ``metrics.jsonl``); its checkpoints
are task checkpoints that :func:`~longseq.train.checkpoint.load_checkpoint` and ``longseq predict`` read.  The
schedule is linear warmup over the first tenth of the steps, then a constant rate (the default) or a linear or
cosine decay to 0 at the last step (``schedule``), gradient clipping at 1.0, layer-wise learning-rate decay (``layer_lr_decay``; none with
``head_only``).  The reported metrics are those of the model in ``best/`` as read back from disk, so they are
exactly what ``longseq predict`` reproduces.
"""

from __future__ import annotations

import os

from longseq.config import ConfigError, DataConfig, RunConfig, TrainConfig
from longseq.config.run import TaskConfig
from longseq.data.sources import file_sha256
from longseq.data.tokenizers import load_tokenizer
from longseq.tasks import task_for
from longseq.train.checkpoint import (
    CheckpointError,
    load_checkpoint,
    load_checkpoint_config,
    resolve_checkpoint,
    weights_sha256,
)
from longseq.train.rundir import has_checkpoint
from longseq.train.trainer import Trainer


def finetune_run(base: RunConfig, base_path: str, task: str, options: dict, *, steps: int = 200,
                 batch_size: int = 8, lr: float = 1e-3, layer_lr_decay: float = 0.8, seed: int = 0,
                 device: str = "auto", eval_interval: int = 0, save_interval: int = 0,
                 schedule: str = "constant") -> RunConfig:  # fmt: skip
    """The run config of a fine-tuning run from an LM checkpoint's run config ``base``; ``schedule`` (constant,
    linear or cosine) is what follows the warmup, linear and cosine decaying to 0 at the last step."""
    options = {**options, "base": os.path.abspath(base_path)}
    for key in MOVABLE:
        if options.get(key):
            options[key] = os.path.abspath(os.path.expanduser(options[key]))
    options["sha256"] = fingerprints(options)
    head_only = bool(options.get("head_only"))
    segment_len = options.get("segment_len") or base.data.tgt_len
    data = DataConfig(tokenizer=base.data.tokenizer, lowercase=base.data.lowercase, tgt_len=segment_len,
                      eval_tgt_len=segment_len, batch_size=batch_size, eval_batch_size=batch_size)  # fmt: skip
    train = TrainConfig(
        max_steps=steps, lr=lr, min_lr=0.0, warmup_steps=max(1, steps // 10), schedule=schedule, clip=1.0,
        layer_lr_decay=1.0 if head_only else layer_lr_decay, seed=seed, device=device,
        eval_interval=eval_interval or steps, log_interval=max(1, steps // 10), save_interval=save_interval,
    )  # fmt: skip
    return RunConfig(base.model, data, train, TaskConfig(task, options))


def finetune(base_checkpoint: str | None, out_dir: str, task: str | None = "classify", *, resume: bool = False,
             overwrite: bool = False, progress: bool = False, log=None, **settings) -> dict:  # fmt: skip
    """Fine-tune ``base_checkpoint`` on ``task`` into ``out_dir`` (``resume``: continue ``out_dir/last``; no base
    needed).  ``settings``: ``steps``, ``batch_size``, ``lr``, ``layer_lr_decay``, ``seed``, ``device``,
    ``eval_interval``, ``save_interval``, ``schedule``, and the task's options (``train``, ``valid``, ``segment_len``,
    ``head_only``, ``group_by_length``, ``pooling``, ``lm_weight``, ``max_answer_len``, ``mask_rate``,
    ``mask_token``)."""
    log = log or (lambda message: None)
    if resume and not has_checkpoint(out_dir):
        if task is None or base_checkpoint is None or settings.get("train") is None:
            raise CheckpointError(
                f"--resume: {out_dir} holds no checkpoint to continue (the run stopped before its first save, or "
                "never ran); start it with --task, --data and --checkpoint (without --resume)"
            )
        resume = False  # the Trainer says it starts afresh
    if resume:
        last = os.path.join(out_dir, "last")
        run, (tokenizer, base) = (
            resumed_run(last, base_checkpoint, task, settings),
            (load_tokenizer(os.path.join(last, "tokenizer.json")), None),
        )
        stretched = load_checkpoint_config(last).train
        if run.train.schedule != "constant" and run.train.max_steps != stretched.max_steps:
            log(f"note: the {run.train.schedule} decay now ends at step {run.train.max_steps}, not "
                f"{stretched.max_steps}: the learning rate follows the new schedule from here")  # fmt: skip
    else:
        if task is None:
            raise ValueError("a new fine-tuning run needs its task (classify, span or mlm)")
        if base_checkpoint is None:
            raise ValueError("fine-tuning needs --checkpoint: the LM checkpoint to start from")
        path = resolve_checkpoint(base_checkpoint, log)
        base, tokenizer, base_run, _ = load_checkpoint(path)
        if base_run.task is not None:
            raise ValueError(f"{path} is already fine-tuned for {base_run.task.name}; start from a language model")
        run_keys = ("steps", "batch_size", "lr", "layer_lr_decay", "seed", "device", "eval_interval", "save_interval",
                    "schedule")  # fmt: skip
        run = finetune_run(base_run, path, task, {k: v for k, v in settings.items() if k not in run_keys and v is not None},
                           **{k: v for k, v in settings.items() if k in run_keys and v is not None})  # fmt: skip
    recorded, options = run.task.options.get("sha256") or {}, run.task.options
    if not resume and "valid" in recorded and recorded.get("train") == recorded["valid"]:
        log(f"warning: --valid {options['valid']} holds the same bytes as --data {options['train']}: validation will "
            "measure memorisation, and best/ is chosen by it")  # fmt: skip
    job = task_for(run, tokenizer, log, base=base)
    result = Trainer(job, run, out_dir, resume=resume, overwrite=overwrite, progress=progress, log=log).fit()
    best, _, best_run, _ = load_checkpoint(os.path.join(out_dir, "best"))
    report = task_for(_reading_files_of(best_run, run), tokenizer)  # what it says was said at the start
    report.prepare()  # the examples, encoded with the run's label set
    last = result.losses[-10:]
    summary = {"steps": result.step, "train_loss": sum(last) / len(last) if last else float("nan")}
    return {**summary, **report.report(best), "checkpoint": os.path.join(os.path.abspath(out_dir), "best")}


RESUMABLE = {"steps": "max_steps", "lr": "lr", "eval_interval": "eval_interval", "save_interval": "save_interval",
             "device": "device"}  # fmt: skip
MOVABLE = ("train", "valid")  # the files a run reads, which a resume may find at another path
FLAGS = {"train": "--data", "valid": "--valid", "base": "--checkpoint"}


def fingerprints(options: dict) -> dict:
    """The sha256 of a fine-tuning run's training and validation files and of its base checkpoint's weights
    (those that exist), by which a resume recognises them at another path."""
    out = {key: file_sha256(options[key]) for key in MOVABLE if options.get(key) and os.path.isfile(options[key])}
    weights = weights_sha256(options["base"]) if options.get("base") else None
    return {**out, "base": weights} if weights else out


def _same_file(recorded: dict, key: str, path: str) -> bool:
    """Whether ``path`` holds the very file the run recorded as ``key`` (by its sha256), wherever it lies."""
    return key in recorded and os.path.isfile(path) and file_sha256(path) == recorded[key]


def _moved_base(options: dict, given: str) -> str | None:
    """The base checkpoint directory at ``given`` (or the run's own leaf, best or last, under it) when it holds
    the weights the run started from; else None."""
    base, recorded = options.get("base") or "", options.get("sha256") or {}
    for candidate in (given, os.path.join(given, os.path.basename(base))):
        if "base" in recorded and weights_sha256(candidate) == recorded["base"]:
            return candidate
    return None


def _resume_changes(options: dict, saved: dict, given: dict, base_checkpoint: str | None) -> tuple[list, dict]:
    """What a resume was asked to change (``--flag old -> new``, refused) and the files it found at a new path
    (``{option: path}``, accepted: same sha256)."""
    changed, moved, recorded = [], {}, options.get("sha256") or {}
    for key, value in given.items():
        if value is None or saved.get(key) == value:
            continue
        if key in MOVABLE and _same_file(recorded, key, value):
            moved[key] = value
            continue
        other = key in MOVABLE and key in recorded and os.path.isfile(value)
        why = " (not the run's file: its sha256 differs)" if other else ""
        changed.append(f"{FLAGS.get(key, '--' + key.replace('_', '-'))} {saved.get(key)!r} -> {value!r}{why}")
    base = options.get("base")
    if base_checkpoint is not None and os.path.abspath(base_checkpoint) not in (base, os.path.dirname(base or "")):
        found = _moved_base(options, os.path.abspath(base_checkpoint))
        if found is None:
            why = " (not the weights the run started from)" if "base" in recorded else ""
            changed.append(f"--checkpoint {base!r} -> {os.path.abspath(base_checkpoint)!r}{why}")
        else:
            moved["base"] = found
    for key in MOVABLE:
        path = options.get(key)
        if not path or key in moved or given.get(key) not in (None, path):  # a new path: judged above
            continue
        if not os.path.isfile(path):
            hint = (f"give its new place with {FLAGS[key]}; the same bytes are recognised by their sha256"
                    if key in recorded else "the run records no sha256 of its files, so it resumes from that path only")  # fmt: skip
            changed.append(f"{FLAGS[key]}: the run's file {path} is gone ({hint})")
        elif key in recorded and file_sha256(path) != recorded[key]:
            changed.append(f"{FLAGS[key]}: {path} is not the file the run started with (its sha256 differs)")
    return changed, moved


def resumed_run(last: str, base_checkpoint: str | None, task: str | None, settings: dict) -> RunConfig:
    """The run config that continues ``last``: its own, with the steps (extend the run), learning rate, cadence and
    device given in ``settings``.  The training and validation files and the base checkpoint may be given at a new
    path when they hold the same bytes (a moved or re-cloned project).  Any other setting given (not None) must
    equal the run's, else one :class:`ConfigError` names every one that differs: a resume never ignores what it was
    asked in silence."""
    run = load_checkpoint_config(last)
    if run.task is None:
        raise ValueError(f"{last} is a language-model run; continue it with longseq train --resume")
    options = run.task.options
    saved = {"task": run.task.name, "batch_size": run.data.batch_size, "seed": run.train.seed,
             "layer_lr_decay": run.train.layer_lr_decay, "schedule": run.train.schedule,
             "segment_len": options.get("segment_len") or run.data.tgt_len,
             **{k: v for k, v in options.items() if k != "segment_len"}}  # fmt: skip
    given = {"task": task, **{k: v for k, v in settings.items() if k not in RESUMABLE}}
    for key in MOVABLE:
        if given.get(key) is not None:
            given[key] = os.path.abspath(os.path.expanduser(given[key]))
    changed, moved = _resume_changes(options, saved, given, base_checkpoint)
    if changed:
        raise ConfigError(
            f"cannot resume {last}: {'; '.join(changed)}. A resume continues the run's own task, data and model; it "
            "may change --steps, --lr, --eval-interval, --save-interval and --device, and find the run's own files "
            "at a new path by their sha256. Drop the others, or start a new run with --overwrite or another --out"
        )
    changes = {RESUMABLE[k]: v for k, v in settings.items() if k in RESUMABLE and v is not None}
    task_config = TaskConfig(run.task.name, {**options, **moved})
    return RunConfig(run.model, run.data, run.train.replace(**changes) if changes else run.train, task_config)


def _reading_files_of(saved: RunConfig, run: RunConfig) -> RunConfig:
    """``saved`` (the run ``best/`` records) reading its files where this session's ``run`` found them: a moved
    run's ``best/`` may predate the resume and name the old paths."""
    files = {key: run.task.options[key] for key in (*MOVABLE, "base") if run.task.options.get(key)}
    return RunConfig(saved.model, saved.data, saved.train, TaskConfig(saved.task.name, {**saved.task.options, **files}))
