"""longseq against x-transformers, side by side in one process: training tokens/s with an XL memory.

    pip install ".[peers]"                                                  # x-transformers 2.31
    python benchmarks/speed/vs_x_transformers.py                          # CPU: 128/128 and 512/512, batch 8
    python benchmarks/speed/vs_x_transformers.py --device cuda --autocast bf16 --out xt.json
    python benchmarks/speed/vs_x_transformers.py --sizes 128/128 --variants longseq_rope xt_rotary_mem --threads 1
    python benchmarks/speed/vs_x_transformers.py --rss-only --out rss.json     # peak RSS, a process per variant
    python benchmarks/speed/vs_x_transformers.py --isolate --out iso.json    # every round in a process of its own

The benchmark model of the performance issue on both sides (4 layers, d_model 256, 8 heads of 32, d_inner 1024,
bytes), a training step of forward, backward, clipping at 0.25 and Adam, the memory carried and detached after each
step.  x-transformers (a peer: installed for benchmarks only) runs as ``TransformerWrapper(max_mem_len=M,
attn_layers=Decoder(...))`` with rotary positions, with T5 relative bias, and with rotary positions on its flash
path (``attn_flash=True``: ``scaled_dot_product_attention`` with a (B, H, T, K) boolean mask); and as a GPT of the
same width without memory at a context of ``tgt_len + mem_len`` (absolute positions).  Each variant runs
``--rounds`` times, alternating, after a first round that is not counted (at 512/512 it ran x-transformers'
non-flash path at half its later speed: first allocations of its (B, H, T, K) scores), and the median is reported with its ratio to longseq's default (the paper's
sinusoidal relative attention, ``attn_impl=auto``) and to ``longseq_rope``, longseq at x-transformers' settings,
per second of wall time and per second of the process's CPU time (``tokens_per_cpu_s``, ``*_over_cpu``: steadier
than wall time on a machine shared with other work, for a one-thread run).  In one process the variants share an
allocator and caches, and a variant's speed depends on which others ran beside it (on 2026-12-06 rope at 128/128
read 5,880 tokens/s beside all eight, 6,290 beside two): ``--isolate`` runs every variant's every round in a fresh
process, alternating.

Equal settings (``longseq_rope`` against ``xt_rotary_mem`` and ``xt_rotary_flash_mem``), item by item:

* **block:** pre-norm, a LayerNorm before attention and before the feed-forward and one after the last layer
  (longseq ``pre_lnorm=True, final_norm=True``; x-transformers' default); longseq's LayerNorm has a bias,
  x-transformers' has a gain only (a bias-free longseq, ``bias=False``, would also drop the feed-forward's biases);
* **feed-forward:** 256 -> 1024 -> 256 with biases and the exact (erf) GELU (longseq ``ff=gelu``; x-transformers'
  default activation); attention projections without bias on both sides (longseq one fused q/k/v matmul,
  x-transformers three);
* **rotary positions on all 32 channels of every head** (longseq ``pos=rope`` rotates them all; x-transformers'
  default ``rotary_emb_dim`` is ``dim_head // 2``, 16 of 32, so it is set to ``dim_head``), keys at their index in
  [memory; segment], rotated in float32;
* **dropout 0.1 at the same sites:** the embedding (x-transformers ``emb_dropout``), the attention output
  (``attn_sublayer_dropout``; longseq's ``dropout`` after W_o), the feed-forward's hidden layer (``ff_dropout``)
  and its output (``ff_sublayer_dropout``); longseq also drops out the last layer's output before the softmax
  (one site of 14 that x-transformers has no option for); no attention dropout on either side;
* **memory:** the previous segment's layer inputs (hidden states, ``mem_len`` of them), normalised with the
  segment under pre-norm and projected to keys and values again each step, detached; the softmax layer 256 x 256
  (longseq ties it to the embedding and adds a bias; x-transformers' is untied, bias-free).

``longseq`` (the paper's block: post-norm, ReLU, sinusoidal relative positions with u, v and W_R) is the reference
row, not an equal-settings comparison: its attention has a second (position) term and its dropout also falls on the
sinusoidal R.  ``xt_t5_mem`` is x-transformers' T5 bias with the same settings as its rotary runs.
``longseq_llama`` is the ``llama-xl`` preset's block at this width (rotary, RMSNorm, SwiGLU with ``d_inner`` 683 for
the default's parameters, 2 key/value heads of 8, QK-norm, no biases) with its memory, and ``longseq_llama_gpt`` the
same block without memory at a context of ``tgt_len + mem_len`` (tokens per second counted per token of context, as
``xt_gpt_no_mem``'s): every longseq row also reports its ratio to it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

WIDTH = dict(dim=256, depth=4, heads=8, attn_dim_head=32, ff_mult=4)
DROPOUT = dict(ff_dropout=0.1, ff_sublayer_dropout=0.1, attn_sublayer_dropout=0.1)  # emb_dropout on the wrapper
VARIANTS = {
    "xt_rotary_mem": dict(rotary_pos_emb=True, rotary_emb_dim=32),
    "xt_t5_mem": dict(rel_pos_bias=True),
    "xt_rotary_flash_mem": dict(rotary_pos_emb=True, rotary_emb_dim=32, attn_flash=True),
    "xt_gpt_no_mem": dict(attn_flash=True),
}
EQUAL = dict(pos="rope", pre_lnorm=True, final_norm=True, ff="gelu")  # x-transformers' settings (the docstring)
LLAMA = dict(  # the llama-xl preset's block at the benchmark's width (d_inner 683: the default's parameters, SwiGLU)
    pos="rope",
    pre_lnorm=True,
    final_norm=True,
    norm="rmsnorm",
    ff="swiglu",
    d_inner=683,
    bias=False,
    n_kv_head=2,
    qk_norm=True,
)
LONGSEQ = {  # longseq's side: the paper's block (the default), x-transformers' settings (rotary on SDPA), llama-xl's
    "longseq": {},
    "longseq_rope": EQUAL,
    "longseq_llama": LLAMA,
    "longseq_llama_gpt": LLAMA,  # without memory, at a context of tgt_len + mem_len
}
GPT = ("longseq_llama_gpt",)


def x_transformer(variant: str, tgt_len: int, mem_len: int):
    """An x-transformers model of the benchmark's width: memory ``mem_len`` unless it is the GPT variant."""
    from x_transformers import Decoder, TransformerWrapper

    gpt = variant == "xt_gpt_no_mem"
    decoder = Decoder(**WIDTH, **DROPOUT, **VARIANTS[variant])
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


def xt_throughput(model, *, batch: int, tgt_len: int, steps: int, warmup: int, autocast: str | None) -> tuple:
    """Training tokens per second of an x-transformers model, the loop of longseq's ``train_throughput``: per
    second of wall time and per second of this process's CPU time."""
    model.train()
    device = next(model.parameters()).device
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    seq = tgt_len * (2 if model.max_mem_len == 0 else 1)  # the GPT reads segment + memory's worth of tokens at once
    data = torch.randint(0, 256, (batch, (steps + warmup) * seq + 1), device=device)
    mems, start, cpu = None, 0.0, 0.0
    for step in range(steps + warmup):
        _sync(device)
        if step == warmup:
            start, cpu = time.perf_counter(), time.process_time()
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
    return steps * batch * seq / (time.perf_counter() - start), steps * batch * seq / (time.process_time() - cpu)


def measure(args, tgt_len: int, mem_len: int) -> dict:
    """Every variant at one (segment, memory) size, ``args.rounds`` alternating rounds; medians and ratios."""
    from longseq.eval.speed import bench_config, train_throughput
    from longseq.model import TransformerXLLM

    device = torch.device(args.device)
    torch.manual_seed(0)
    chosen = args.variants or [*LONGSEQ, *VARIANTS]
    models = {name: TransformerXLLM(bench_config(0 if name in GPT else mem_len, **LONGSEQ[name])).to(device)
              for name in chosen if name in LONGSEQ}  # fmt: skip
    models.update({name: x_transformer(name, tgt_len, mem_len).to(device) for name in chosen if name in VARIANTS})
    runs, cpu_runs = {name: [] for name in models}, {name: [] for name in models}
    for round_ in range(args.rounds + 1):  # round 0 is not counted: every variant's first large allocations and
        for name, model in models.items():  # first-touch page faults fall in it (x-transformers' (B, H, T, K) scores)
            if name in LONGSEQ:
                length = tgt_len + mem_len if name in GPT else tgt_len  # a GPT reads the memory's tokens as context
                out = train_throughput(model, batch=args.batch, tgt_len=length, steps=args.steps,
                                       warmup=args.warmup, autocast=args.autocast)  # fmt: skip
                tps, cpu_tps = out["tokens_per_s"], args.batch * length / out["cpu_s_per_step"]
            else:
                tps, cpu_tps = xt_throughput(model, batch=args.batch, tgt_len=tgt_len, steps=args.steps,
                                             warmup=args.warmup, autocast=args.autocast)  # fmt: skip
            if round_:
                runs[name].append(tps)
                cpu_runs[name].append(cpu_tps)
    params = {name: sum(p.numel() for p in m.parameters()) for name, m in models.items()}
    return summarise(tgt_len, mem_len, runs, cpu_runs, params)


def summarise(tgt_len: int, mem_len: int, runs: dict, cpu_runs: dict, params: dict) -> dict:
    """Medians of every variant's rounds and each longseq row's ratios to the peers (and to the GPT)."""
    median = {name: statistics.median(v) for name, v in runs.items()}
    cpu_median = {name: statistics.median(v) for name, v in cpu_runs.items()}
    result = {"tgt_len": tgt_len, "mem_len": mem_len, "tokens_per_s": median, "runs": runs, "parameters": params,
              "tokens_per_cpu_s": cpu_median, "cpu_runs": cpu_runs}  # fmt: skip
    for ours in (name for name in LONGSEQ if name in median and name not in GPT):
        result[f"{ours}_over"] = {n: median[ours] / v for n, v in median.items() if n not in LONGSEQ or n in GPT}
        result[f"{ours}_over_cpu"] = {n: cpu_median[ours] / v for n, v in cpu_median.items()
                                      if n not in LONGSEQ or n in GPT}  # fmt: skip
    return result


def rss_child(args) -> None:
    """``--rss-child``: one variant at one size, alone in this process; prints the peak RSS before its model was
    built (Python, torch, x-transformers) and after its steps, in MiB, and its tokens/s (wall and CPU) and
    parameters."""
    from longseq.eval.speed import peak_rss_mb

    base = peak_rss_mb()
    tgt_len, mem_len = (int(n) for n in args.sizes[0].split("/"))
    done, name = measure(args, tgt_len, mem_len), args.variants[0]
    print(json.dumps({"base_rss_mb": round(base, 1), "peak_rss_mb": round(peak_rss_mb(), 1),
                      "tokens_per_s": done["runs"][name][-1], "tokens_per_cpu_s": done["cpu_runs"][name][-1],
                      "parameters": done["parameters"][name]}))  # fmt: skip


def child(args, size: str, name: str, rounds: int) -> dict:
    """One variant at one size in a process of its own (``--rss-child``): its JSON line, or the error it ended
    with."""
    command = [sys.executable, os.path.abspath(__file__), "--rss-child", "--sizes", size, "--variants", name,
               "--rounds", str(rounds), "--steps", str(args.steps), "--warmup", str(args.warmup),
               "--batch", str(args.batch), "--device", args.device,
               *(["--autocast", args.autocast] if args.autocast else []),
               *(["--threads", str(args.threads)] if args.threads else [])]  # fmt: skip
    proc = subprocess.run(command, capture_output=True, text=True, check=False)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode or not lines:
        return {"error": (proc.stderr.strip().splitlines() or ["no output"])[-1]}
    return json.loads(lines[-1])


def measure_isolated(args, tgt_len: int, mem_len: int) -> dict:
    """``--isolate``: as :func:`measure`, but each variant's every round in a fresh process (its own first round
    not counted), the variants alternating: no model shares a process, an allocator or a cache with another."""
    chosen = args.variants or [*LONGSEQ, *VARIANTS]
    runs, cpu_runs, params = {n: [] for n in chosen}, {n: [] for n in chosen}, {}
    for round_ in range(args.rounds):
        for name in chosen:
            row = child(args, f"{tgt_len}/{mem_len}", name, 1)
            if "error" in row:
                raise SystemExit(f"{name} at {tgt_len}/{mem_len}: {row['error']}")
            runs[name].append(row["tokens_per_s"])
            cpu_runs[name].append(row["tokens_per_cpu_s"])
            params[name] = row["parameters"]
            print(f"  round {round_ + 1} {name}: {row['tokens_per_s']:.0f} tokens/s", flush=True)
    return summarise(tgt_len, mem_len, runs, cpu_runs, params)


def measure_rss(args) -> dict:
    """Peak RSS of every variant at every size, each in a process of its own (the timing runs them all in one
    process, whose peak is only the largest's): a first round and one counted round of ``--steps`` steps.
    ``step_rss_mb`` is the peak less the RSS before the model (the same imports on both sides)."""
    out = {}
    for size in args.sizes:
        for name in args.variants or [*LONGSEQ, *VARIANTS]:
            row = child(args, size, name, 1)
            if "error" not in row:
                row = {"base_rss_mb": row["base_rss_mb"], "peak_rss_mb": row["peak_rss_mb"],
                       "step_rss_mb": round(row["peak_rss_mb"] - row["base_rss_mb"], 1)}  # fmt: skip
            out.setdefault(size, {})[name] = row
            print(f"{size} {name}: {row}", flush=True)
    return out


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
    parser.add_argument("--variants", nargs="+", choices=[*LONGSEQ, *VARIANTS], help="a subset (default: all)")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--rss-only", action="store_true", help="peak RSS only, each variant in its own process")
    parser.add_argument("--rss-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--isolate", action="store_true", help="every variant's every round in a process of its own")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    import x_transformers

    if args.rss_child:
        return rss_child(args)

    report = {"command": " ".join(sys.argv), "torch": torch.__version__, "x_transformers": x_transformers.__version__
              if hasattr(x_transformers, "__version__") else _version("x-transformers"), "device": args.device,
              "threads": torch.get_num_threads(), "sizes": [],
              "gpu": torch.cuda.get_device_name() if args.device.startswith("cuda") else None}  # fmt: skip
    if args.rss_only:
        report["peak_rss"] = measure_rss(args)
        if args.out:
            with open(args.out, "w") as f:
                json.dump(report, f, indent=1)
        return
    for size in args.sizes:
        tgt_len, mem_len = (int(n) for n in size.split("/"))
        report["sizes"].append((measure_isolated if args.isolate else measure)(args, tgt_len, mem_len))
        done = report["sizes"][-1]
        for ours in (name for name in LONGSEQ if name in done["tokens_per_s"] and name not in GPT):
            ratios = ", ".join(f"{n} {r:.2f}x" for n, r in done[f"{ours}_over"].items())
            cpu = ", ".join(f"{r:.2f}x" for r in done[f"{ours}_over_cpu"].values())
            print(f"{size}: {ours} {done['tokens_per_s'][ours]:.0f} tokens/s; {ratios} (per CPU second: {cpu})")
        if args.out:
            with open(args.out, "w") as f:
                json.dump(report, f, indent=1)


def _version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


if __name__ == "__main__":
    main()
