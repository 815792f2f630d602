"""``longseq convert``: checkpoints in from transformers folders and GGUF files, and out to transformers.

``--from-hf SRC`` reads a Llama-family folder (Llama, Mistral, Qwen2, Qwen3: safetensors, sharded too) or a
``.gguf`` file (docs/pretrained.md), a longseq transformers folder, or a TransfoXL one, chosen by the source
(``longseq.interop.pretrained.convert_source``).  ``--to-hf`` writes the transformers format of any longseq
language model (``import longseq.hf``, then ``AutoModelForCausalLM.from_pretrained``; no transformers needed to write
it); ``--format llama`` (or ``mistral``, ``qwen2``, ``qwen3``) the family's own layout, which transformers loads
as it is; ``--format transfo-xl`` the old HF TransfoXL format for transformers 4.x stacks (plain Transformer-XL
models only; run it with ``longseq.interop.transfo_xl_compat.apply()``).  See docs/transformers.md."""

from __future__ import annotations

import argparse

from longseq.cli.common import common_flags, say


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "convert",
        help="import a pretrained model (transformers folder, GGUF file), or export to transformers",
        description="longseq convert --from-hf SRC --out DIR [--vocab vocab.txt]  |  "
        "longseq convert --to-hf --checkpoint DIR --out HF_DIR [--format longseq|llama|mistral|qwen2|qwen3|transfo-xl]",
    )
    p.add_argument(
        "--from-hf",
        metavar="SRC",
        help="a Llama, Mistral, Qwen2 or Qwen3 transformers folder, a .gguf file, a longseq transformers folder or a "
        "TransfoXL one (config.json + model.safetensors or pytorch_model.bin)",
    )
    p.add_argument("--to-hf", action="store_true", help="export --checkpoint to a transformers directory")
    p.add_argument(
        "--format",
        choices=("longseq", "transfo-xl", "llama", "mistral", "qwen2", "qwen3"),
        default="longseq",
        help="--to-hf format: longseq (transformers 5, AutoModelForCausalLM after `import longseq.hf`; every model), "
        "llama (the Llama family's own layout, under the type the model was imported from; mistral, qwen2, qwen3: "
        "that one) or transfo-xl (HF TransfoXL for transformers 4.x; plain Transformer-XL models only)",
    )
    p.add_argument("--checkpoint", help="longseq checkpoint to export")
    p.add_argument("--vocab", help="plain-text vocabulary, one token per line in id order (never a pickle)")
    p.add_argument("--out", required=True, help="output directory")
    return common_flags(p)


def run(args: argparse.Namespace) -> dict:
    from longseq.interop.pretrained import convert_source
    from longseq.train.checkpoint import save_checkpoint

    if bool(args.from_hf) == bool(args.to_hf):
        raise ValueError("give exactly one of --from-hf SRC or --to-hf (with --checkpoint DIR)")
    if args.to_hf:
        return export(args)
    check_converted_directory(args.out)  # before any work: a run, a trained checkpoint, a user's folder stay
    model, tokenizer, run, origin = convert_source(args.from_hf, vocab=args.vocab)
    save_checkpoint(args.out, model, run, tokenizer, metrics=origin)  # with what was not carried, if anything
    if "not_carried" in origin:
        say(f"note: not carried: {origin['not_carried']}")
    return {
        "from_hf": args.from_hf,
        "checkpoint": args.out,
        "n_layer": run.model.n_layer,
        "vocab_size": run.model.vocab_size,
        "parameters": model.num_parameters(),
        "tokenizer": tokenizer.kind,
        **({"model_type": origin["model_type"]} if "model_type" in origin else {}),
        **({"not_carried": origin["not_carried"]} if "not_carried" in origin else {}),
    }


def export(args: argparse.Namespace) -> dict:
    """``--to-hf``: the checkpoint in the format ``--format`` names."""
    from longseq.data.tokenizers import prefix_id
    from longseq.interop.hf_longseq import EXPORT_FILES, export_longseq_hf
    from longseq.interop.llama import LLAMA_FILES
    from longseq.interop.pretrained import FAMILY_FORMATS, export_family, family_for
    from longseq.interop.transfo_xl import TRANSFO_XL_FILES, check_export_directory, export_to_hf
    from longseq.train.checkpoint import load_checkpoint, resolve_checkpoint

    if not args.checkpoint:
        raise ValueError("--to-hf needs --checkpoint DIR (a longseq checkpoint)")
    files = {"transfo-xl": TRANSFO_XL_FILES, **dict.fromkeys(FAMILY_FORMATS, LLAMA_FILES)}
    check_export_directory(args.out, files.get(args.format, EXPORT_FILES))
    model, tokenizer, run, metrics = load_checkpoint(resolve_checkpoint(args.checkpoint, say))
    if not run.is_language_model:
        raise ValueError(f"{args.checkpoint} is fine-tuned for {run.task.name}; only language models export")
    tgt_len, result = run.data.tgt_len, {"checkpoint": args.checkpoint, "to_hf": args.out, "format": args.format}
    if args.format == "transfo-xl":
        export_to_hf(model, args.out, tokenizer)
    elif args.format in FAMILY_FORMATS:
        from safetensors import SafetensorError

        from longseq.outputs import write_directory

        context = run.model.memory.mem_len + tgt_len  # what a query sees: its max_position_embeddings
        family, written = family_for(args.format, model, metrics), []
        write = lambda tmp: written.append(export_family(model, tmp, tokenizer, context, family))  # noqa: E731
        write_directory(args.out, write, "the export", (SafetensorError,))  # whole or not at all, as the others
        result["model_type"] = written[0]
    else:
        mem_len = run.model.memory.mem_len + tgt_len  # the run travels with it: convert --from-hf gives it back
        export_longseq_hf(model, args.out, tokenizer, segment_len=tgt_len, generate_mem_len=mem_len, run=run)
        # the harness's hf model reads a document after this token (docs/lm-eval.md): the newline of this
        # tokenizer, a pretrained model's own beginning of text
        result["lm_eval_prefix_token_id"] = prefix_id(tokenizer)
    return result


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
