"""The CPU dropout mask from 15 bits a decision against 31, side by side in one process.

    python benchmarks/speed/dropout_noise.py [--threads 2] [--rounds 5] [--json]

``longseq.model.block.dropout_noise`` draws its integers with ``random_()``, which fills a tensor one value at a time
whatever the threads; for a p that 15 bits express (``noise_bits``: 0.1, 0.2, 0.5 ...) each 64-bit draw gives four
decisions instead of two.  This times the noise for the default model's largest dropout site (8 x 128 tokens x
1,024 hidden units, p = 0.1) both ways: ``bits31`` runs the same function with ``noise_bits`` held at 31, the
library's path for every p before 2026-12-06 and for the p that 15 bits do not express.  Rounds alternate the
order; each round is the median of ``--repeats`` calls.  Both masks are checked to keep 1 - p of the elements.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import longseq.model.block as block  # noqa: E402

SHAPE, P = (8, 128, 1024), 0.1


def noise_ms(bits: int | None, repeats: int) -> float:
    """Median milliseconds of one ``dropout_noise`` call, with ``noise_bits`` held at ``bits`` (None: the library's)."""
    chosen = block.noise_bits
    if bits is not None:
        block.noise_bits = lambda p: bits
    try:
        like, times = torch.empty(SHAPE), []
        kept = (block.dropout_noise(like, P) != 0).float().mean().item()
        assert abs(kept - (1 - P)) < 0.005, kept
        for _ in range(repeats):
            start = time.perf_counter()
            block.dropout_noise(like, P)
            times.append(time.perf_counter() - start)
        return 1000 * statistics.median(times)
    finally:
        block.noise_bits = chosen


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    ways = {"bits15": None, "bits31": 31}
    assert block.noise_bits(P) == 15
    rounds = {name: [] for name in ways}
    for r in range(args.rounds):
        for name in ways if r % 2 == 0 else reversed(ways):
            rounds[name].append(noise_ms(ways[name], args.repeats))
    ms = {name: statistics.median(v) for name, v in rounds.items()}
    result = {"shape": list(SHAPE), "p": P, "threads": args.threads, "rounds": rounds, "median_ms": ms,
              "bits31_over_bits15": ms["bits31"] / ms["bits15"]}  # fmt: skip
    if args.json:
        print(json.dumps(result))
    else:
        print(f"15 bits {ms['bits15']:.3f} ms, 31 bits {ms['bits31']:.3f} ms: {result['bits31_over_bits15']:.2f}x")


if __name__ == "__main__":
    main()
