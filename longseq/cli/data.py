"""``longseq data``: generate task data (LRA ListOps)."""

from __future__ import annotations

import argparse

from longseq.cli.common import common_flags


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("data", help="generate task data")
    p.add_argument("kind", choices=["listops"])
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--train", type=int, default=2000)
    p.add_argument("--valid", type=int, default=200)
    p.add_argument("--test", type=int, default=200)
    p.add_argument("--min-length", type=int, default=500)
    p.add_argument("--max-length", type=int, default=2000)
    return common_flags(p)


def run(args: argparse.Namespace) -> dict:
    from longseq.data.tasks import write_listops

    sizes = {"train": args.train, "valid": args.valid, "test": args.test}
    lengths = {"min_length": args.min_length, "max_length": args.max_length}
    return {"out": args.out, "seed": args.seed, **write_listops(args.out, args.seed, sizes, **lengths)}
