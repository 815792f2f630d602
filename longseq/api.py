"""The library's entry points: each composes a task with the one Trainer, as the commands do.

    from longseq.api import finetune, train

    result = train(run, "runs/tiny")                    # a language model (or a recall task) for a RunConfig
    report = finetune("runs/tiny/best", "runs/cls", task="classify", train="train.jsonl", steps=200)

The trainer knows tasks only by their interface (:class:`~longseq.tasks.base.Task`); choosing the task a run
config names, and reading the data it needs, happens here.  ``longseq train`` calls :func:`train` and
``longseq finetune`` calls :func:`finetune`.
"""

from __future__ import annotations

import os
import warnings

from longseq.config import RunConfig
from longseq.data.tokenizers import load_tokenizer
from longseq.tasks import task_for
from longseq.tasks.distill import Teacher
from longseq.tasks.lm import LanguageModeling
from longseq.train.checkpoint import CheckpointError, load_checkpoint, load_checkpoint_config, resolve_checkpoint
from longseq.train.config_check import check_options_apply, follow_changes
from longseq.train.finetune import new_run, note_stretched_decay, reading_files_of, resolved, resumed_run
from longseq.train.rundir import has_checkpoint
from longseq.train.trainer import Trainer, TrainResult

__all__ = ["TrainResult", "finetune", "train"]


def train(
    run: RunConfig,
    out_dir: str,
    *,
    resume: bool = False,
    overwrite: bool = False,
    corpus=None,
    stop_after: int | None = None,
    progress: bool = True,
    log=None,
    after_backward=None,
    base: RunConfig | None = None,
    file_config: RunConfig | None = None,
) -> TrainResult:
    """Train a language model for ``run`` and write checkpoints and metrics under ``out_dir``.

    ``resume`` continues from ``out_dir/last`` exactly (same batches, dropout masks, memory and optimizer state);
    ``overwrite`` starts an existing run over.  ``corpus`` replaces reading ``run.data`` (tests).  ``stop_after``
    ends the run early after that many optimizer steps (checkpointing first), which is how an interruption is
    simulated in tests.  A new run refuses model options its architecture does not read, counting those that
    differ from ``base`` (the preset the command line started from; default: the configs' defaults; with
    ``file_config``, the run as its config file gave it, only those the command line changed), and some
    settings follow the ones changed from ``base`` (:func:`~longseq.train.config_check.follow_changes`)."""
    if not (resume and has_checkpoint(out_dir)):  # a new run (a resume continues what was accepted then)
        noted = check_options_apply(run, base, file_config)
        run, said = follow_changes(run, base)
        for message in noted + said:
            log(message) if log is not None else warnings.warn(message, stacklevel=2)

    if run.task is None or run.task.name == "lm":
        task = LanguageModeling(run, log=log, corpus=corpus)
    elif run.task.name == "distill":  # language modeling with a teacher, read here
        path = resolve_checkpoint(run.task.teacher, log)
        task = task_for(run, log=log, corpus=corpus, teacher=Teacher(path, *load_checkpoint(path)[:3]))
    else:  # a task that makes its own data (the recall tasks)
        task = task_for(run, log=log)
    trainer = Trainer(
        task,
        run,
        out_dir,
        resume=resume,
        overwrite=overwrite,
        progress=progress,
        log=log,
        after_backward=after_backward,
    )
    return trainer.fit(stop_after=stop_after)


def finetune(
    base_checkpoint: str | None,
    out_dir: str,
    task: str | None = "classify",
    *,
    resume: bool = False,
    overwrite: bool = False,
    progress: bool = False,
    log=None,
    **settings,
) -> dict:
    """Fine-tune ``base_checkpoint`` on ``task`` into ``out_dir`` (``resume``: continue ``out_dir/last``; no base
    needed).  ``settings``: any key of the run config, as ``--set`` takes it, laid over fine-tuning's
    defaults (:mod:`longseq.train.finetune`)."""
    log = log or (lambda message: None)
    given = resolved(settings)
    if resume and not has_checkpoint(out_dir):
        if task is None or base_checkpoint is None or "task.train" not in given:
            raise CheckpointError(
                f"--resume: {out_dir} holds no checkpoint to continue (the run stopped before its first save, or "
                "never ran); start it with --task, --data and --checkpoint (without --resume)"
            )
        resume = False  # the Trainer says it starts afresh
    if resume:
        last = os.path.join(out_dir, "last")
        run, base = resumed_run(last, base_checkpoint, task, given), None
        tokenizer = load_tokenizer(os.path.join(last, "tokenizer.json"))
        note_stretched_decay(run, load_checkpoint_config(last), log)
    else:
        base, tokenizer, run = new_run(base_checkpoint, task, given, log)
    job = task_for(run, tokenizer, log, base=base)
    result = Trainer(job, run, out_dir, resume=resume, overwrite=overwrite, progress=progress, log=log).fit()
    best, _, best_run, _ = load_checkpoint(os.path.join(out_dir, "best"))
    report = task_for(reading_files_of(best_run, run), tokenizer)  # what it says was said at the start
    report.prepare()  # the examples, encoded with the run's label set
    last_losses = result.losses[-10:]
    summary = {"steps": result.step, "train_loss": sum(last_losses) / len(last_losses) if last_losses else float("nan")}
    return {**summary, **report.report(best), "checkpoint": os.path.join(os.path.abspath(out_dir), "best")}
