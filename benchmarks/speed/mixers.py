"""State-space and hybrid stacks against attention: training time and memory per token as the sequence grows, and
generation cost per token as the context grows.

The benchmark model of the patterns issue (4 layers, d_model 256, 8 heads x 32, d_inner 1024, bytes; ssm layers
with expand 2, heads of 32, d_state 16, chunks of 64), batch 1, one segment of ``length`` tokens per training
step (Adam, clipping).  Stacks:

    full      attention x 4, full pattern, mem_len 256
    window    attention x 4, window 256, mem_len 256
    ssm       ssm x 4 (no attention, no memory but the states)
    hybrid    ssm, attention (window 256), ssm, attention (window 256), mem_len 256
    linear, performer, retention, gla, delta
              the linear-attention family x 4 (8 heads x 32 as attention's, chunks of 64, 64 performer features;
              no attention, no memory but the matrix states)
    gla-hybrid
              gla, attention (window 256), gla, attention (window 256), mem_len 256

Each (stack, length) trains in its own process, so its peak RSS is its own; step memory is peak RSS minus the
RSS once the model and optimizer were built.  Generation: a prompt of ``context`` tokens is read, then
``--new-tokens`` are generated greedily; XL keeps the whole context (mem_len = context, ring key/value memory),
the hybrids keep 256 positions in their attention layers, the ssm and linear-attention stacks only their states.
Each row records the carried memory after the prompt (``memory_mb``, and per context token) and the process's
peak RSS over the base (``peak_mb``): flat in the context for a recurrent stack.

A smoke run (seconds)::

    python benchmarks/speed/mixers.py train --stacks gla delta --lengths 128 --steps 1 --json
    python benchmarks/speed/mixers.py generate --stacks gla full --contexts 128 --new-tokens 4 --json

Usage::

    python benchmarks/speed/mixers.py train [--lengths 1024 2048 ... 32768] [--stacks full window ssm hybrid] [--json]
    python benchmarks/speed/mixers.py generate [--contexts 1024 4096 16384] [--new-tokens 64] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import torch

SSM = dict(head_dim=32, d_state=16, expand=2, chunk=64, conv_kernel=4)
LINEAR = ("linear", "performer", "retention", "gla", "delta")
STACKS = {
    "full": dict(mem_len=256),
    "window": dict(mem_len=256, attention=["window"], window=256),
    "ssm": dict(mem_len=0, mixer=["ssm"], **SSM),
    "hybrid": dict(
        mem_len=256, mixer=["ssm", "attention", "ssm", "attention"], attention=["window"], window=256, **SSM
    ),
    **{
        name: dict(mem_len=0, mixer=[name], chunk=64, **({"features": 64} if name == "performer" else {}))
        for name in LINEAR
    },
    "gla-hybrid": dict(
        mem_len=256, mixer=["gla", "attention", "gla", "attention"], attention=["window"], window=256, chunk=64
    ),
}


def peak_rss_mb() -> float:
    from longseq.eval.speed import peak_rss_mb as peak

    return peak()


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def build(stack: str, **overrides):
    from longseq.eval.speed import bench_config
    from longseq.model import TransformerXLLM

    settings = {**STACKS[stack], **overrides}
    torch.manual_seed(0)
    return TransformerXLLM(bench_config(settings.pop("mem_len"), attn_chunk=64, **settings))


def train_worker(stack: str, length: int, steps: int) -> dict:
    from longseq.eval.speed import train_throughput

    model = build(stack)
    base = rss_mb()
    result = train_throughput(model, batch=1, tgt_len=length, steps=steps, warmup=1)
    step_mb = result["peak_rss_mb"] - base
    return {"stack": stack, "length": length, "parameters": model.num_parameters(),
            "us_per_token": result["step_ms"] * 1000 / length, "peak_rss_mb": result["peak_rss_mb"],
            "step_mb": step_mb, "kb_per_token": step_mb * 1024 / length}  # fmt: skip


@torch.no_grad()
def generate_worker(stack: str, context: int, new_tokens: int) -> dict:
    from longseq.generation import read_prompt

    model = build(stack, **({"mem_len": context} if stack == "full" else {})).eval()
    prompt = torch.randint(0, 256, (1, context + 1))
    recurrence = model.config.recurrence(mem_len=context if stack == "full" else STACKS[stack]["mem_len"])
    greedy(model, read_prompt(model, prompt[:, :63], 512, recurrence), prompt[:, 63:64], 4, recurrence)  # warm-up
    base = rss_mb()
    start = time.perf_counter()
    mems = read_prompt(model, prompt[:, :-1], 512, recurrence)
    first = time.perf_counter()
    mems = greedy(model, mems, prompt[:, -1:], new_tokens, recurrence)
    end = time.perf_counter()
    held = sum(t.numel() * t.element_size() for layer in mems.layers for t in layer.all_tensors()) / 2**20
    return {"stack": stack, "context": context, "ms_per_token": (end - first) * 1000 / new_tokens,
            "read_ms_per_token": (first - start) * 1000 / context, "memory_mb": held,
            "memory_kib_per_context_token": held * 1024 / context, "peak_mb": peak_rss_mb() - base}  # fmt: skip


def greedy(model, mems, token, steps: int, recurrence):
    """``steps`` greedy tokens from ``token`` (B, 1) after ``mems``, as ``generate_stream`` draws them: the memory."""
    for _ in range(steps):
        scores, mems = model.next_token_scores(token, mems, recurrence=recurrence)
        token = scores.argmax(dim=-1, keepdim=True)
    return mems


def run_worker(args: list[str], threads: int) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    done = subprocess.run([sys.executable, __file__, "--worker", *args], capture_output=True, text=True, env=env)
    if done.returncode:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("task", nargs="?", choices=["train", "generate"], default="train")
    parser.add_argument("--stacks", nargs="+", default=list(STACKS), choices=list(STACKS))
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384, 32768])
    parser.add_argument("--contexts", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--max-full", type=int, default=8192, help="longest length the full pattern trains at")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.worker:
        kind, stack, size, count = args.worker
        worker = train_worker if kind == "train" else generate_worker
        print(json.dumps(worker(stack, int(size), int(count))))
        return
    rows = []
    sizes = args.lengths if args.task == "train" else args.contexts
    count = args.steps if args.task == "train" else args.new_tokens
    for stack in args.stacks:
        for size in sizes:
            if args.task == "train" and stack == "full" and size > args.max_full:
                rows.append({"stack": stack, "length": size, "skipped": f"quadratic: above --max-full {args.max_full}"})
                continue
            row = run_worker([args.task, stack, str(size), str(count)], args.threads)
            rows.append({"stack": stack, "size": size, **row})
            if not args.json:
                print(rows[-1], flush=True)
    if args.json:
        print(json.dumps({"task": args.task, "threads": args.threads, "torch": torch.__version__, "rows": rows}))


if __name__ == "__main__":
    main()
