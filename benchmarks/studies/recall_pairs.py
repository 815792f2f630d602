"""MQAR against the number of key-value pairs at a fixed state size (Zoology's comparison, Arora et al. 2023):
attention beside the linear-attention family and the ssm, 3 seeds a point, minutes a point on one CPU thread.

Every model is a 3-layer stack ``[conv, X, X]`` (d_model 64, pre-norm, untied output): a short gated convolution
first, then two layers of the mixer ``X`` (Zoology's later layout, a BaseConv layer before the mixer, as in its
Based experiments).  The convolution puts each key beside its value, which a stack of attention alone learns only
after thousands of steps (a two-layer attention stack sat at the 1/n_pairs plateau for 30,000 steps here:
``benchmarks/results/recall/README.md``); with it, attention solves MQAR in a few hundred steps and what is left to
compare is the mixer's memory.  The linear-attention layers keep 2 heads x 32 x 32 = 2,048 numbers of state a
layer, the ssm 16 x 128 = 2,048 (d_state x expand * d_model); attention keeps every position.

A point trains ``n_pairs`` pairs in sequences of 4 tokens a pair (Zoology's proportion; at least 64), read as one
segment (``tgt_len`` = the sequence: attention sees it all), 4,096 tokens a step, the queries placed uniformly
after the pairs; it reports the validation accuracy of its last step on 256 held-out sequences (chance: 1/n_pairs,
a guess among the context's values).  2,000 steps, about 2-2.5 minutes of one CPU thread a point.  Points are run seed by seed, each once: a finished
point's JSON is stored under ``--store`` and reused.

Usage::

    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/studies/recall_pairs.py --work /tmp/pairs \\
        --store benchmarks/results/recall-linear
    python benchmarks/studies/recall_pairs.py --store benchmarks/results/recall-linear --plot
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, ROOT)

from longseq.config import DataConfig, ModelConfig, RunConfig, TrainConfig  # noqa: E402
from longseq.config.base import apply_values  # noqa: E402
from longseq.config.run import TaskConfig  # noqa: E402

PAIRS = [8, 16, 32]  # 4 and 64 on request (--pairs): 64 in 256 tokens is not learned in 800 steps
TOKENS = 4096  # a step: sequences of seq_len(pairs) tokens, TOKENS // seq_len of them (Zoology's constant tokens)


def seq_len(pairs: int) -> int:
    """Zoology's sequence for ``pairs`` pairs (4 tokens a pair: 2 in the context, 2 for its query), at least 64."""
    return max(64, 4 * pairs)


MODEL = dict(n_layer=3, d_model=64, n_head=2, d_head=32, d_inner=128, dropout=0.0, mem_len=0, pre_lnorm=True,
             tie_weight=False)  # fmt: skip
STACK = lambda mixer: ["conv", mixer, mixer]  # noqa: E731
ROWS = {  # row -> model settings over MODEL
    "attention": dict(mixer=STACK("attention")),
    "linear": dict(mixer=STACK("linear")),  # restarted every 64 positions, rotated (the library's defaults)
    "linear-unbounded": dict(mixer=STACK("linear"), reset_every=0, rotary=False),  # Katharopoulos's, as published
    "gla": dict(mixer=STACK("gla")),
    "retention": dict(mixer=STACK("retention")),
    "ssm": dict(mixer=STACK("ssm")),
}
TRAIN = dict(max_steps=2000, lr=3e-3, min_lr=3e-4, warmup_steps=50, clip=1.0, log_interval=100, save_every_s=60.0,
             progress_interval_s=60.0, device="cpu")  # fmt: skip


def run_config(row: str, pairs: int, seed: int, steps: int | None) -> RunConfig:
    """The run of one point: the model, the row's settings, MQAR with ``pairs`` pairs in ``seq_len(pairs)`` tokens."""
    train = {**TRAIN, "seed": seed, **({"max_steps": steps} if steps else {})}
    train["eval_interval"] = max(1, train["max_steps"] // 5)
    n = seq_len(pairs)
    sections = {"model": ModelConfig(vocab_size=256),
                "data": DataConfig(tokenizer="byte", tgt_len=n, batch_size=TOKENS // n, eval_batch_size=64),
                "train": TrainConfig(**train), "task": TaskConfig(name="mqar", seq_len=n, n_pairs=pairs)}  # fmt: skip
    return RunConfig(**apply_values(sections, list({**MODEL, **ROWS[row]}.items())))


def run_point(row: str, pairs: int, seed: int, work: str, steps: int | None) -> dict:
    """Train (or continue) one point and read its last validation."""
    from longseq.api import train
    from longseq.train.rundir import has_checkpoint

    out = os.path.join(work, row, f"pairs{pairs}", f"seed{seed}")
    run = run_config(row, pairs, seed, steps)
    start, cpu = time.perf_counter(), time.process_time()
    base = RunConfig(ModelConfig(**MODEL), run.data, run.train, run.task)
    result = train(run, out, resume=has_checkpoint(out), overwrite=True, progress=False, base=base,
                   log=lambda m: print(f"  {m}", flush=True))  # fmt: skip
    with open(os.path.join(out, "metrics.jsonl"), encoding="utf-8") as f:
        curve = [json.loads(line) for line in f]
    curve = [{"step": r["step"], "accuracy": r["valid_accuracy"], "loss": r["valid_loss"]} for r in curve
             if "valid_accuracy" in r]  # fmt: skip
    return {"row": row, "n_pairs": pairs, "seed": seed, "seq_len": run.task.seq_len, "settings": {**MODEL, **ROWS[row]},
            "train": {**TRAIN, "batch_size": run.data.batch_size}, "steps": result.step, "accuracy": result.valid["accuracy"],
            "loss": result.valid["loss"], "chance": result.valid["chance"], "curve": curve,
            "parameters": parameters(run), "train_s": round(result.elapsed_s, 1),
            "session_s": round(time.perf_counter() - start, 1), "cpu_s": round(time.process_time() - cpu, 1)}  # fmt: skip


def parameters(run: RunConfig) -> int:
    from longseq.model import build_model

    return sum(p.numel() for p in build_model(run.model).parameters())


def stored(store: str, row: str, pairs: int, seed: int) -> str:
    return os.path.join(store, row, f"pairs{pairs}-seed{seed}.json")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", default="runs/recall-pairs", help="run directories (checkpoints; not committed)")
    p.add_argument("--store", default=os.path.join(ROOT, "benchmarks", "results", "recall-linear"))
    p.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    p.add_argument("--rows", nargs="+", choices=list(ROWS), default=list(ROWS))
    p.add_argument("--pairs", nargs="+", type=int, default=PAIRS)
    p.add_argument("--steps", type=int, help=f"steps a point (default {TRAIN['max_steps']})")
    p.add_argument("--pilot", action="store_true", help="4 steps a point: checks the plumbing")
    p.add_argument("--plot", action="store_true", help="draw the figure and the table of what is stored, and stop")
    args = p.parse_args(argv)
    if args.plot:
        return plot_store(args.store)
    torch.set_num_threads(1)
    for seed in args.seeds:
        for pairs in args.pairs:
            for row in args.rows:
                path = stored(args.store, row, pairs, seed)
                if os.path.exists(path):
                    continue
                print(f"mqar {row} pairs {pairs} seed {seed}", flush=True)
                point = run_point(row, pairs, seed, args.work, 4 if args.pilot else args.steps)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path + ".tmp", "w", encoding="utf-8") as f:
                    json.dump(point, f, separators=(",", ":"))  # compact: the stores are committed
                os.replace(path + ".tmp", path)
                print(
                    f"  accuracy {point['accuracy']:.3f} in {point['train_s']} s ({point['cpu_s']} s CPU)", flush=True
                )


def read_store(store: str) -> dict[str, dict[int, list[dict]]]:
    """The stored points: row -> pairs -> the seeds' results."""
    out: dict[str, dict[int, list[dict]]] = {}
    for row in ROWS:
        names = sorted(os.listdir(os.path.join(store, row))) if os.path.isdir(os.path.join(store, row)) else []
        for name in names:
            if name.endswith(".json"):
                with open(os.path.join(store, row, name), encoding="utf-8") as f:
                    point = json.load(f)
                out.setdefault(row, {}).setdefault(point["n_pairs"], []).append(point)
    return out


def summary(points: dict[str, dict[int, list[dict]]]) -> dict:
    """Mean and standard deviation (over seeds, ddof 1) of the accuracy, by row and pairs."""
    out = {}
    for row, by_pairs in points.items():
        for pairs, seeds in sorted(by_pairs.items()):
            acc = torch.tensor([s["accuracy"] for s in seeds], dtype=torch.float64)
            std = float(acc.std()) if len(seeds) > 1 else 0.0
            out.setdefault(row, {})[pairs] = {"mean": float(acc.mean()), "std": std, "seeds": len(seeds),
                                              "cpu_s": round(sum(s["cpu_s"] for s in seeds) / len(seeds), 1)}  # fmt: skip
    return out


def plot_store(store: str) -> None:
    """``mqar-pairs.png`` (accuracy against pairs, a line a row, the seeds' spread as error bars), ``summary.json``
    and the table printed in Markdown."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    table = summary(read_store(store))
    present = sorted({p for by_pairs in table.values() for p in by_pairs})
    with open(os.path.join(store, "summary.json"), "w", encoding="utf-8") as f:
        json.dump({"seq_len": {p: seq_len(p) for p in present}, "tokens_a_step": TOKENS, "model": MODEL,
                   "rows": table}, f, indent=1)  # fmt: skip
    fig, ax = plt.subplots(figsize=(6, 4))
    points = read_store(store)
    for i, (row, by_pairs) in enumerate(points.items()):  # a seed that stays on MQAR's plateau makes a row
        xs = sorted(by_pairs)  # bimodal, so the line is the median and every seed is a dot beside it
        accuracies = [[100 * s["accuracy"] for s in by_pairs[x]] for x in xs]
        line = ax.plot(xs, [statistics.median(a) for a in accuracies], marker="o", label=row)[0]
        for x, a in zip(xs, accuracies):
            ax.scatter([x * 1.03 ** (i - 2.5)] * len(a), a, s=12, color=line.get_color(), alpha=0.5)
    ax.plot(present, [100 / p for p in present], "k:", label="chance (1/pairs)")
    ax.set(xscale="log", xlabel="key-value pairs (sequence: 4 tokens a pair, >= 64)", ylabel="MQAR accuracy (%)",
           ylim=(-2, 102), title="MQAR at d_model 64, [conv, X, X] (median; dots: seeds)")  # fmt: skip
    ax.set_xticks(present, [str(p) for p in present])
    ax.minorticks_off()
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(store, "mqar-pairs.png"), dpi=120)
    print("| row | " + " | ".join(f"{p} pairs ({seq_len(p)} tokens)" for p in present) + " |")
    print("|-|" + "-:|" * len(present))
    for row, by_pairs in table.items():
        cells = [f"{100 * c['mean']:.1f} ± {100 * c['std']:.1f} ({c['seeds']})" if (c := by_pairs.get(p)) else ""
                 for p in present]  # fmt: skip
        print(f"| {row} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
