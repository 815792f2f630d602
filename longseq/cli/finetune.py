"""``longseq finetune``: fine-tune an LM checkpoint on a task (classify, span, mlm), with checkpoints and
``--resume``; ``longseq predict`` reads the result."""

from __future__ import annotations

import argparse

from longseq.cli.common import common_flags, say


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("finetune", help="fine-tune an LM checkpoint on a task (classify, span, mlm)")
    from longseq.tasks import TASKS

    tasks = sorted(name for name in TASKS if name != "lm")
    p.add_argument("--task", choices=tasks, help="the task (not needed with --resume)")
    p.add_argument("--data", help="training JSONL")
    p.add_argument("--valid", help="validation JSONL")
    p.add_argument("--checkpoint", help="the LM checkpoint (or run directory) to start from")
    p.add_argument("--out", required=True, help="run directory: last/ (resumable), best/, metrics.jsonl")
    p.add_argument("--resume", action="store_true", help="continue exactly from OUT/last")
    p.add_argument("--overwrite", action="store_true", help="start over an existing run in OUT")
    p.add_argument("--steps", type=int, help="optimizer steps (default 200; with --resume: extend the run to N)")
    p.add_argument("--batch-size", type=int, help="default 8")
    p.add_argument("--segment-len", type=int, help="segment length (default: the checkpoint's tgt_len)")
    p.add_argument("--lr", type=float, help="default 1e-3")
    p.add_argument("--layer-lr-decay", type=float, help="default 0.8")
    p.add_argument("--schedule", choices=["constant", "linear", "cosine"],
                   help="after the warmup (a tenth of the steps): constant (the default), or a decay to 0")  # fmt: skip
    p.add_argument("--eval-interval", type=int, help="validate every N steps (default: at the end)")
    p.add_argument("--save-interval", type=int, help="also save last/ every N steps (default 0: off)")
    p.add_argument("--head-only", action="store_true", help="train the task head only")
    p.add_argument("--group-by-length", action="store_true",
                   help="batches of documents of similar length (fewer filler segments per batch)")  # fmt: skip
    p.add_argument(
        "--pooling",
        choices=["last", "mean", "document"],
        help="classify: mean of the whole document (default: every segment trains), last position, or mean of the "
        "final segment (with a stop-gradient memory, last and mean train only the final segment)",
    )
    p.add_argument("--lm-weight", type=float, help="classify: lambda of the joint LM loss (default 0)")
    p.add_argument("--max-answer-len", type=int, help="span: longest answer in tokens (default 64)")
    p.add_argument("--mask-rate", type=float, help="mlm: fraction of tokens chosen for masking (default 0.15)")
    p.add_argument("--mask-token", help="mlm: the token standing for [MASK] (default: <unk>, or byte 0)")
    p.add_argument("--seed", type=int, help="default 0")
    p.add_argument("--device", help="auto (CUDA when available, the default), cpu or cuda[:N]")
    return common_flags(p)


TASK_OPTIONS = {
    "classify": ("pooling", "lm_weight"),
    "span": ("max_answer_len",),
    "mlm": ("mask_rate", "mask_token"),
}


def run(args: argparse.Namespace) -> dict:
    from longseq.train.finetune import finetune

    if not args.resume and (args.task is None or args.data is None):
        raise ValueError("a new fine-tuning run needs --task, --data and --checkpoint (or --resume to continue one)")
    settings = dict(steps=args.steps, batch_size=args.batch_size, lr=args.lr, layer_lr_decay=args.layer_lr_decay,
                    seed=args.seed, device=args.device, eval_interval=args.eval_interval, save_interval=args.save_interval, train=args.data,
                    valid=args.valid, segment_len=args.segment_len, head_only=args.head_only or None,
                    schedule=args.schedule, group_by_length=args.group_by_length or None)  # fmt: skip
    for task, names in TASK_OPTIONS.items():
        for name in (n for n in names if getattr(args, n) is not None):
            if args.task is not None and args.task != task:
                raise ValueError(f"--{name.replace('_', '-')} is an option of the {task} task, not of {args.task}")
            settings[name] = getattr(args, name)
    return finetune(args.checkpoint, args.out, args.task, resume=args.resume, overwrite=args.overwrite,
                    progress=not args.quiet, log=say, **settings)  # fmt: skip
