"""``longseq convert``: longseq checkpoints to transformers directories, and Hugging Face TransfoXL checkpoints in.

``--to-hf`` writes the transformers format of any longseq language model (``import longseq.hf``, then
``AutoModelForCausalLM.from_pretrained``; no transformers needed to write it); ``--to-hf --format transfo-xl`` writes
the old HF TransfoXL format for transformers 4.x stacks (plain Transformer-XL models only; run it with
``longseq.interop.transfo_xl_compat.apply()``).  See docs/transformers.md."""

from __future__ import annotations

import argparse

from longseq.cli.common import common_flags, say


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "convert",
        help="export to transformers, or import Hugging Face TransfoXL checkpoints",
        description="longseq convert --to-hf --checkpoint DIR --out HF_DIR [--format longseq|transfo-xl]  |  "
        "longseq convert --from-hf HF_DIR --out DIR [--vocab vocab.txt]",
    )
    p.add_argument(
        "--from-hf",
        metavar="DIR",
        help="HF TransfoXL directory (config.json + model.safetensors or pytorch_model.bin), or a longseq one",
    )
    p.add_argument("--to-hf", action="store_true", help="export --checkpoint to a transformers directory")
    p.add_argument(
        "--format",
        choices=("longseq", "transfo-xl"),
        default="longseq",
        help="--to-hf format: longseq (transformers 5, AutoModelForCausalLM after `import longseq.hf`; every model) "
        "or transfo-xl (HF TransfoXL for transformers 4.x; plain Transformer-XL models only)",
    )
    p.add_argument("--checkpoint", help="longseq checkpoint to export")
    p.add_argument("--vocab", help="plain-text vocabulary, one token per line in id order (never a pickle)")
    p.add_argument("--out", required=True, help="output directory")
    return common_flags(p)


def run(args: argparse.Namespace) -> dict:
    import os

    from longseq.data.tokenizers import newline_id
    from longseq.interop.hf_longseq import EXPORT_FILES, convert_from_longseq_hf, export_longseq_hf, is_longseq_hf
    from longseq.interop.transfo_xl import TRANSFO_XL_FILES, check_export_directory, convert_from_hf, export_to_hf
    from longseq.train.checkpoint import load_checkpoint, resolve_checkpoint, save_checkpoint

    if bool(args.from_hf) == bool(args.to_hf):
        raise ValueError("give exactly one of --from-hf DIR or --to-hf (with --checkpoint DIR)")
    if args.from_hf:
        check_converted_directory(args.out)  # before any work: a run, a trained checkpoint, a user's folder stay
        convert = convert_from_longseq_hf if is_longseq_hf(args.from_hf) else convert_from_hf
        model, tokenizer, run = convert(args.from_hf, vocab=args.vocab)
        save_checkpoint(args.out, model, run, tokenizer, metrics={"converted_from": os.path.abspath(args.from_hf)})
        return {
            "from_hf": args.from_hf,
            "checkpoint": args.out,
            "n_layer": run.model.n_layer,
            "vocab_size": run.model.vocab_size,
        }
    if not args.checkpoint:
        raise ValueError("--to-hf needs --checkpoint DIR (a longseq checkpoint)")
    check_export_directory(args.out, TRANSFO_XL_FILES if args.format == "transfo-xl" else EXPORT_FILES)
    model, tokenizer, run, _ = load_checkpoint(resolve_checkpoint(args.checkpoint, say))
    if run.task is not None:
        raise ValueError(f"{args.checkpoint} is fine-tuned for {run.task.name}; only language models export")
    if args.format == "transfo-xl":
        export_to_hf(model, args.out, tokenizer)
        return {"checkpoint": args.checkpoint, "to_hf": args.out, "format": args.format}
    tgt_len = run.data.tgt_len
    export_longseq_hf(
        model, args.out, tokenizer, segment_len=tgt_len, generate_mem_len=run.model.memory.mem_len + tgt_len
    )
    # the harness's hf model reads a document after this token (docs/lm-eval.md): the newline of this tokenizer
    prefix = newline_id(tokenizer)
    return {"checkpoint": args.checkpoint, "to_hf": args.out, "format": args.format, "lm_eval_prefix_token_id": prefix}


CHECKPOINT_FILES = ("config.json", "tokenizer.json", "model.safetensors", "manifest.json")


def is_converted_checkpoint(directory: str) -> bool:
    """Whether ``directory`` is a checkpoint that ``convert --from-hf`` wrote (its metrics name the source), the
    only checkpoint a conversion replaces: a trained one is never written over."""
    import json
    import os

    try:
        with open(os.path.join(directory, "config.json"), encoding="utf-8") as f:
            metrics = json.load(f).get("metrics")
    except (OSError, ValueError, AttributeError):
        return False
    return isinstance(metrics, dict) and "converted_from" in metrics


def check_converted_directory(out: str) -> None:
    """``--from-hf``'s ``--out``: new, empty, or an earlier conversion (a checkpoint is replaced as a whole, so
    anything else in it, a run's files, a trained checkpoint, is refused by name)."""
    import os

    from longseq.outputs import check_output_directory

    own = lambda path: is_converted_checkpoint(os.path.dirname(path))  # noqa: E731
    check_output_directory(out, "--out", "a converted checkpoint", {name: own for name in CHECKPOINT_FILES})
