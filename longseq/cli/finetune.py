"""longseq finetune: fine-tune an LM checkpoint on a task (classify, span, mlm), or on a text as a language model
(clm), with checkpoints and --resume; longseq predict reads a task's result, eval and generate a clm's.

Every setting is a key of the run config: --set pooling=mean lr=3e-4, or the [task], [train] and [data] tables
of a TOML or JSON file given with --config FILE. The flags above are the common ones; each sets one key
(--lr sets train.lr, --pooling sets task.pooling, --data sets task.train, --steps sets train.max_steps).
"""

from __future__ import annotations

import argparse

from longseq.cli.common import common_flags, overrides, say
from longseq.config.files import finetune_defaults

TABLES = ("model", "data", "train", "task")  # the tables a --config file may hold

FLAG_KEYS = {  # a flag (its dest) -> the run config key it sets
    "data": "task.train",
    "valid": "task.valid",
    "steps": "train.max_steps",
    "batch_size": "data.batch_size",
    "segment_len": "task.segment_len",
    "lr": "train.optim.lr",
    "layer_lr_decay": "train.optim.layer_lr_decay",
    "schedule": "train.optim.schedule",
    "eval_interval": "train.eval_interval",
    "save_interval": "train.checkpoint.save_interval",
    "head_only": "task.head_only",
    "group_by_length": "task.group_by_length",
    "pooling": "task.pooling",
    "lm_weight": "task.lm_weight",
    "max_answer_len": "task.max_answer_len",
    "mask_rate": "task.mask_rate",
    "mask_token": "task.mask_token",
    "lora_rank": "task.lora_rank",
    "lora_alpha": "task.lora_alpha",
    "seed": "train.seed",
    "device": "train.runtime.device",
}


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "finetune",
        help="fine-tune an LM checkpoint on a task (classify, span, mlm) or on a text (clm)",
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    from longseq.model.heads import POOLING
    from longseq.tasks import FINETUNE_TASKS

    p.add_argument("--task", choices=sorted(FINETUNE_TASKS), help="the task (not needed with --resume)")
    p.add_argument(
        "--data", help="training file: JSON lines (or a parquet/arrow table for classify and mlm); clm: a text"
    )
    p.add_argument("--valid", help="validation file, in the same formats as --data")
    p.add_argument("--checkpoint", help="the LM checkpoint (or run directory) to start from")
    p.add_argument("--out", required=True, help="run directory: last/ (resumable), best/, metrics.jsonl")
    p.add_argument("--resume", action="store_true", help="continue exactly from OUT/last")
    p.add_argument("--overwrite", action="store_true", help="start over an existing run in OUT")
    p.add_argument("--config", metavar="FILE", help="settings in a TOML or JSON file: [task], [train], [data] tables")
    p.add_argument("--set", nargs="+", action="append", metavar="KEY=VALUE", help="any key of the run config")
    training_flags(p)
    p.add_argument("--save-interval", type=int, help="also save last/ every N steps (default 0: off)")
    p.add_argument("--head-only", action="store_true", default=None, help="train the task head only")
    p.add_argument(
        "--group-by-length",
        action="store_true",
        default=None,
        help="batches of documents of similar length (fewer filler segments per batch)",
    )
    p.add_argument(
        "--pooling",
        choices=POOLING,
        help="classify: mean of the whole document (default: every segment trains), last position, or mean "
        "of the final segment (with a stop-gradient memory, last and mean train only the final segment)",
    )
    p.add_argument("--lm-weight", type=float, help="classify: lambda of the joint LM loss (default 0)")
    p.add_argument("--max-answer-len", type=int, help="span: longest answer in tokens (default 64)")
    p.add_argument("--mask-rate", type=float, help="mlm: fraction of tokens chosen for masking (default 0.15)")
    p.add_argument("--mask-token", help="mlm: the token standing for [MASK] (default: <unk>, or byte 0)")
    p.add_argument("--lora-rank", type=int, help="train LoRA adapters of this rank instead of the weights (PEFT)")
    p.add_argument("--lora-alpha", type=float, help="the adapters' scale alpha (default 16: alpha / rank)")
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
    p.add_argument("--segment-len", type=int, help="segment length (default: the checkpoint's tgt_len)")
    p.add_argument("--lr", type=float, help=f"default {d.train.optim.lr:g}")
    p.add_argument("--layer-lr-decay", type=float, help=f"default {d.train.optim.layer_lr_decay:g}")
    p.add_argument(
        "--schedule",
        choices=schedules,
        help=f"after the warmup (a tenth of the steps): {schedules[0]} (the default), or a decay to 0",
    )
    p.add_argument("--eval-interval", type=int, help="validate every N steps (default: at the end)")


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
