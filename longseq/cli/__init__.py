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
    longseq linearize --teacher DIR --mixer gla --layers 1,3 | --ratio 0.5 [--select kl|spread] --out DIR [--json]

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
    "linearize",
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


DROPPED_ON_RESUME = ("config", "out", "resume", "overwrite")  # a resume reads the run's own config from OUT/last


def resume_command(parser: argparse.ArgumentParser, argv: list[str], args: argparse.Namespace, checkpoint: str) -> str:
    """The command that continues a run stopped by a signal, shell-quoted, to paste as printed: the command line
    given, without ``--config`` (a resume continues the run's own settings: ``OUT/last``), ``--overwrite`` and
    ``--resume``, with ``--out`` the run directory, then ``--resume``.  Options are matched as argparse matches them
    (``--conf`` is ``--config``)."""
    import os
    import shlex

    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[args.command]
    options = sub._option_string_actions
    kept, tokens = [], list(argv[1:])  # argv[0] is the command: the top-level parser has no other option
    while tokens:
        token = tokens.pop(0)
        name = token.split("=", 1)[0]
        matches = [o for o in options if o == name] or [o for o in options if o.startswith(name) and len(name) > 2]
        action = options[matches[0]] if len(matches) == 1 else None
        if action is None or action.dest not in DROPPED_ON_RESUME:
            kept.append(token)
        elif action.nargs is None and "=" not in token and tokens:
            tokens.pop(0)  # the option's value
    out = getattr(args, "out", None) or os.path.relpath(os.path.dirname(checkpoint))
    return shlex.join(["longseq", args.command, *kept, "--out", out, "--resume"])


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
        command = resume_command(parser, sys.argv[1:] if argv is None else argv, args, stopped.checkpoint)
        print(f"longseq {args.command}: {stopped}\nresume with: {command}", file=sys.stderr)
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
