"""Does a longer evaluation memory help a trained XL model once relative distances are clamped?

The issue's second target asks that a model evaluated with twice its training memory score better than with its
training memory.  ``runner.py`` measures the plain curve (``same_length``, no clamping).  This script
scores finished ``runner.py`` checkpoints again on the test split with three readings of "more memory":

* ``same_length`` contexts, distances unclamped: what ``runner.py`` reports;
* the same contexts with distances clamped at the longest distance seen in training (``tgt_len + mem_len``), as
  the paper does when it evaluates with long memories (its ``clamp_len``);
* without ``same_length``: memory 128 against 256, each token also seeing the earlier part of its segment.

Figures are bits per character (or per word) over the test split after ``--skip-segments`` segments.

Usage::

    python benchmarks/studies/context_clamp.py --runs runs/compaction/xl --seeds 1 2 --json
"""

from __future__ import annotations

import argparse
import json
import math
import os

from runner import CORPORA, DATA_ENV, load_named_corpus

from longseq.eval.context import context_curve
from longseq.train import load_checkpoint


def bits(curve: dict) -> list[float]:
    return [loss / math.log(2) for loss in curve["loss"]]


def score(checkpoint: str, corpus, contexts: list[int], skip: int) -> dict:
    model, _, run, _ = load_checkpoint(checkpoint)
    common = dict(tgt_len=run.data.eval_tgt_len, batch_size=run.data.eval_batch_size, skip_segments=skip)
    clamp = run.data.tgt_len + run.model.memory.mem_len  # the longest distance a training query saw
    train_mem = run.model.memory.mem_len
    return {
        "checkpoint": checkpoint,
        "train_mem_len": train_mem,
        "contexts": contexts,
        "same_length": bits(context_curve(model, corpus.test, contexts, **common)),
        "clamp_len": clamp,
        "same_length_clamped": bits(
            context_curve(
                model,
                corpus.test,
                contexts,
                recurrence=model.config.recurrence(clamp_len=clamp, same_length=True),
                **common,
            )
        ),
        "memory": [train_mem, 2 * train_mem],
        "not_same_length": bits(
            context_curve(
                model,
                corpus.test,
                [train_mem, 2 * train_mem],
                recurrence=model.config.recurrence(same_length=False),
                **common,
            )
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", required=True, help="a runner.py variant folder, holding seedS/last")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--corpus", default="ptb-char", choices=sorted(CORPORA))
    parser.add_argument("--contexts", type=int, nargs="+", default=[128, 192, 256, 384])
    parser.add_argument("--skip-segments", type=int, default=8)
    parser.add_argument("--data-root", help=f"the folder holding ptb/ and wikitext-2/ (default: ${DATA_ENV})")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    corpus = load_named_corpus(args.corpus, args.data_root)
    rows = []
    for seed in args.seeds:
        checkpoint = os.path.join(args.runs, f"seed{seed}", "last")
        if not os.path.isdir(checkpoint):
            raise SystemExit(f"{checkpoint} does not exist: train it with runner.py first")
        rows.append({"seed": seed, **score(checkpoint, corpus, args.contexts, args.skip_segments)})
        if not args.json:
            print(json.dumps(rows[-1]), flush=True)
    if args.json:
        print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
