"""``longseq diagnose``: attention maps, entropy, memory share, gradient norms, memory statistics, loss by position
and the context curve of a checkpoint."""

from __future__ import annotations

import argparse

from longseq.cli.common import (
    checkpoint_kind,
    common_flags,
    device_flag,
    load_model,
    memory_lengths,
    read_corpus,
    say,
)


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "diagnose",
        help="attention maps, entropy, memory share, gradient norms, loss by position, context curve",
        description="Writes PNG plots, report.md and report.json into --out.  Units: attention entropy in bits "
        "(entropy_bits), losses in nats per token; the JSON names the unit of every number under 'units'.",
    )
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--data", help="corpus (default: the checkpoint's)")
    p.add_argument("--split", default="valid", choices=["train", "valid", "test"])
    p.add_argument("--tgt-len", type=int, default=0, help="segment length (default: the checkpoint's eval_tgt_len)")
    p.add_argument("--warmup", type=int, default=2, help="segments read first to fill the memory")
    p.add_argument("--out", required=True, help="report directory (PNG plots, report.md, report.json)")
    device_flag(p)
    p.add_argument(
        "--contexts",
        type=_lengths,
        metavar="C1,C2,...",
        help="context curve's memory lengths (default: 0, 1/2, 1, 2, 4 x mem_len; 'none': neither loss curve)",
    )
    p.add_argument("--batch-size", type=int, default=0, help="streams of the curves' pass (default: eval_batch_size)")
    p.add_argument("--max-segments", type=int, default=50, help="segments of the curves' pass (0: the whole split)")
    return common_flags(p)


def run(args: argparse.Namespace) -> dict:
    from longseq.diagnostics import diagnose
    from longseq.diagnostics.report import check_report_directory

    check_report_directory(args.out)  # before any work
    checkpoint, model, tokenizer, run = load_model(args.checkpoint, args.device)
    if not run.is_language_model:
        raise ValueError(f"diagnose reads a language model; {checkpoint} is {checkpoint_kind(run)}")
    ids = read_corpus(args.data, run, tokenizer, checkpoint).split(args.split)
    tgt_len = args.tgt_len or run.data.eval_tgt_len
    report = diagnose(
        model,
        ids,
        args.out,
        tgt_len=tgt_len,
        warmup=args.warmup,
        contexts=args.contexts,
        batch_size=args.batch_size or run.data.eval_batch_size,
        max_segments=args.max_segments,
        tokenizer=tokenizer,
    )
    for warning in report["warnings"]:
        say(f"warning: {warning}")
    keep = ("layers", "attention_layers", "heads", "tgt_len", "mem_len", "loss", "memory_share", "grad_norms")
    keep += ("warnings", "files")
    result = {"out": args.out, **{k: report[k] for k in keep}, "entropy_bits": report["entropy_bits"]}
    averaged = report.get("memory_attention")
    if averaged is not None:  # what memory_share.png draws, under the name it prints (it printed the one segment's)
        result["memory_share"] = averaged["memory_share"]
    result["memory_share_of"] = (
        "the diagnosed segment"
        if averaged is None
        else f"{averaged['segments']} segments of {args.batch_size or run.data.eval_batch_size} streams"
    )
    if "chunks" in report:  # a model with learned chunks: chunks.png draws where it cuts the text
        result["mean_chunk_length"] = report["chunks"]["mean_length"]
    if "per_position" in report:
        pp, curve = report["per_position"], report["context_curve"]
        result["loss_memory_mean"] = sum(pp["loss_memory"]) / len(pp["loss_memory"])
        result["loss_no_memory_mean"] = sum(pp["loss_no_memory"]) / len(pp["loss_no_memory"])
        result["context_curve"] = {"contexts": curve["contexts"], "loss": curve["loss"]}
    shown = {k: v for k, v in report["units"].items() if k in result}
    result["units"] = {
        **shown,
        **{k: "nats per token" for k in ("loss_memory_mean", "loss_no_memory_mean") if k in result},
    }
    return result


def _lengths(text: str) -> list[int]:
    if text.strip().lower() == "none":
        return []
    return memory_lengths(text)
