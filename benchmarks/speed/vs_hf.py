"""longseq against Hugging Face TransfoXL (transformers 4.46.3, shimmed), side by side, as ratios.

Each measurement runs in a fresh worker process (so peak RSS is per implementation); longseq and HF
alternate, ``--rounds`` times, and the median of each is reported.  Both models hold the same weights.

Tasks (the performance issue's model: 4 layers, d_model 256, 8 heads x 32, d_inner 1024, bytes, Adam, clip 0.25):

* ``train``: tokens/s at tgt_len/mem_len 128/128 and 512/512, batch 8, and peak RSS;
* ``eval``: ms per token at mem_len 1600 and 3800 (tgt_len 128, batch 1), memory full;
* ``generate``: new tokens/s for 256 greedy tokens after a 2,000-token prompt, mem_len 1600 (HF: ``generate``);
* ``scaling``: training ms per token as tgt_len + mem_len grows from 256 to 4096 (tgt_len = mem_len, batch 1).

``--longseq llama`` runs longseq's side with the ``llama-xl`` block at this width (``LLAMA`` of
``vs_x_transformers.py``: rope, RMSNorm, SwiGLU, 2 key/value heads of 8, QK-norm, no biases; its own weights, the
default's parameter count) against the same HF TransfoXL.

Usage::

    python benchmarks/speed/vs_hf.py train eval generate scaling [--rounds 3] [--json]
    python benchmarks/speed/vs_hf.py eval generate --longseq llama
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def _setup(job: dict):
    import torch

    sys.path.insert(0, HERE)
    from peers import hf_twin

    from longseq.eval.speed import bench_config
    from longseq.model import TransformerXLLM

    torch.manual_seed(0)
    ours = TransformerXLLM(bench_config(job["mem_len"]))
    if job["impl"] == "longseq":
        if job.get("longseq") == "llama":  # the llama-xl block at this width; HF keeps the paper's block
            from vs_x_transformers import LLAMA

            return TransformerXLLM(bench_config(job["mem_len"], **LLAMA))
        return ours
    hf = hf_twin(ours)
    hf.reset_memory_length(job["mem_len"])
    return hf


def _hf_train(hf, batch: int, tgt_len: int, steps: int, warmup: int = 1) -> dict:
    import torch

    from longseq.eval.speed import peak_rss_mb

    hf.train()
    optimizer = torch.optim.Adam(hf.parameters(), lr=1e-4)
    data = torch.randint(0, 256, (batch, (steps + warmup) * tgt_len))
    mems = None
    start = 0.0
    for step in range(steps + warmup):
        if step == warmup:
            start = time.perf_counter()
        x = data[:, step * tgt_len : (step + 1) * tgt_len]
        out = hf(x, mems=mems, labels=x)  # HF shifts the labels inside
        optimizer.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(hf.parameters(), 0.25)
        optimizer.step()
        mems = out.mems
    elapsed = time.perf_counter() - start
    return {
        "tokens_per_s": steps * batch * tgt_len / elapsed,
        "step_ms": 1000 * elapsed / steps,
        "peak_rss_mb": peak_rss_mb(),
    }


def _hf_eval(hf, batch: int, tgt_len: int, mem_len: int, segments: int) -> dict:
    import torch

    from longseq.eval.speed import peak_rss_mb

    hf.eval()
    fill = -(-mem_len // tgt_len)
    data = torch.randint(0, 256, (batch, (fill + segments) * tgt_len))
    mems = None
    start = 0.0
    with torch.no_grad():
        for s in range(fill + segments):
            if s == fill:
                start = time.perf_counter()
            x = data[:, s * tgt_len : (s + 1) * tgt_len]
            mems = hf(x, mems=mems, labels=x).mems
    elapsed = time.perf_counter() - start
    return {"ms_per_token": 1000 * elapsed / (segments * batch * tgt_len), "peak_rss_mb": peak_rss_mb()}


def _hf_generate(hf, prompt_len: int, new_tokens: int) -> dict:
    import torch

    from longseq.eval.speed import peak_rss_mb

    hf.eval()
    prompt = torch.randint(0, 256, (1, prompt_len))
    start = time.perf_counter()
    with torch.no_grad():
        hf.generate(prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    elapsed = time.perf_counter() - start
    return {"tokens_per_s": new_tokens / elapsed, "seconds": elapsed, "peak_rss_mb": peak_rss_mb()}


def worker(job: dict) -> dict:
    from longseq.eval import speed

    model = _setup(job)
    task, impl = job["task"], job["impl"]
    if task == "train":
        if impl == "longseq":
            return speed.train_throughput(model, batch=job["batch"], tgt_len=job["tgt_len"], steps=job["steps"])
        return _hf_train(model, job["batch"], job["tgt_len"], job["steps"])
    if task == "eval":
        if impl == "longseq":
            return speed.eval_per_token(
                model, batch=job["batch"], tgt_len=job["tgt_len"], mem_len=job["mem_len"], segments=job["steps"]
            )
        return _hf_eval(model, job["batch"], job["tgt_len"], job["mem_len"], job["steps"])
    if impl == "longseq":
        return speed.generate_speed(
            model, prompt_len=job["prompt_len"], new_tokens=job["new_tokens"], mem_len=job["mem_len"]
        )
    return _hf_generate(model, job["prompt_len"], job["new_tokens"])


def jobs_for(task: str) -> list[dict]:
    if task == "train":
        return [
            dict(task="train", tgt_len=t, mem_len=m, batch=8, steps=s) for t, m, s in [(128, 128, 4), (512, 512, 2)]
        ]
    if task == "eval":
        return [dict(task="eval", tgt_len=128, mem_len=m, batch=1, steps=3) for m in (1600, 3800)]
    if task == "generate":
        return [dict(task="generate", tgt_len=128, mem_len=1600, prompt_len=2000, new_tokens=256)]
    if task == "scaling":
        return [
            dict(task="train", tgt_len=n // 2, mem_len=n // 2, batch=1, steps=1, scaling=True)
            for n in (256, 512, 1024, 2048, 4096)
        ]
    raise SystemExit(f"unknown task {task!r}")


def run(job: dict) -> dict:
    proc = subprocess.run(
        [sys.executable, __file__, "--worker", json.dumps(job)], capture_output=True, text=True, check=False
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"error": (proc.stderr.strip().splitlines() or ["no output"])[-1]}
    return json.loads(lines[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("tasks", nargs="*", default=["train", "eval", "generate", "scaling"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--longseq", choices=["default", "llama"], default="default", help="longseq's block")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return
    import torch

    rows = []
    for task in args.tasks:
        for job in jobs_for(task):
            results: dict[str, list[dict]] = {"longseq": [], "hf": []}
            for _ in range(args.rounds):
                for impl in ("longseq", "hf"):
                    results[impl].append(run({**job, "impl": impl, "longseq": args.longseq}))
            row = {k: v for k, v in job.items() if k != "steps"}
            for impl, runs in results.items():
                good = [r for r in runs if "error" not in r]
                if not good:
                    row[f"{impl}_error"] = runs[-1]["error"]
                    continue
                for key in good[0]:
                    row[f"{impl}_{key}"] = statistics.median(r[key] for r in good)
            if "longseq_tokens_per_s" in row and "hf_tokens_per_s" in row:
                row["speedup"] = row["longseq_tokens_per_s"] / row["hf_tokens_per_s"]
            if "longseq_ms_per_token" in row and "hf_ms_per_token" in row:
                row["time_ratio"] = row["longseq_ms_per_token"] / row["hf_ms_per_token"]
            if "longseq_peak_rss_mb" in row and "hf_peak_rss_mb" in row:
                row["rss_ratio"] = row["longseq_peak_rss_mb"] / row["hf_peak_rss_mb"]
            rows.append(row)
            if not args.json:
                print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
    meta = {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpu": platform.processor() or platform.machine(),
        "rounds": args.rounds,
        "longseq": args.longseq,
    }
    if args.json:
        print(json.dumps({"meta": meta, "rows": rows}))
    else:
        print(f"# {meta}")


if __name__ == "__main__":
    main()
