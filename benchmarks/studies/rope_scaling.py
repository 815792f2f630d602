"""Does RoPE's position scaling rescue a longer memory at evaluation?

A rope model trained with memory 128 breaks when it is evaluated with memory 256 or 512 (the positions study,
``benchmarks/results/positions-ptb-char-3000``: its keys sit at distances it never saw).  This script scores a
finished ``runner.py`` checkpoint again on the test split with ``rope_scaling`` set, no training: ``linear``
(positions divided by the factor: position interpolation, Chen et al. 2023) and ``ntk`` (the base raised by
factor^(D/(D-2)): NTK-aware scaling), each by 2 and 4, at evaluation memories 128, 256 and 512 (``same_length``,
as ``runner.py``'s context curve).  Bits per character over the test split after ``--skip-segments`` segments.

Usage::

    OMP_NUM_THREADS=1 python benchmarks/studies/rope_scaling.py --runs runs/positions/rope --seeds 1 2 \\
        --out benchmarks/results/positions-ptb-char-3000/rope-scaling.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

from runner import CORPORA, DATA_ENV, load_named_corpus

from longseq import TransformerXLLM
from longseq.config import ModelConfig
from longseq.eval.context import context_curve
from longseq.train import load_checkpoint

SETTINGS = [("none", 1.0), ("linear", 2.0), ("linear", 4.0), ("ntk", 2.0), ("ntk", 4.0)]


def scaled(model, run, scaling: str, factor: float):
    """``model`` rebuilt with ``rope_scaling`` by ``factor`` and the same weights (rope has none of its own)."""
    config = run.model.to_dict()
    if config["positions"]["pos"] != "rope":
        raise SystemExit(f"a pos={config['positions']['pos']} model: rope scaling applies to pos=rope")
    config["positions"].update(rope_scaling=scaling, rope_factor=factor)
    copy = TransformerXLLM(ModelConfig.from_dict(config))
    copy.load_state_dict(model.state_dict())
    return copy.eval()


def score(checkpoint: str, corpus, contexts: list[int], skip: int) -> list[dict]:
    model, _, run, _ = load_checkpoint(checkpoint)
    common = dict(tgt_len=run.data.eval_tgt_len, batch_size=run.data.eval_batch_size, skip_segments=skip)
    rows = []
    for scaling, factor in SETTINGS:
        curve = context_curve(scaled(model, run, scaling, factor), corpus.test, contexts, **common)
        bpc = [loss / math.log(2) for loss in curve["loss"]]
        rows.append({"rope_scaling": scaling, "rope_factor": factor, "bpc": bpc})
        print(f"{checkpoint} {scaling} x{factor:g}: " + ", ".join(f"{c} {b:.4f}" for c, b in zip(contexts, bpc)))
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", required=True, help="a runner.py rope variant folder, holding seedS/last")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--corpus", default="ptb-char", choices=sorted(CORPORA))
    parser.add_argument("--contexts", type=int, nargs="+", default=[128, 256, 512])
    parser.add_argument("--skip-segments", type=int, default=8)
    parser.add_argument("--data-root", help=f"the folder holding ptb/ and wikitext-2/ (default: ${DATA_ENV})")
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args(argv)
    corpus = load_named_corpus(args.corpus, args.data_root)
    result = {"command": " ".join(["python", *sys.argv]), "contexts": args.contexts, "seeds": {}}
    for seed in args.seeds:
        checkpoint = os.path.join(args.runs, f"seed{seed}", "last")
        if not os.path.isdir(checkpoint):
            raise SystemExit(f"{checkpoint} does not exist: train it with runner.py first")
        result["seeds"][seed] = score(checkpoint, corpus, args.contexts, args.skip_segments)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
