"""longseq finetune: fine-tune an LM checkpoint on a task (classify, span, mlm), or on a text as a language model
(clm), with checkpoints and --resume; longseq predict reads a task's result, eval and generate a clm's.

Every setting is a key of the run config: --set pooling=mean lr=3e-4, or the [task], [train] and [data] tables
of a TOML or JSON file given with --config FILE. The flags above are the common ones; each sets one key
(--lr sets train.lr, --pooling sets task.pooling, --data sets task.train, --steps sets train.max_steps); the task's
flags are its options (longseq.config.task), one flag each, with their docstrings as help.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing

from longseq.cli.common import common_flags, overrides, say
from longseq.config.base import field_docs, field_types
from longseq.config.files import finetune_defaults
from longseq.config.task import FINETUNE_TASKS, TASK_OPTIONS

TABLES = ("model", "data", "train", "task")  # the tables a --config file may hold

FLAG_KEYS = {  # a flag (its dest) -> the run config key it sets; the tasks' options add theirs (task_flags)
    "data": "task.train",
    "steps": "train.max_steps",
    "batch_size": "data.batch_size",
    "lr": "train.optim.lr",
    "layer_lr_decay": "train.optim.layer_lr_decay",
    "schedule": "train.optim.schedule",
    "eval_interval": "train.eval_interval",
    "save_interval": "train.checkpoint.save_interval",
    "seed": "train.seed",
    "device": "train.runtime.device",
}
NAMED_ELSEWHERE = ("name", "train", "base")  # options with a flag of the command's own: --task, --data, --checkpoint


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "finetune",
        help="fine-tune an LM checkpoint on a task (classify, span, mlm) or on a text (clm)",
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--task", choices=sorted(FINETUNE_TASKS), help="the task (not needed with --resume)")
    p.add_argument(
        "--data", help="training file: JSON lines (or a parquet/arrow table for classify and mlm); clm: a text"
    )
    p.add_argument("--checkpoint", help="the LM checkpoint (or run directory) to start from")
    p.add_argument("--out", required=True, help="run directory: last/ (resumable), best/, metrics.jsonl")
    p.add_argument("--resume", action="store_true", help="continue exactly from OUT/last")
    p.add_argument("--overwrite", action="store_true", help="start over an existing run in OUT")
    p.add_argument("--config", metavar="FILE", help="settings in a TOML or JSON file: [task], [train], [data] tables")
    p.add_argument("--set", nargs="+", action="append", metavar="KEY=VALUE", help="any key of the run config")
    training_flags(p)
    p.add_argument("--save-interval", type=int, help="also save last/ every N steps (default 0: off)")
    task_flags(p)
    p.add_argument("--seed", type=int, help=f"default {finetune_defaults().train.seed}")
    p.add_argument("--device", help="auto (CUDA when available, the default), cpu or cuda[:N]")
    return common_flags(p)


def training_flags(p: argparse.ArgumentParser) -> None:
    """The flags of the steps, the batch and the learning rate, their defaults as fine-tuning's defaults file
    (``longseq/config/presets/finetune.toml``) gives them."""
    d = finetune_defaults()
    schedules = [d.train.optim.schedule, *(s for s in ("constant", "linear", "cosine") if s != d.train.optim.schedule)]
    p.add_argument(
        "--steps", type=int, help=f"optimizer steps (default {d.train.max_steps}; with --resume: extend the run to N)"
    )
    p.add_argument("--batch-size", type=int, help=f"default {d.data.batch_size}")
    p.add_argument("--lr", type=float, help=f"default {d.train.optim.lr:g}")
    p.add_argument("--layer-lr-decay", type=float, help=f"default {d.train.optim.layer_lr_decay:g}")
    p.add_argument(
        "--schedule",
        choices=schedules,
        help=f"after the warmup (a tenth of the steps): {schedules[0]} (the default), or a decay to 0",
    )
    p.add_argument("--eval-interval", type=int, help="validate every N steps (default: at the end)")


def task_options() -> dict[str, tuple[dataclasses.Field, list[str]]]:
    """Every option of the fine-tuning tasks that a person sets (not written by the run, not named by a flag of the
    command's own), with the tasks that have it, in the order the classes declare them."""
    found: dict[str, tuple[dataclasses.Field, list[str]]] = {}
    for task in FINETUNE_TASKS:
        options = TASK_OPTIONS[task]
        for f in dataclasses.fields(options):
            if f.name not in NAMED_ELSEWHERE and f.name not in options.written:
                found.setdefault(f.name, (f, []))[1].append(task)
    return found


def task_flags(p: argparse.ArgumentParser) -> None:
    """One flag per task option (:func:`task_options`), from the options classes: its type, its default and its
    docstring as help, prefixed by the tasks that read it unless every fine-tuning task does."""
    for name, (f, tasks) in task_options().items():
        options = TASK_OPTIONS[tasks[0]]
        kind = _scalar(field_types(options)[name])
        owners = "" if len(tasks) == len(FINETUNE_TASKS) else f"{', '.join(tasks)}: "
        default = (
            ""
            if f.default is None or f.default is False or f.default is dataclasses.MISSING
            else f" (default {f.default})"
        )
        text = f"{owners}{field_docs(options).get(name, name)}{default}"
        flag = f"--{name.replace('_', '-')}"
        if kind is bool:
            p.add_argument(flag, dest=name, action="store_true", default=None, help=text)
        else:
            p.add_argument(flag, dest=name, type=kind, help=text)
        FLAG_KEYS[name] = f"task.{name}"


def _scalar(annotation) -> type:
    """The type a flag parses: ``int`` of ``int``, ``str`` of ``str | None``."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
    return annotation if annotation in (bool, int, float) else str


def settings_of(args: argparse.Namespace) -> dict:
    """Every setting of the command line by its run config key: the config file's, then ``--set``, then the flags."""
    from longseq.config.files import read_config_file

    settings: dict = {}
    if args.config:
        data = read_config_file(args.config)
        from longseq.config.base import leaves

        foreign = sorted(set(data) - set(TABLES))
        if foreign:
            raise ValueError(
                f"{args.config}: unknown table(s) {', '.join(foreign)}; a fine-tuning config has {', '.join(TABLES)}"
            )
        settings.update(leaves(data))
    for item in overrides(args.set):
        if "=" not in item:
            raise ValueError(f"override {item!r} must look like key=value")
        key, value = item.split("=", 1)
        settings[key.strip()] = value
    settings.update({key: getattr(args, flag) for flag, key in FLAG_KEYS.items() if getattr(args, flag) is not None})
    return settings


def run(args: argparse.Namespace) -> dict:
    from longseq.api import finetune

    if not args.resume and (args.task is None or args.data is None):
        raise ValueError("a new fine-tuning run needs --task, --data and --checkpoint (or --resume to continue one)")
    return finetune(
        args.checkpoint,
        args.out,
        args.task,
        resume=args.resume,
        overwrite=args.overwrite,
        progress=not args.quiet,
        log=say,
        **settings_of(args),
    )
