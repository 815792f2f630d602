"""``longseq finetune``: fine-tune an LM checkpoint on a task (classify, span, mlm)."""

from __future__ import annotations

import argparse

from longseq.cli.common import common_flags, say


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("finetune", help="fine-tune an LM checkpoint on a task (classify, span, mlm)")
    p.add_argument("--task", required=True, choices=["classify", "mlm", "span"])
    p.add_argument("--data", required=True, help="training JSONL")
    p.add_argument("--valid", help="validation JSONL")
    p.add_argument("--checkpoint", required=True, help="LM checkpoint directory")
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--segment-len", type=int, help="segment length (default: the checkpoint's tgt_len)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--layer-lr-decay", type=float, default=0.8)
    p.add_argument("--head-only", action="store_true", help="train the task head only")
    p.add_argument("--pooling", default="last", choices=["last", "mean"])
    p.add_argument("--lm-weight", type=float, default=0.0, help="lambda of the joint LM loss")
    p.add_argument("--max-answer-len", type=int, default=64, help="span: longest answer in tokens")
    p.add_argument("--mask-rate", type=float, default=0.15, help="mlm: fraction of tokens chosen for masking")
    p.add_argument("--mask-token", help="mlm: the token standing for [MASK] (default: <unk>, or byte 0)")
    p.add_argument("--seed", type=int, default=0)
    return common_flags(p)


def run(args: argparse.Namespace) -> dict:
    from longseq.train import finetune

    config = finetune.FinetuneConfig(
        steps=args.steps,
        batch_size=args.batch_size,
        segment_len=args.segment_len or 0,
        lr=args.lr,
        layer_lr_decay=args.layer_lr_decay,
        head_only=args.head_only,
        seed=args.seed,
    )
    where = dict(valid_path=args.valid, log=say)
    if args.task == "classify":
        extra = dict(pooling=args.pooling, lm_weight=args.lm_weight)
        return finetune.finetune_classifier(args.checkpoint, args.data, args.out, config, **where, **extra)
    if args.task == "span":
        extra = dict(max_answer_len=args.max_answer_len)
        return finetune.finetune_span(args.checkpoint, args.data, args.out, config, **where, **extra)
    extra = dict(mask_rate=args.mask_rate, mask_token=args.mask_token)
    return finetune.finetune_mlm(args.checkpoint, args.data, args.out, config, **where, **extra)
