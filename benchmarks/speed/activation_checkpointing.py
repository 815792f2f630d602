"""Peak memory and step time of a training step with and without activation checkpointing.

The benchmark model (4 layers, d_model 256, 8 heads x 32, d_inner 1024, bytes), batch 1, ``tgt_len`` = the
length, mem_len 256, one warm-up and two timed steps, each setting in its own process (so peak RSS is its own).
``every`` = k recomputes every k-th layer (0: off, 1: all).  Step memory = peak RSS minus the RSS after building
model and optimizer.  Workers keep freed memory (``MALLOC_MMAP_MAX_=0``), as in ``benchmarks/speed/patterns.py``.

Usage::

    python benchmarks/speed/activation_checkpointing.py [--lengths 2048 8192] [--every 0 2 1] [--attention window]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import torch


def worker(length: int, every: int, attention: str) -> dict:
    from longseq.eval.speed import bench_config, train_throughput
    from longseq.model import TransformerXLLM

    torch.manual_seed(0)
    extra = {"attention": [attention], "window": 256} if attention != "full" else {}
    model = TransformerXLLM(bench_config(256, attn_chunk=64, **extra))
    model.transformer.stack.activation_checkpointing = every
    with open("/proc/self/statm") as f:
        base = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    result = train_throughput(model, batch=1, tgt_len=length, steps=2, warmup=1)
    return {
        "length": length,
        "every": every,
        "attention": attention,
        "step_s": result["step_ms"] / 1000,
        "step_mib": result["peak_rss_mb"] - base,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[2048, 8192])
    parser.add_argument("--every", type=int, nargs="+", default=[0, 2, 1])
    parser.add_argument("--attention", default="window", choices=["full", "window"])
    parser.add_argument("--worker", nargs=2, type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(2)
    if args.worker:
        print(json.dumps(worker(args.worker[0], args.worker[1], args.attention)))
        return
    env = {**os.environ, "MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(2**40)}
    rows = []
    for length in args.lengths:
        for every in args.every:
            cmd = [sys.executable, __file__, "--worker", str(length), str(every), "--attention", args.attention]
            done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
            rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
            base = next(r for r in rows if r["length"] == length and r["every"] == args.every[0])
            row = rows[-1]
            print(
                f"{args.attention} length {length:>6} every {every}: step {row['step_s']:6.2f} s "
                f"({row['step_s'] / base['step_s']:.2f}x)  step memory {row['step_mib']:7.0f} MiB "
                f"({row['step_mib'] / base['step_mib']:.2f}x)",
                flush=True,
            )


if __name__ == "__main__":
    main()
