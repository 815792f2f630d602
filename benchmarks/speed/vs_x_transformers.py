"""longseq against x-transformers, side by side in one process: training tokens/s with an XL memory.

    pip install ".[peers]"                                                  # x-transformers 2.31
    python benchmarks/speed/vs_x_transformers.py                          # CPU: 128/128 and 512/512, batch 8
    python benchmarks/speed/vs_x_transformers.py --device cuda --autocast bf16 --out xt.json

The benchmark model of the performance issue on both sides (4 layers, d_model 256, 8 heads of 32, d_inner 1024,
bytes, dropout 0.1 on the embedding and the feed-forward), a training step of forward, backward, clipping at 0.25
and Adam, the memory carried and detached after each step.  x-transformers (a peer: installed for benchmarks only)
runs as ``TransformerWrapper(max_mem_len=M, attn_layers=Decoder(...))`` with rotary positions, with T5 relative
bias, and with rotary positions on its flash path (``attn_flash=True``: ``scaled_dot_product_attention``); and as
a GPT of the same width without memory at a context of ``tgt_len + mem_len`` (absolute positions).  Each variant
runs ``--rounds`` times, alternating, and the median is reported with its ratio to longseq's default (the paper's
sinusoidal relative attention, ``attn_impl=auto``) and to longseq with rotary positions on SDPA (``pos=rope``, the
settings of ``xt_rotary_mem``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

WIDTH = dict(dim=256, depth=4, heads=8, attn_dim_head=32, ff_mult=4)
VARIANTS = {
    "xt_rotary_mem": dict(rotary_pos_emb=True),
    "xt_t5_mem": dict(rel_pos_bias=True),
    "xt_rotary_flash_mem": dict(rotary_pos_emb=True, attn_flash=True),
    "xt_gpt_no_mem": dict(attn_flash=True),
}
LONGSEQ = {  # longseq's side: the paper's block (the default), and rotary positions on SDPA (equal to xt_rotary_mem)
    "longseq": {},
    "longseq_rope": dict(pos="rope"),
}


def x_transformer(variant: str, tgt_len: int, mem_len: int):
    """An x-transformers model of the benchmark's width: memory ``mem_len`` unless it is the GPT variant."""
    from x_transformers import Decoder, TransformerWrapper

    gpt = variant == "xt_gpt_no_mem"
    decoder = Decoder(**WIDTH, ff_dropout=0.1, **VARIANTS[variant])
    return TransformerWrapper(
        num_tokens=256,
        max_seq_len=tgt_len + mem_len if gpt else tgt_len,
        max_mem_len=0 if gpt else mem_len,
        use_abs_pos_emb=gpt,
        emb_dropout=0.1,
        attn_layers=decoder,
    )


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def xt_throughput(model, *, batch: int, tgt_len: int, steps: int, warmup: int, autocast: str | None) -> float:
    """Training tokens/s of an x-transformers model, the loop of longseq's ``train_throughput``."""
    model.train()
    device = next(model.parameters()).device
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    seq = tgt_len * (2 if model.max_mem_len == 0 else 1)  # the GPT reads segment + memory's worth of tokens at once
    data = torch.randint(0, 256, (batch, (steps + warmup) * seq + 1), device=device)
    mems, start = None, 0.0
    for step in range(steps + warmup):
        _sync(device)
        if step == warmup:
            start = time.perf_counter()
        x, y = data[:, step * seq : (step + 1) * seq], data[:, step * seq + 1 : (step + 1) * seq + 1]
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast == "bf16"):
            if model.max_mem_len:
                logits, mems = model(x, mems=mems, return_mems=True)
                mems = [m.detach() for m in mems]
            else:
                logits = model(x)
            loss = F.cross_entropy(logits.float().reshape(-1, 256), y.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        optimizer.step()
    _sync(device)
    return steps * batch * seq / (time.perf_counter() - start)


def measure(args, tgt_len: int, mem_len: int) -> dict:
    """Every variant at one (segment, memory) size, ``args.rounds`` alternating rounds; medians and ratios."""
    from longseq.eval.speed import bench_config, train_throughput
    from longseq.model import TransformerXLLM

    device = torch.device(args.device)
    torch.manual_seed(0)
    models = {name: TransformerXLLM(bench_config(mem_len, **extra)).to(device) for name, extra in LONGSEQ.items()}
    models.update({name: x_transformer(name, tgt_len, mem_len).to(device) for name in VARIANTS})
    runs = {name: [] for name in models}
    for _ in range(args.rounds):
        for name, model in models.items():
            if name in LONGSEQ:
                tps = train_throughput(model, batch=args.batch, tgt_len=tgt_len, steps=args.steps,
                                       warmup=args.warmup, autocast=args.autocast)["tokens_per_s"]  # fmt: skip
            else:
                tps = xt_throughput(model, batch=args.batch, tgt_len=tgt_len, steps=args.steps, warmup=args.warmup,
                                    autocast=args.autocast)  # fmt: skip
            runs[name].append(tps)
    median = {name: statistics.median(v) for name, v in runs.items()}
    params = {name: sum(p.numel() for p in m.parameters()) for name, m in models.items()}
    return {"tgt_len": tgt_len, "mem_len": mem_len, "tokens_per_s": median, "runs": runs, "parameters": params,
            "longseq_over": {n: median["longseq"] / v for n, v in median.items() if n not in LONGSEQ},
            "longseq_rope_over": {n: median["longseq_rope"] / v for n, v in median.items() if n not in LONGSEQ}}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--sizes", nargs="+", default=["128/128", "512/512"], help="segment/memory pairs")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--autocast", choices=["bf16"], default=None)
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args()
    import x_transformers

    report = {"command": " ".join(sys.argv), "torch": torch.__version__, "x_transformers": x_transformers.__version__
              if hasattr(x_transformers, "__version__") else _version("x-transformers"), "device": args.device,
              "gpu": torch.cuda.get_device_name() if args.device.startswith("cuda") else None, "sizes": []}  # fmt: skip
    for size in args.sizes:
        tgt_len, mem_len = (int(n) for n in size.split("/"))
        report["sizes"].append(measure(args, tgt_len, mem_len))
        for ours in LONGSEQ:
            done = report["sizes"][-1]
            ratios = ", ".join(f"{n} {r:.2f}x" for n, r in done[f"{ours}_over"].items())
            print(f"{size}: {ours} {done['tokens_per_s'][ours]:.0f} tokens/s; {ratios}", flush=True)
        if args.out:
            with open(args.out, "w") as f:
                json.dump(report, f, indent=1)


def _version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


if __name__ == "__main__":
    main()
