"""The library's entry points: each composes a task with the one Trainer, as the commands do.

    from longseq.api import finetune, linearize, train

    result = train(run, "runs/tiny")                    # a language model (or a recall task) for a RunConfig
    report = finetune("runs/tiny/best", "runs/cls", task="classify", train="train.jsonl", steps=200)
    report = linearize("runs/tiny", "runs/lin", "gla", ratio=0.5)   # attention layers into linear attention

The trainer knows tasks only by their interface (:class:`~longseq.tasks.base.Task`); choosing the task a run
config names, and reading the data it needs, happens here.  ``longseq train`` calls :func:`train` and
``longseq finetune`` calls :func:`finetune`, ``longseq linearize`` :func:`linearize`.
"""

from __future__ import annotations

import json
import os
import warnings

from longseq.config import ConfigError, RunConfig, TaskConfig, apply_overrides
from longseq.config.train import CurriculumConfig
from longseq.data.corpus import load_data
from longseq.data.tokenizers import load_tokenizer
from longseq.tasks import task_for
from longseq.tasks.distill import Teacher
from longseq.tasks.linearize import (
    attention_layers,
    choose_layers,
    layer_count,
    layer_kls,
    layer_prefix,
    linearized_model,
    student_config,
)
from longseq.tasks.lm import LanguageModeling
from longseq.train.checkpoint import (
    CheckpointError,
    load_checkpoint,
    load_checkpoint_config,
    resolve_checkpoint,
    save_checkpoint,
    weights_sha256,
)
from longseq.train.config_check import check_options_apply, follow_changes
from longseq.train.finetune import new_run, note_stretched_decay, reading_files_of, resolved, resumed_run
from longseq.train.rundir import has_checkpoint
from longseq.train.trainer import Trainer, TrainResult

__all__ = ["TrainResult", "finetune", "linearize", "train"]


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
    elif run.task.name in ("distill", "transfer"):  # a student of a teacher (and distill's init), read here
        extra = {"teacher": read_checkpoint(run.task.teacher, log)}
        if run.task.name == "distill" and run.task.init and not (resume and has_checkpoint(out_dir)):
            extra["init"] = read_checkpoint(run.task.init, log)
        task = task_for(run, log=log, corpus=corpus, **extra)
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


def read_checkpoint(path: str, log=None) -> Teacher:
    """A checkpoint (a run directory's best, or a checkpoint directory) as a task reads it: path, model, tokenizer,
    run config."""
    path = resolve_checkpoint(path, log)
    return Teacher(path, *load_checkpoint(path)[:3])


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


def linearize(
    teacher: str,
    out_dir: str,
    mixer: str = "gla",
    *,
    layers: list[int] | None = None,
    count: int | None = None,
    ratio: float | None = None,
    select: str = "kl",
    transfer_steps: int = 200,
    distill_steps: int = 200,
    distill_trains: str = "all",
    settings: list[str] = (),
    transfer_settings: list[str] = (),
    distill_settings: list[str] = (),
    resume: bool = False,
    overwrite: bool = False,
    progress: bool = True,
    log=None,
    corpus=None,
) -> dict:
    """Linearize the checkpoint ``teacher`` into ``out_dir`` (docs/linearization.md): replace ``layers`` of its
    attention layers (or ``count`` of them, or the fraction ``ratio``, chosen by ``select``: ``kl``, the layers whose
    replacement alone costs least KL after every layer's transfer, or ``spread``) by ``mixer``, initialised from the
    attention's weights; train them by attention transfer for ``transfer_steps`` (OUT/transfer), then the whole
    student by distillation for ``distill_steps`` (OUT/distill; ``distill_trains``: ``all`` parameters or the
    replaced ``layers``).  ``settings`` (``key=value``) apply to both runs, ``transfer_settings`` to the first (its
    task's ``step_segments``) and ``distill_settings`` to the second (its task's alpha, temperature, top_k, cache), each
    laid over ``settings``.  ``resume`` continues each stage where it stopped."""
    log = log or (lambda message: None)
    if select not in ("kl", "spread") or distill_trains not in ("all", "layers"):
        raise ConfigError(f"select must be kl or spread (got {select!r}); distill_trains all or layers "
                          f"(got {distill_trains!r})")  # fmt: skip
    t = read_checkpoint(teacher, log)
    candidates = attention_layers(t.run.model)
    if layers is None:
        n = layer_count(len(candidates), count, ratio)
        transferring = candidates if select == "kl" else choose_layers(candidates, n, select)
    else:
        student_config(t.run.model, list(layers), mixer)  # refuses a layer that is not the teacher's attention
        transferring, n = sorted(set(layers)), None
    common = dict(overwrite=overwrite, progress=progress, log=log, corpus=corpus)
    stage_dirs = {name: os.path.join(out_dir, name) for name in ("transfer", "distill")}
    resumes = {name: resume and os.path.exists(path) for name, path in stage_dirs.items()}  # a stage not begun begins
    first = stage_run(t.run, student_config(t.run.model, transferring, mixer),
                      TaskConfig(name="transfer", teacher=t.path), transfer_steps,
                      [*settings, *transfer_settings])  # fmt: skip
    log(f"linearize, stage 1: attention transfer of layers {transferring} into {mixer}")
    transfer = train(first, stage_dirs["transfer"], base=first, resume=resumes["transfer"], **common)
    transferred = read_checkpoint(os.path.join(out_dir, "transfer"), log)
    chosen, kls = transferring, None
    if n is not None and n < len(transferring):
        kls = measured_kls(t, transferred, first, mixer, transferring, out_dir, corpus, overwrite, log)
        chosen = choose_layers(transferring, n, "kl", kls)
    student = linearized_model(t.model.state_dict(), t.run.model, chosen, mixer, transferred.model.state_dict())
    init = os.path.abspath(os.path.join(out_dir, "student"))
    save_checkpoint(init, student, RunConfig(student.config, first.data, first.train), t.tokenizer)
    log(f"linearize: the student ({mixer} at layers {chosen}) is {init}")
    report = {"teacher": t.path, "mixer": mixer, "layers": chosen, "layer_kl": kls, "student": init,
              "transfer": stage_report(transfer, os.path.join(out_dir, "transfer"))}  # fmt: skip
    if distill_steps:  # stage 2; a LoRA stage (another task) would start from OUT/distill's best in the same way
        trains = [] if distill_trains == "all" else [layer_prefix(i) + "*" for i in chosen]
        task = TaskConfig(name="distill", teacher=t.path, init=init, train_only=trains)
        second = stage_run(t.run, student.config, task, distill_steps, [*settings, *distill_settings])
        log(f"linearize, stage 2: distillation of the student, {distill_trains} of its parameters training")
        distilled = train(second, stage_dirs["distill"], base=second, resume=resumes["distill"], **common)
        report["distill"] = stage_report(distilled, os.path.join(out_dir, "distill"))
    report["checkpoint"] = resolve_checkpoint(os.path.join(out_dir, "distill")) if distill_steps else init
    return report


def stage_run(teacher_run: RunConfig, model, task, steps: int, settings) -> RunConfig:
    """A linearization stage's run: the teacher's data and training recipe (without its memory curriculum, its
    samples and its time budget) for ``steps`` steps, the student ``model``, the ``task``; ``settings`` on top."""
    train_config = teacher_run.train.replace(
        max_steps=steps, max_time_s=0, sample_interval=0, curriculum=CurriculumConfig().to_dict()
    )
    base = RunConfig(model, teacher_run.data, train_config, task)
    return RunConfig(**apply_overrides(base.sections(), list(settings)))


def stage_report(result: TrainResult, run_dir: str) -> dict:
    """A stage's steps, last training losses (None: no step in this call, a finished stage resumed) and best
    validation."""
    last = result.losses[-10:]
    return {"steps": result.step, "train_loss": sum(last) / len(last) if last else None,
            "best_valid_loss": result.best_valid_loss, "run": os.path.abspath(run_dir)}  # fmt: skip


def measured_kls(t: Teacher, transferred: Teacher, run: RunConfig, mixer: str, candidates: list[int], out_dir: str,
                 corpus, overwrite: bool, log) -> dict[int, float]:  # fmt: skip
    """KL(teacher || student) on the validation split when each of ``candidates`` alone is replaced (its transferred
    weights), written to OUT/layer-kl.json; read from there when a resumed run measured it."""
    path = os.path.join(out_dir, "layer-kl.json")
    if os.path.isfile(path) and not overwrite:
        with open(path, encoding="utf-8") as f:
            stored = json.load(f)
        if stored.get("transferred_sha256") == weights_sha256(transferred.path):
            return {int(k): v for k, v in stored["kl"].items()}
    ids = (corpus or load_data(run.data.replace(tokenizer=os.path.join(t.path, "tokenizer.json")))).valid
    state, weights = t.model.state_dict(), transferred.model.state_dict()
    students = {i: linearized_model(state, t.run.model, [i], mixer, weights) for i in candidates}
    d = run.data
    reads = f"its first {run.train.eval_max_segments} segments" if run.train.eval_max_segments else "all of it"
    log(f"linearize: the KL of each layer's replacement on the validation split ({len(ids):,} tokens; {reads})")
    kls = layer_kls(t.model, students, ids, d.eval_batch_size, d.eval_tgt_len, run.train.eval_max_segments)
    record = {"teacher": t.path, "mixer": mixer, "kl": {str(i): kl for i, kl in kls.items()}, "unit": "nats/token",
              "transferred": transferred.path, "transferred_sha256": weights_sha256(transferred.path)}  # fmt: skip
    write_json_atomic(path, record)
    return kls


def write_json_atomic(path: str, record: dict) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1)
    os.replace(tmp, path)
