"""Greedy generation's time per new token against the memory length, for the benchmark XL model (the one of
``vs_hf.py``): is the cost per key constant (bandwidth-bound), or is there a knee where the working set (weights,
keys, values and the projected position table of every layer) leaves the cache?

    python benchmarks/speed/generation_memory.py [--threads 2] [--mems 400 800 1200 1600 2400] [--json]

Each memory: a prompt of mem + 400 tokens read in segments of 128, then 128 greedy tokens; the time per new token
is (prompt + new) - (prompt alone), best of two.  The fit over the memories gives the time per key a token and the
fixed part; bytes a key a token are 3 x d_model x 4 (keys, values, position table) per layer.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from longseq.eval.speed import bench_config  # noqa: E402
from longseq.generation import generate  # noqa: E402
from longseq.model import TransformerXLLM  # noqa: E402

NEW = 128


def ms_per_new_token(mem: int) -> float:
    torch.manual_seed(0)
    model = TransformerXLLM(bench_config(mem)).eval()
    prompt = torch.randint(0, 256, (1, mem + 400))
    best = []
    for _ in range(2):
        start = time.perf_counter()
        generate(model, prompt, 0, temperature=0, recurrence=model.config.recurrence(mem_len=mem), segment_len=128)
        read = time.perf_counter() - start
        start = time.perf_counter()
        generate(model, prompt, NEW, temperature=0, recurrence=model.config.recurrence(mem_len=mem), segment_len=128)
        best.append((time.perf_counter() - start - read) / NEW * 1e3)
    return min(best)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--mems", type=int, nargs="+", default=[400, 800, 1200, 1600, 2400])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    config = bench_config(0)
    rows = [{"mem_len": m, "ms_per_new_token": ms_per_new_token(m)} for m in args.mems]
    xs, ys = [r["mem_len"] for r in rows], [r["ms_per_new_token"] for r in rows]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)  # ms per key
    key_bytes = 3 * config.d_model * 4 * config.n_layer
    result = {"threads": args.threads, "rows": rows, "us_per_key": 1e3 * slope, "fixed_ms": my - slope * mx,
              "key_gb_per_s": key_bytes / (slope * 1e-3) / 1e9}  # fmt: skip
    if args.json:
        print(json.dumps(result))
        return
    for r in rows:
        print(f"memory {r['mem_len']:>5}: {r['ms_per_new_token']:.3f} ms a new token")
    print(
        f"{result['us_per_key']:.3f} µs a key a token ({result['key_gb_per_s']:.1f} GB/s of keys, values and "
        f"position rows), fixed {result['fixed_ms']:.3f} ms"
    )


if __name__ == "__main__":
    main()
