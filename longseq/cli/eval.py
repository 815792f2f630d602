"""``longseq eval``: score a checkpoint over one ordered pass (``eval recl``: RECL of a group of checkpoints)."""

from __future__ import annotations

import argparse
import os

from longseq.cli.common import common_flags, device_flag, load_model, overrides, read_corpus
from longseq.config import EvalConfig, apply_overrides

EPILOG = """override evaluation settings with --set key=value; keys: split tgt_len mem_len clamp_len same_length
batch_size max_segments.  The paper evaluates with a longer memory than it trains with, e.g.
--set tgt_len=64 mem_len=640 clamp_len=400 same_length=true for WikiText-103."""


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "eval", help="evaluate a checkpoint", epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("mode", nargs="?", choices=["recl"], help="recl: relative effective context length of a group")
    p.add_argument(
        "--checkpoint", required=True, action="append", help="checkpoint directory (repeat for a RECL group)"
    )
    p.add_argument("--split", default="valid", choices=["train", "valid", "test"])
    p.add_argument("--data", help="corpus to evaluate (default: the one the checkpoint was trained on)")
    p.add_argument("--set", nargs="+", action="append", metavar="KEY=VALUE", help="evaluation override")
    p.add_argument("--contexts", type=int, nargs="+", default=[32, 64, 128, 256], help="RECL context lengths")
    p.add_argument("--r", type=float, nargs="+", default=[0.1, 0.5, 1.0], help="RECL top-r fractions")
    p.add_argument("--max-tokens", type=int, default=4000, help="RECL: tokens scored per model and length")
    device_flag(p)
    return common_flags(p)


def run(args: argparse.Namespace) -> dict:
    from longseq.eval.evaluate import bits_unit, evaluate
    from longseq.model.positions import position_encoding

    if args.mode == "recl":
        return run_recl(args)
    if len(args.checkpoint) != 1:
        raise ValueError(
            f"longseq eval takes one --checkpoint (got {len(args.checkpoint)}); RECL of a group: eval recl"
        )
    settings = apply_overrides({"eval": EvalConfig(split=args.split)}, overrides(args.set))["eval"]
    checkpoint, model, tokenizer, run_config = load_model(args.checkpoint[0], args.device)
    if run_config.task is not None:
        raise ValueError(f"{checkpoint} is fine-tuned for {run_config.task.name}; score it with longseq predict")
    corpus = read_corpus(args.data, run_config, tokenizer, checkpoint)
    ids = corpus.split(settings.split)
    doc_ids = corpus.doc_ids[settings.split] if run_config.data.doc_reset and corpus.doc_ids is not None else None
    unit = bits_unit(tokenizer.kind)
    batch_size = settings.batch_size or run_config.data.eval_batch_size
    if not position_encoding(model.config.positions.pos).relative:  # the vanilla Transformer: sliding windows
        from longseq.eval.sliding import evaluate_sliding

        tgt_len = settings.tgt_len or run_config.data.tgt_len
        metrics = evaluate_sliding(
            model,
            ids,
            context=tgt_len,
            batch_size=batch_size,
            max_targets=settings.max_segments * tgt_len,
            bits_unit=unit,
        )
        return {"split": settings.split, **metrics}
    metrics = evaluate(
        model, ids, batch_size=batch_size, tgt_len=settings.tgt_len or run_config.data.eval_tgt_len,
        mem_len=settings.mem_len, clamp_len=settings.clamp_len, same_length=settings.same_length,
        max_segments=settings.max_segments, bits_unit=unit, progress=not args.quiet, doc_ids=doc_ids,
    )  # fmt: skip
    return {"split": settings.split, **metrics}


def run_recl(args: argparse.Namespace) -> dict:
    from longseq.eval.recl import group_losses, recl

    if args.set:
        raise ValueError("eval recl takes no --set; choose the lengths with --contexts")
    models, corpus_ids, names = {}, None, []
    for path in args.checkpoint:
        path, model, tokenizer, run_config = load_model(path, args.device)
        name = os.path.basename(os.path.dirname(os.path.abspath(path))) or path
        if name in models:
            name = path
        ids = read_corpus(args.data, run_config, tokenizer, path).split(args.split)
        if corpus_ids is not None and (len(ids) != len(corpus_ids) or (ids[:1000] != corpus_ids[:1000]).any()):
            raise ValueError(f"{path} reads a different token sequence than {names[0]}: RECL needs the same tokens")
        corpus_ids = ids
        models[name] = (model, run_config)
        names.append(path)
    losses = group_losses(models, corpus_ids, args.contexts, max_targets=args.max_tokens, progress=not args.quiet)
    result = {"contexts": args.contexts, "tokens": int(len(next(iter(next(iter(losses.values())).values()))))}
    for r in args.r:
        result[f"recl_r{r:g}"] = recl(losses, r=r)
    result["loss_by_context"] = {
        name: {str(c): float(v.mean()) for c, v in per.items()} for name, per in losses.items()
    }
    return result
