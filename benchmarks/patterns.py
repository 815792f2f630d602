"""Training step time and peak memory of attention patterns against sequence length.

The model of the patterns issue: 4 layers, d_model 256, 8 heads x 32, d_inner 1024, byte vocabulary,
batch 1, ``tgt_len`` = the sequence length, mem_len 256 (XL memory carried between steps), Adam and
clipping.  Each (pattern, length) runs in its own process, so peak RSS is that run's alone; the step
memory reported is peak RSS minus the RSS after the model and optimizer were built, per token.

Patterns: ``full``; ``window`` (256 keys); ``dilated`` (256 keys, dilation 1 in heads 0-3 and 2 in heads
4-7, reach 510); ``block_sparse`` (blocks of 128, the last 8 columns of every block as summaries).
Lengths where a pattern would need more than ``--max-gib`` are skipped with the estimate that ruled them out.

Allocator: by default each worker runs with ``MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=<large>`` so that glibc
reuses freed memory instead of returning every large tensor to the kernel and faulting it in again (with the
default settings the page faults of tensors above 32 MiB grow the time per token at long lengths;
``--system-malloc`` shows that).

Usage::

    python benchmarks/patterns.py [--lengths 1024 2048 ... 32768] [--patterns full window ...] [--steps 2] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import torch

PATTERNS = {
    "full": dict(attention=["full"]),
    "window": dict(attention=["window"], window=256),
    "dilated": dict(attention=["dilated"], window=256, dilation=[1, 1, 1, 1, 2, 2, 2, 2]),
    "block_sparse": dict(attention=["block_sparse"], block_size=128, block_summary=8),
}
MEM_LEN = 256


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def worker(pattern: str, length: int, steps: int) -> dict:
    from longseq.eval.speed import bench_config, train_throughput
    from longseq.model import TransformerXLLM

    torch.manual_seed(0)
    model = TransformerXLLM(bench_config(MEM_LEN, attn_chunk=64, **PATTERNS[pattern]))
    base = rss_mb()
    result = train_throughput(model, batch=1, tgt_len=length, steps=steps, warmup=1)
    step_mb = result["peak_rss_mb"] - base
    return {
        "pattern": pattern,
        "length": length,
        "step_s": result["step_ms"] / 1000,
        "us_per_token": result["step_ms"] * 1000 / length,
        "peak_rss_mb": result["peak_rss_mb"],
        "step_mb": step_mb,
        "kb_per_token": step_mb * 1024 / length,
    }


def quadratic_estimate_gib(length: int) -> float:
    """Saved attention probabilities of a pattern whose blocks see the whole prefix: 4 layers x 8 heads x
    L x (L + mem_len) / 2 (causal blocks) floats, about the dominant term."""
    return 4 * 8 * length * (length + MEM_LEN) / 2 * 4 / 2**30


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384, 32768])
    parser.add_argument("--patterns", nargs="+", default=list(PATTERNS), choices=list(PATTERNS))
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--max-gib", type=float, default=12.0, help="skip quadratic runs estimated above this")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--system-malloc", action="store_true", help="keep glibc's default mmap behaviour")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--worker", nargs=2, metavar=("PATTERN", "LENGTH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.worker:
        print(json.dumps(worker(args.worker[0], int(args.worker[1]), args.steps)))
        return
    rows = []
    for pattern in args.patterns:
        for length in args.lengths:
            quadratic = pattern in ("full", "block_sparse")
            if quadratic and quadratic_estimate_gib(length) > args.max_gib:
                row = {"pattern": pattern, "length": length, "skipped": f"~{quadratic_estimate_gib(length):.0f} GiB"}
            else:
                begin = time.perf_counter()
                cmd = [sys.executable, __file__, "--worker", pattern, str(length), "--steps", str(args.steps)]
                cmd += ["--threads", str(args.threads)]
                env = dict(os.environ)
                if not args.system_malloc:
                    env.update(MALLOC_MMAP_MAX_="0", MALLOC_TRIM_THRESHOLD_=str(2**40))
                done = subprocess.run(cmd, capture_output=True, text=True, env=env)
                if done.returncode != 0:
                    row = {"pattern": pattern, "length": length, "failed": done.stderr.strip().splitlines()[-1:]}
                else:
                    row = json.loads(done.stdout.strip().splitlines()[-1])
                row["wall_s"] = time.perf_counter() - begin
            rows.append(row)
            if not args.json:
                print(_line(row), flush=True)
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(_ratios(rows))


def _line(row: dict) -> str:
    head = f"{row['pattern']:>12} {row['length']:>6}"
    if "skipped" in row:
        return f"{head}  skipped (quadratic, {row['skipped']})"
    if "failed" in row:
        return f"{head}  failed: {row['failed']}"
    return (
        f"{head}  step {row['step_s']:7.2f} s  {row['us_per_token']:7.1f} us/token  peak RSS {row['peak_rss_mb']:8.0f} MiB"
        f"  step memory {row['kb_per_token']:6.1f} KiB/token"
    )


def _ratios(rows: list[dict]) -> str:
    """Largest over smallest time and memory per token of each pattern from 2k to 32k tokens."""
    lines = []
    for pattern in dict.fromkeys(r["pattern"] for r in rows):
        done = [r for r in rows if r["pattern"] == pattern and "step_s" in r and r["length"] >= 2048]
        if len(done) < 2:
            continue
        t = [r["us_per_token"] for r in done]
        m = [r["kb_per_token"] for r in done]
        lengths = f"{done[0]['length']}..{done[-1]['length']}"
        lines.append(
            f"{pattern}: {lengths} time/token max/min {max(t) / min(t):.2f}, memory/token {max(m) / min(m):.2f}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
