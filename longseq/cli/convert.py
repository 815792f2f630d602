"""``longseq convert``: Hugging Face TransfoXL checkpoints to longseq and back."""

from __future__ import annotations

import argparse

from longseq.cli.common import common_flags, say


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "convert",
        help="convert Hugging Face TransfoXL checkpoints to longseq and back",
        description="longseq convert --from-hf HF_DIR --out DIR [--vocab vocab.txt]  |  "
        "longseq convert --to-hf --checkpoint DIR --out HF_DIR",
    )
    p.add_argument(
        "--from-hf", metavar="DIR", help="HF TransfoXL directory (config.json + model.safetensors or pytorch_model.bin)"
    )
    p.add_argument("--to-hf", action="store_true", help="export --checkpoint to an HF TransfoXL directory")
    p.add_argument("--checkpoint", help="longseq checkpoint to export")
    p.add_argument("--vocab", help="plain-text vocabulary, one token per line in id order (never a pickle)")
    p.add_argument("--out", required=True, help="output directory")
    return common_flags(p)


def run(args: argparse.Namespace) -> dict:
    import os

    from longseq.interop.hf import convert_from_hf, export_to_hf
    from longseq.train.checkpoint import load_checkpoint, resolve_checkpoint, save_checkpoint

    if bool(args.from_hf) == bool(args.to_hf):
        raise ValueError("give exactly one of --from-hf DIR or --to-hf (with --checkpoint DIR)")
    if args.from_hf:
        model, tokenizer, run = convert_from_hf(args.from_hf, vocab=args.vocab)
        save_checkpoint(args.out, model, run, tokenizer, metrics={"converted_from": os.path.abspath(args.from_hf)})
        return {
            "from_hf": args.from_hf,
            "checkpoint": args.out,
            "n_layer": run.model.n_layer,
            "vocab_size": run.model.vocab_size,
        }
    if not args.checkpoint:
        raise ValueError("--to-hf needs --checkpoint DIR (a longseq checkpoint)")
    model, tokenizer, _, _ = load_checkpoint(resolve_checkpoint(args.checkpoint, say))
    export_to_hf(model, args.out, tokenizer)
    return {"checkpoint": args.checkpoint, "to_hf": args.out}
