"""The recall study: what each architecture remembers across segments, 3 seeds a row, minutes a row on 2 CPU cores.

Every row trains a small model (2 layers, d_model 64, segments of 64 tokens) on a recall task through the library's
one Trainer (the same run ``longseq train --task NAME`` makes), then reads evaluation sequences segment by segment
with the memory or state carried (:func:`longseq.eval.recall.recall_grid`: the passkey by distance, the others by
length).  Rows are run seed by seed (every row's first seed before any row's second), each row once: a finished
row's ``result.json`` is stored under ``--store`` (kept in the repository) and reused; a row stopped in training
continues from its checkpoint under ``--work`` (``last/``, saved every minute).

Usage::

    nice -n 10 python benchmarks/studies/recall.py --work runs/recall --store benchmarks/results/recall
    python benchmarks/studies/recall.py --work /tmp/recall-pilot --store /tmp/recall-pilot/store --pilot
    # issue 43's entropy chunks learn the passkey only after ~330 steps: the passkey-chunks rows at 600
    python benchmarks/studies/recall.py --work runs/recall-600 --store benchmarks/results/recall-600 \
        --tasks passkey-chunks --steps 600
    python benchmarks/studies/recall.py --store benchmarks/results/recall --plot   # heat maps of what is stored
    python benchmarks/studies/recall.py --store benchmarks/results/recall --summarize   # the page's summary.json
    # issue 43: passkey reach in bytes of learned chunks against XL and the fixed hourglass at the same mem_len
    python benchmarks/studies/recall.py --work runs/recall --store benchmarks/results/recall --tasks passkey-chunks

Recurrent layers (ssm, rnn, the hybrid) and memory tokens back-propagate through the whole training sequence
(``state_bptt``, ``mem_tokens_bptt`` = its segments); attention's memory is the paper's stop-gradient one.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, ROOT)

from longseq.config import DataConfig, ModelConfig, RunConfig, TrainConfig  # noqa: E402
from longseq.config.base import apply_values  # noqa: E402
from longseq.config.run import TaskConfig  # noqa: E402

BASE_MODEL = dict(n_layer=2, d_model=64, n_head=2, d_head=32, d_inner=128, dropout=0.0, mem_len=64)
SEGMENTS = 4  # passkey training: 4 segments of 64, distances 1 .. 254 drawn log-uniformly
RECURRENT = dict(state_bptt=SEGMENTS)

PASSKEY = {  # variant -> model settings over BASE_MODEL
    "xl-mem0": dict(mem_len=0),
    "xl-mem64": dict(mem_len=64),
    "xl-mem256": dict(mem_len=256),
    "window": dict(mem_len=256, attention=["window"], window=64),
    "mem-tokens-bptt": dict(mem_len=0, mem_tokens=8, mem_tokens_bptt=SEGMENTS),
    "compressed": dict(mem_len=64, cmem_len=64, cmem_rate=4),
    "xl-int8": dict(mem_len=64, mem_quant="int8"),
    "ssm": dict(mixer=["ssm"], **RECURRENT),
    "hybrid": dict(mem_len=64, mixer=["ssm", "attention"], **RECURRENT),
    "rnn": dict(mixer=["rnn"], **RECURRENT),
    "linear": dict(mixer=["linear"], **RECURRENT),  # restarted every 64 positions (reset_every): reach 64
    "linear-unbounded": dict(mixer=["linear"], reset_every=0, rotary=False, **RECURRENT),  # Katharopoulos's own
    "gla": dict(mixer=["gla"], **RECURRENT),
    "retention": dict(mixer=["retention"], **RECURRENT),
    "hourglass": dict(mem_len=64, n_layer=3, shorten_layers=[1, 2], shorten_factor=2),
}
LONG = 16  # issue 43's passkey: 16 segments of 64, distances 1 .. 1,022, past 4 x XL's reach at mem_len 64
CHUNKED = dict(n_layer=3, mem_len=64, shorten_layers=[1, 2], shorten_factor=4)  # the middle layer on chunks of 4
PASSKEY_CHUNKS = {  # at the same mem_len (64 slots in every attention layer): reach in bytes
    "xl-3": dict(n_layer=3, mem_len=64),
    "fixed-4": dict(**CHUNKED, coarse_mem_len=64),  # 64 groups of 4: the learned model's slots, its span
    "learned-4": dict(**CHUNKED, boundaries="learned"),
    "entropy-4": dict(**CHUNKED, boundaries="entropy"),
    "entropy-4-max16": dict(**CHUNKED, boundaries="entropy", max_chunk=16),  # BLT's bound: flat filler still cut
}
TASKS = {"passkey-chunks": "passkey"}  # a study of another task's format: the task it trains
STUDIES = {  # task -> (task options, training settings, rows, the evaluation grid)
    "passkey": (dict(seq_len=64 * SEGMENTS, key_len=1), dict(max_steps=300), PASSKEY,
                dict(distances=[16, 32, 64, 96, 128, 192, 256, 384, 512, 1024, 4096])),
    "passkey-chunks": (dict(seq_len=64 * LONG, key_len=1), dict(max_steps=300), PASSKEY_CHUNKS,
                       dict(distances=[16, 64, 128, 192, 256, 384, 512, 768, 1024, 2048, 4096])),
    "induction": (dict(seq_len=256, alphabet=16), dict(max_steps=1500),  # 300 steps: ssm at chance
                  {"ssm": dict(mixer=["ssm"], state_bptt=4), "xl-mem256": dict(mem_len=256)},
                  dict(lengths=[256, 1024, 4096, 16384, 65536])),
    "copying": (dict(seq_len=256, n_copy=16, alphabet=16), dict(max_steps=300),
                {"ssm": dict(mixer=["ssm"], state_bptt=4), "xl-mem256": dict(mem_len=256)},
                dict(lengths=[256, 1024])),
    "mqar": (dict(seq_len=64, n_pairs=4), dict(max_steps=2000, lr=3e-3),  # 300 steps at 1e-3: 0.4-0.8%
             {"attention": dict(mem_len=0), "ssm": dict(mixer=["ssm"]),
              "conv": dict(mixer=["conv"]), "linear": dict(mixer=["linear"]), "gla": dict(mixer=["gla"]),
              "retention": dict(mixer=["retention"])},
             dict(lengths=[64, 128, 256])),
}  # fmt: skip
TRAIN = dict(lr=1e-3, min_lr=1e-4, warmup_steps=20, clip=0.25, log_interval=50, save_every_s=60.0,
             progress_interval_s=60.0, device="cpu")  # fmt: skip


def run_config(task: str, variant: str, seed: int, steps: int | None) -> RunConfig:
    """The run of one row and seed: the base model, the variant's settings, the task's options."""
    options, training, rows, _ = STUDIES[task]
    train = {**TRAIN, **training, "seed": seed, **({"max_steps": steps} if steps else {})}
    train["eval_interval"] = train["max_steps"]
    sections = {"model": ModelConfig(vocab_size=256), "data": DataConfig(tokenizer="byte", tgt_len=64, batch_size=16,
                eval_batch_size=64), "train": TrainConfig(**train), "task": task_config(task)}  # fmt: skip
    return RunConfig(**apply_values(sections, list({**BASE_MODEL, **rows[variant]}.items())))


def task_config(study: str) -> TaskConfig:
    """The task a study trains, with its options (``passkey-chunks`` trains ``passkey``)."""
    return TaskConfig(name=TASKS.get(study, study), **STUDIES[study][0])


def run_row(task: str, variant: str, seed: int, work: str, steps: int | None, n_eval: int) -> dict:
    """Train (or continue) one row's seed and evaluate its best checkpoint on the task's grid."""
    from longseq.api import train
    from longseq.train.checkpoint import load_checkpoint
    from longseq.train.rundir import has_checkpoint

    out = os.path.join(work, task, variant, f"seed{seed}")
    run = run_config(task, variant, seed, steps)
    start = time.perf_counter()
    result = train(run, out, resume=has_checkpoint(out), overwrite=True, progress=False, log=lambda m: print(f"  {m}", flush=True),
                   base=RunConfig(ModelConfig(**BASE_MODEL), run.data, run.train, run.task))  # fmt: skip
    trained_s = time.perf_counter() - start
    model, _, saved, _ = load_checkpoint(os.path.join(out, "best"), device="cpu")
    grid = evaluate(model.lm, saved.task, saved.data.tgt_len, n_eval, STUDIES[task][3])
    return {"task": task, "variant": variant, "seed": seed, "settings": {**BASE_MODEL, **STUDIES[task][2][variant]},
            "task_options": STUDIES[task][0], "steps": result.step, "valid": result.valid,
            "parameters": sum(p.numel() for p in model.lm.parameters()), "train_s": round(result.elapsed_s, 1),
            "session_s": round(trained_s, 1), "eval_s": round(time.perf_counter() - start - trained_s, 1),
            "chunks": chunk_lengths(model.lm, saved), **grid}  # fmt: skip


def chunk_lengths(lm, run) -> dict | None:
    """Learned or entropy chunks: their mean length and spread over 8 validation sequences (stream 99), read in
    the training segments; with the coarse memory's reach in tokens (its slots x the mean length)."""
    from longseq.data.recall import recall_batch
    from longseq.diagnostics.chunks import read_boundaries

    if not run.model.hourglass.dynamic:
        return None
    inputs = recall_batch(run.task, 99, 0, 8, run.task.seq_len).inputs
    lengths = []
    for row in inputs:
        starts = read_boundaries(lm, row, run.data.tgt_len).nonzero().flatten().tolist()
        lengths += [b - a for a, b in zip(starts, starts[1:] + [len(row)])]
    mean = sum(lengths) / len(lengths)
    spread = (sum((n - mean) ** 2 for n in lengths) / len(lengths)) ** 0.5
    return {"mean_length": mean, "std_length": spread, "coarse_reach": mean * run.model.coarse_mem()}


def evaluate(lm, options, segment_len: int, n_eval: int, cells: dict) -> dict:
    """The task's grid: at most ``n_eval`` sequences a cell, fewer past 2^14 tokens (2^20 tokens a cell at most)."""
    from longseq.eval.recall import recall_grid

    if "distances" in cells:
        return recall_grid(lm, options, segment_len, n=n_eval, batch_size=32, **cells)
    parts = [recall_grid(lm, options, segment_len, lengths=[length], n=min(n_eval, max(16, 2**20 // length)),
                         batch_size=32) for length in cells["lengths"]]  # fmt: skip
    return {**parts[0], "n": None, "cells": [c for part in parts for c in part["cells"]]}


def stored(store: str, task: str, variant: str, seed: int) -> str:
    return os.path.join(store, task, variant, f"seed{seed}.json")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", default="runs/recall", help="run directories (checkpoints; not committed)")
    p.add_argument("--store", default=os.path.join(ROOT, "benchmarks", "results", "recall"))
    p.add_argument(
        "--tasks",
        nargs="+",
        default=[t for t in STUDIES if t not in TASKS],
        choices=list(STUDIES),
        help="default: every task in its own format (passkey-chunks only when named)",
    )
    p.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    p.add_argument("--variants", nargs="+", help="only these rows")
    p.add_argument("--pilot", action="store_true", help="4 steps a row, 4 sequences a cell: checks the plumbing")
    p.add_argument("--steps", type=int, help="train every row this many steps, not its study's (use another --store)")
    p.add_argument("--plot", action="store_true", help="draw the heat maps of the stored results and stop")
    p.add_argument("--summarize", action="store_true", help="write the store's summary.json (read by the results "
                   "page) from the stored rows and stop")  # fmt: skip
    args = p.parse_args(argv)
    if args.plot:
        return plot_store(args.store)
    if args.summarize:
        with open(os.path.join(args.store, "summary.json"), "w", encoding="utf-8") as f:
            json.dump(summarize_store(args.store), f, indent=1)
            f.write("\n")
        return print(f"wrote {os.path.join(args.store, 'summary.json')}")
    torch.set_num_threads(1)
    for seed in args.seeds:
        for task in args.tasks:
            for variant in STUDIES[task][2]:
                if args.variants and variant not in args.variants:
                    continue
                path = stored(args.store, task, variant, seed)
                if os.path.exists(path):
                    continue
                print(f"{task} {variant} seed {seed}", flush=True)
                steps = 4 if args.pilot else args.steps
                row = run_row(task, variant, seed, args.work, steps, 4 if args.pilot else 64)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path + ".tmp", "w", encoding="utf-8") as f:
                    json.dump(row, f, separators=(",", ":"))  # compact: the stores are committed
                os.replace(path + ".tmp", path)
                print(f"  {row['valid']} in {row['train_s']} s + eval {row['eval_s']} s", flush=True)


def plot_store(store: str) -> None:
    """One heat map a task: accuracy by distance (passkey) or length, a row a variant (mean over its seeds)."""
    from longseq.diagnostics.plots import plot_recall_heatmap

    for task in STUDIES:
        results = read_store(store, task)
        if results:
            print(plot_recall_heatmap(results, os.path.join(store, f"{task}.png")))


def summarize_store(store: str) -> dict:
    """The store's summary (``STORE/summary.json``, which the results page reads): for each row of a task read by
    distance (the passkey), its seeds, its reach (0 where no layer reads mem_len) and the longest distance up to
    which every distance measured is at 99% or more, mean over the seeds (None: not even the first)."""
    summary = {}
    for task in STUDIES:
        for variant, runs in read_store(store, task).items():
            if "distance" not in runs[0]["cells"][0]:
                continue
            edge = None
            for distance in sorted({c["distance"] for r in runs for c in r["cells"]}):
                values = [c["accuracy"] for r in runs for c in r["cells"] if c["distance"] == distance]
                if sum(values) / len(values) < 0.99:
                    break
                edge = distance
            row = {"seeds": len(runs), "reach": runs[0]["effective_range"], "edge": edge}
            summary.setdefault(task, {})[variant] = row
    return summary


def read_store(store: str, task: str) -> dict[str, list[dict]]:
    """The stored results of ``task``, by variant (in the study's order), each a list over seeds."""
    out = {}
    for variant in STUDIES[task][2]:
        seeds = []
        for seed in range(1, 10):
            path = stored(store, task, variant, seed)
            if os.path.exists(path):
                with open(path, encoding="utf-8") as f:
                    run = json.load(f)
                if "attention" not in run["settings"].get("mixer", ["attention"]):
                    run["effective_range"] = 0  # rows stored before recall_grid said so: no layer reads mem_len
                seeds.append(run)
        if seeds:
            out[variant] = seeds
    return out


if __name__ == "__main__":
    main()
