"""``longseq plot``: training curves of runs against step and wall time (``--bpb``: validation bits per byte)."""

from __future__ import annotations

import argparse

from longseq.cli.common import common_flags


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("plot", help="training curves of runs against step and wall time")
    p.add_argument("runs", nargs="+", metavar="RUN_DIR")
    p.add_argument("--out", required=True, help="PNG file")
    p.add_argument(
        "--bits",
        action="store_true",
        help="draw the loss in bits per token (default: nats per token); the other unit is on the right axis",
    )
    p.add_argument(
        "--bpb",
        action="store_true",
        help="draw validation bits per UTF-8 byte: runs of different tokenizers (byte, char, word, BPE) compare",
    )
    return common_flags(p)


def run(args: argparse.Namespace) -> dict:
    from longseq.cli.common import say
    from longseq.diagnostics import plot_runs

    result = plot_runs(args.runs, args.out, bits=args.bits, bpb=args.bpb)
    if "note" in result:
        say(f"note: {result['note']}")
    return result
