"""``longseq diagnose``: attention maps, entropy, gradient norms and memory statistics of a checkpoint."""

from __future__ import annotations

import argparse

from longseq.cli.common import common_flags, device_flag, load_model, read_corpus, say


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("diagnose", help="attention maps, entropy, gradient norms and memory statistics of a checkpoint")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--data", help="corpus (default: the checkpoint's)")
    p.add_argument("--split", default="valid", choices=["train", "valid", "test"])
    p.add_argument("--tgt-len", type=int, default=0, help="segment length (default: the checkpoint's eval_tgt_len)")
    p.add_argument("--warmup", type=int, default=2, help="segments read first to fill the memory")
    p.add_argument("--out", required=True, help="report directory (PNG plots, report.md, report.json)")
    device_flag(p)
    return common_flags(p)


def run(args: argparse.Namespace) -> dict:
    from longseq.diagnostics import diagnose

    checkpoint, model, tokenizer, run = load_model(args.checkpoint, args.device)
    ids = read_corpus(args.data, run, tokenizer, checkpoint).split(args.split)
    tgt_len = args.tgt_len or run.data.eval_tgt_len
    report = diagnose(model, ids, args.out, tgt_len=tgt_len, warmup=args.warmup)
    for warning in report["warnings"]:
        say(f"warning: {warning}")
    keep = ("layers", "heads", "tgt_len", "mem_len", "loss", "grad_norms", "warnings", "files")
    return {"out": args.out, **{k: report[k] for k in keep}}
