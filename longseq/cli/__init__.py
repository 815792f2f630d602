"""The ``longseq`` command line: a thin layer that parses, calls the library and prints.

Every command is a module of this package with ``add_parser(subparsers)`` and ``run(args) -> dict``::

    longseq train [--preset tiny-shakespeare] [--config RUN.toml] [--set key=value ...] [--data PATH]
                  [--tokenizer byte|char|word|bpe|FILE.json] [--vocab-size N] [--out DIR] [--resume] [--json]
    longseq eval --checkpoint DIR [--split valid|test] [--set mem_len=1600 ...] [--data PATH] [--json]
    longseq eval --checkpoint DIR --per-position | --context-curve 0,64,128,256 [--plot FILE.png] [--json]
    longseq eval recl --checkpoint A --checkpoint B ... [--contexts 32 64 128] [--r 0.1 0.5 1.0] [--json]
    longseq generate --checkpoint DIR --prompt TEXT --max-new-tokens N [--temperature T] [--top-k K]
                  [--top-p P] [--seed S] [--json]
    longseq bench train|eval|generate|eval-speed [--attn-len 800 1800 ...] [--json]
    longseq convert --from-hf HF_DIR --out DIR [--vocab vocab.txt] | --to-hf --checkpoint DIR --out HF_DIR
    longseq diagnose --checkpoint DIR [--data PATH] --out DIR [--contexts 0,64,128] [--json]
    longseq plot RUN_DIR [RUN_DIR ...] --out FILE.png [--bits]
    longseq finetune --task classify|span|mlm --data train.jsonl [--valid valid.jsonl] --checkpoint DIR --out DIR
                  [--resume] [--json]
    longseq predict --checkpoint DIR --data IN.jsonl --out OUT.jsonl [--json]
    longseq data prepare --data PATH --tokenizer byte|char|word|bpe|FILE.json [--vocab-size N] --out DIR [--json]
    longseq data listops --out DIR [--seed N] [--train 2000 --valid 200 --test 200]
    longseq train --task passkey|mqar|copying|induction [--set seq_len=256 ...] --out DIR
    longseq recall CHECKPOINT [--distances 16,64,256] [--lengths 256,4096] [--n 64] [--out FILE.json] [--json]

Human-readable progress goes to stderr; the result goes to stdout (one JSON object on the last line with ``--json``).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from longseq.cli.common import emit, library_errors

COMMANDS = (
    "train",
    "eval",
    "generate",
    "convert",
    "bench",
    "diagnose",
    "plot",
    "finetune",
    "predict",
    "data",
    "recall",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="longseq", description="Transformer-XL language modeling: train, eval, generate."
    )
    sub = parser.add_subparsers(dest="command", metavar="{" + ",".join(COMMANDS) + "}")
    for name in COMMANDS:
        module = importlib.import_module(f"longseq.cli.{name}")
        module.add_parser(sub).set_defaults(func=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    from longseq.train.signals import Interrupted

    try:
        result = args.func(args)
    except Interrupted as stopped:
        resume = " ".join(a for a in sys.argv[1:] if a not in ("--overwrite", "--resume")) + " --resume"
        print(f"longseq {args.command}: {stopped}\nresume with: longseq {resume}", file=sys.stderr)
        return stopped.exit_code
    except library_errors() as exc:
        print(f"longseq {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"longseq {args.command}: interrupted", file=sys.stderr)
        return 130
    if result:
        emit(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
