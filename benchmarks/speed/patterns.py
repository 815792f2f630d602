"""Training step time and peak memory of every attention pattern against sequence length, beside its pairs.

The model of the patterns issue: 4 layers, d_model 256, 8 heads x 32, d_inner 1024, byte vocabulary,
batch 1, ``tgt_len`` = the sequence length, mem_len 256 (XL memory carried between steps), Adam and
clipping, ``attn_chunk`` 64.  Each (pattern, length) runs in its own process, so peak RSS is that run's alone; the
step memory reported is peak RSS minus the RSS after the model and optimizer were built, per token.

Beside the times: the (query, key) pairs per token the pattern allows (counted from its predicate over the
segment and the memory) and the pairs per token the kernel scores (its band and pieces, padding included).  On a
shared machine wall time is noisy: CPU time (user + system) per token is reported too, with the minor page faults
per token of the timed steps, which show what the allocator pays.

Patterns (``PATTERNS``): ``window`` 256; ``dilated`` 256 keys, dilation 1 in heads 0-3 and 2 in 4-7; ``strided``
window 128 + stride 128, and ``strided_sqrt`` with the stride the square root of the window length (so its pairs per
query stay near 2 sqrt(K)); ``block_sparse`` blocks of 128 with 8 summary columns, ``block_sparse_1`` with one;
``global`` window 256 + the first 4 tokens of each segment global; ``bigbird`` window 128, blocks of 64, 3 random
blocks, 2 global tokens.  Lengths where ``full`` would need more than ``--max-gib`` are skipped with the estimate.

The process runs with longseq's allocator settings (glibc keeps freed memory, :mod:`longseq.runtime`), no
environment variables; ``--system-malloc`` runs the workers with glibc's defaults instead (``LONGSEQ_MALLOC=system``).

Usage::

    python benchmarks/speed/patterns.py [--lengths 1024 2048 ... 32768] [--patterns full window ...] [--steps 2] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time

import torch

PATTERNS = {
    "full": dict(attention=["full"]),
    "window": dict(attention=["window"], window=256),
    "dilated": dict(attention=["dilated"], window=256, dilation=[1, 1, 1, 1, 2, 2, 2, 2]),
    "strided": dict(attention=["strided"], window=128, stride=128),
    "strided_sqrt": dict(attention=["strided"], window=128, stride="sqrt"),
    "block_sparse": dict(attention=["block_sparse"], block_size=128, block_summary=8),
    "block_sparse_1": dict(attention=["block_sparse"], block_size=128, block_summary=1),
    "global": dict(attention=["global"], window=256, num_global=4),
    "bigbird": dict(attention=["bigbird"], window=128, block_size=64, num_random_blocks=3, num_global=2),
}
MEM_LEN = 256
CHUNK = 64


def pattern_config(pattern: str, length: int) -> dict:
    fields = dict(PATTERNS[pattern])
    if fields.get("stride") == "sqrt":
        fields["stride"] = math.isqrt(length + MEM_LEN)
    return fields


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def pairs_per_token(model, length: int) -> tuple[float, float]:
    """(allowed, scored) (query, key) pairs per token of the first layer with a full memory: allowed counted from
    the pattern's predicate in blocks of queries; scored from the kernel's layout (band, sparse pieces, or the key
    ranges of the query blocks), padding included."""
    from longseq.model.attention.patterns import PatternMask, global_keys
    from longseq.model.attention.sparse import sparse_pieces

    pattern = model.transformer.stack.patterns[0]
    flags = global_keys(None, pattern.config.num_global, 1, length, MEM_LEN, None) if pattern.has_global else None
    mask = PatternMask(pattern, length, MEM_LEN, global_keys=flags)
    allowed = 0
    for q0 in range(0, length, 256):
        lo, hi = mask.key_range(q0, min(length, q0 + 256))
        for k0 in range(lo, hi, 4096):
            allowed += int((~mask.forbidden_at(MEM_LEN + torch.arange(q0, min(length, q0 + 256))[:, None],
                                               torch.arange(k0, min(hi, k0 + 4096))[None, :])).sum())  # fmt: skip
        mask._blocks.clear()
    allowed /= (
        len(pattern.config.dilation) if len(pattern.config.dilation) > 1 else 1
    )  # the predicate counted every head
    band = mask.band(CHUNK)
    if band is not None:
        scored = sum(band) + CHUNK
    elif pattern.local_reach is not None:
        pieces = sparse_pieces(mask, CHUNK)
        scored = sum(p.width for p in pieces) + (0 if flags is None else int(flags.sum()) * (length + MEM_LEN) / length)
    else:
        scored = sum(
            hi - lo for lo, hi in (mask.key_range(q0, min(length, q0 + CHUNK)) for q0 in range(0, length, CHUNK))
        )
        scored *= CHUNK / length
    return allowed / length, scored


def worker(pattern: str, length: int, steps: int, warmup: int) -> dict:
    from longseq.eval.speed import bench_config, train_throughput
    from longseq.model import TransformerXLLM
    from longseq.runtime import allocator

    torch.manual_seed(0)
    model = TransformerXLLM(bench_config(MEM_LEN, attn_chunk=CHUNK, **pattern_config(pattern, length)))
    base = rss_mb()
    result = train_throughput(model, batch=1, tgt_len=length, steps=steps, warmup=warmup)
    step_mb = result["peak_rss_mb"] - base
    allowed, scored = pairs_per_token(model, length)
    return {
        "pattern": pattern,
        "length": length,
        "step_s": result["step_ms"] / 1000,
        "us_per_token": result["step_ms"] * 1000 / length,
        "cpu_us_per_token": 1e6 * result["cpu_s_per_step"] / length,  # the timed steps only
        "sys_us_per_token": 1e6 * result["sys_s_per_step"] / length,
        "faults_per_token": result["minor_faults_per_step"] / length,
        "peak_rss_mb": result["peak_rss_mb"],
        "step_mb": step_mb,
        "kb_per_token": step_mb * 1024 / length,
        "allowed_pairs_per_token": allowed,
        "scored_pairs_per_token": scored,
        "allocator": allocator(),
    }


def quadratic_estimate_gib(length: int) -> float:
    """Saved attention probabilities of full attention: 4 layers x 8 heads x L x (L + mem_len) / 2 (causal blocks)
    floats, about the dominant term."""
    return 4 * 8 * length * (length + MEM_LEN) / 2 * 4 / 2**30


def run_one(pattern: str, length: int, args) -> dict:
    if pattern == "full" and quadratic_estimate_gib(length) > args.max_gib:
        return {"pattern": pattern, "length": length, "skipped": f"~{quadratic_estimate_gib(length):.0f} GiB"}
    begin = time.perf_counter()
    cmd = [sys.executable, __file__, "--worker", pattern, str(length), "--steps", str(args.steps)]
    cmd += ["--warmup", str(args.warmup), "--threads", str(args.threads)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    if args.system_malloc:
        env["LONGSEQ_MALLOC"] = "system"
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        row = {"pattern": pattern, "length": length, "failed": done.stderr.strip().splitlines()[-1:]}
    else:
        row = json.loads(done.stdout.strip().splitlines()[-1])
    row["wall_s"] = time.perf_counter() - begin
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384, 32768])
    parser.add_argument("--patterns", nargs="+", default=list(PATTERNS), choices=list(PATTERNS))
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first (the memory fills in step 1)")
    parser.add_argument("--max-gib", type=float, default=12.0, help="skip full attention estimated above this")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--system-malloc", action="store_true", help="glibc's default allocator (LONGSEQ_MALLOC)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--worker", nargs=2, metavar=("PATTERN", "LENGTH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.worker:
        print(json.dumps(worker(args.worker[0], int(args.worker[1]), args.steps, args.warmup)))
        return
    rows = []
    for pattern in args.patterns:
        for length in args.lengths:
            rows.append(run_one(pattern, length, args))
            if not args.json:
                print(_line(rows[-1]), flush=True)
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(_ratios(rows))


def _line(row: dict) -> str:
    head = f"{row['pattern']:>14} {row['length']:>6}"
    if "skipped" in row:
        return f"{head}  skipped (quadratic, {row['skipped']})"
    if "failed" in row:
        return f"{head}  failed: {row['failed']}"
    return (
        f"{head}  {row['us_per_token']:7.1f} us/token (cpu {row['cpu_us_per_token']:7.1f}, sys {row['sys_us_per_token']:5.1f},"
        f" {row['faults_per_token']:5.1f} faults)  peak RSS {row['peak_rss_mb']:7.0f} MiB  {row['kb_per_token']:6.1f} KiB/token"
        f"  pairs/token allowed {row['allowed_pairs_per_token']:7.1f} scored {row['scored_pairs_per_token']:7.1f}"
    )  # fmt: skip


def _ratios(rows: list[dict]) -> str:
    """Largest over smallest time, memory and pairs per token of each pattern from 2k tokens on, and the growth of
    time per token from the shortest to the longest of those lengths against the growth of the allowed pairs."""
    lines = []
    for pattern in dict.fromkeys(r["pattern"] for r in rows):
        done = [r for r in rows if r["pattern"] == pattern and "step_s" in r and r["length"] >= 2048]
        if len(done) < 2:
            continue
        t, c = [r["us_per_token"] for r in done], [r["cpu_us_per_token"] for r in done]
        m, p = [r["kb_per_token"] for r in done], [r["allowed_pairs_per_token"] for r in done]
        growth = (t[-1] / t[0]) / (p[-1] / p[0])
        lines.append(
            f"{pattern}: {done[0]['length']}..{done[-1]['length']} time/token max/min {max(t) / min(t):.2f} "
            f"(cpu {max(c) / min(c):.2f}), memory/token {max(m) / min(m):.2f}, pairs/token {p[-1] / p[0]:.2f}, "
            f"time growth / pairs growth {growth:.2f}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
