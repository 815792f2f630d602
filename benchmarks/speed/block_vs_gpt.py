"""The studies' models side by side in one process: training tokens/s of XL, the llama-xl block with XL's memory,
and the same block without memory at a context of tgt_len + mem_len (issue 45's target: llama-xl with memory at
least as fast per token as the no-memory GPT).

The models are those of ``benchmarks/studies/base.toml`` and ``variants/block.toml`` (4 layers, d_model 128, 863k
parameters, 49 characters): XL and llama-xl read segments of 64 over a memory of 128, batch 16; the GPT segments of
192 without memory, batch 16 (equal tokens per step x 3).  Each variant runs ``--rounds`` times, alternating, and
the median tokens/s per second of wall time and per second of this process's CPU time is reported, with ratios to
the GPT.  ``--width 256`` runs the benchmark width instead (d_model 256, 8 heads, d_inner 1024; llama-xl's 683).

    OMP_NUM_THREADS=1 python benchmarks/speed/block_vs_gpt.py --threads 1 --rounds 5 --json
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from longseq import ModelConfig, TransformerXLLM
from longseq.eval.speed import train_throughput

BASE = dict(vocab_size=49, n_layer=4, d_model=128, n_head=4, d_head=32, d_inner=512, dropout=0.1)
LLAMA = dict(pos="rope", norm="rmsnorm", ff="swiglu", d_inner=429, bias=False, pre_lnorm=True, final_norm=True,
             n_kv_head=2, qk_norm=True)  # fmt: skip
WIDE = dict(vocab_size=256, d_model=256, n_head=8, d_inner=1024)
VARIANTS = {  # name: (model options, tgt_len, mem_len)
    "xl": ({}, 64, 128),
    "llama-xl": (LLAMA, 64, 128),
    "gpt": (LLAMA, 192, 0),
}


def model_for(name: str, width: int) -> tuple[TransformerXLLM, int]:
    options, tgt_len, mem_len = VARIANTS[name]
    base = {**BASE, **(WIDE if width == 256 else {})}
    options = {**options, **({"d_inner": 683} if width == 256 and "d_inner" in options else {})}
    return TransformerXLLM(ModelConfig(**{**base, **options, "mem_len": mem_len})), tgt_len


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--width", type=int, choices=[128, 256], default=128)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    models = {name: model_for(name, args.width) for name in VARIANTS}
    runs: dict[str, list[dict]] = {name: [] for name in VARIANTS}
    for _ in range(args.rounds):
        for name, (model, tgt_len) in models.items():
            found = train_throughput(model, batch=args.batch, tgt_len=tgt_len, steps=args.steps)
            runs[name].append({**found, "tokens_per_cpu_s": args.batch * tgt_len / found["cpu_s_per_step"]})
    result = {"threads": args.threads, "width": args.width, "batch": args.batch, "rounds": args.rounds, "rows": {}}
    for name, found in runs.items():
        wall = statistics.median(r["tokens_per_s"] for r in found)
        cpu = statistics.median(r["tokens_per_cpu_s"] for r in found)
        result["rows"][name] = {"tokens_per_s": wall, "tokens_per_cpu_s": cpu}
    gpt = result["rows"]["gpt"]
    for row in result["rows"].values():
        row["over_gpt"] = row["tokens_per_s"] / gpt["tokens_per_s"]
        row["over_gpt_cpu"] = row["tokens_per_cpu_s"] / gpt["tokens_per_cpu_s"]
    if args.json:
        print(json.dumps(result))
        return
    for name, row in result["rows"].items():
        print(f"{name}: {row['tokens_per_s']:.0f} tokens/s, {row['over_gpt']:.2f}x the GPT"
              f" ({row['over_gpt_cpu']:.2f}x per CPU second)")  # fmt: skip


if __name__ == "__main__":
    main()
