"""Time-series classification on UCR's ACSF1 (10 appliances, 100 training and 100 test series of 1,460 values):
a model pretrained on the training series as a language model over Chronos tokens, then fine-tuned to classify whole
series read segment by segment with the memory carried, against the archive's 1-NN baselines (test error 0.46 with
Euclidean distance, 0.36 with full-window DTW, 0.38 with a learned window).  The script also measures 1-NN Euclidean
itself on the same files (a check that the reader reads what the archive reads).

Data (never committed): the UCR files inside the aeon wheel: ``pip download --no-deps aeon`` and unzip it; the files
are ``aeon/datasets/data/ACSF1/ACSF1_{TRAIN,TEST}.ts``.  Command (resumable)::

    python benchmarks/studies/ucr_acsf1.py --train /work/data/aeon/aeon/datasets/data/ACSF1/ACSF1_TRAIN.ts \\
        --test /work/data/aeon/aeon/datasets/data/ACSF1/ACSF1_TEST.ts --out runs/acsf1 --seeds 1 2 3 \\
        --lm-steps 3000 --steps 2000 --store benchmarks/results/ucr-acsf1

Each seed: ``longseq train`` on the training series (``--bins`` uniform bins over [-15, 15], mean scaling; a series a
document), ``longseq finetune --task classify`` on the training file (``pooling=document``: every segment trains
for the label), ``longseq predict`` on the test file with the last checkpoint (no test series chooses a checkpoint).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from modality_runs import TREE, finished, longseq, machine, mean_std, table, train, write_json  # noqa: E402

ARCHIVE = {"1-NN Euclidean": 0.46, "1-NN DTW (full window)": 0.36, "1-NN DTW (learned window)": 0.38}
LM = ["doc_reset=true", "n_layer=4", "d_model=128", "n_head=4", "d_head=32", "d_inner=512", "tgt_len=128",
      "eval_tgt_len=128", "mem_len=128", "batch_size=16", "eval_batch_size=16", "dropout=0.1", "lr=0.001",
      "eval_interval=500"]  # fmt: skip


def series(path: str) -> tuple[np.ndarray, list[str]]:
    sys.path.insert(0, TREE)
    from longseq.data.readers.ucr import ucr_records

    records = [r for _, r in ucr_records(path)]
    return np.asarray([[float(v) for v in r["text"].split()] for r in records]), [r["label"] for r in records]


def one_nn_euclidean(train: str, test: str) -> float:
    """The test error of 1-NN with Euclidean distance."""
    x, y = series(train)
    q, truth = series(test)
    distances = ((q[:, None, :] - x[None, :, :]) ** 2).sum(axis=-1)  # (test, train)
    predicted = [y[i] for i in distances.argmin(axis=1)]
    return float(np.mean([p != t for p, t in zip(predicted, truth)]))


def run_one(args, seed: int) -> dict:
    out = os.path.join(args.out, f"seed{seed}")
    stored = os.path.join(args.store, f"seed{seed}", "result.json") if args.store else None
    result = finished(os.path.join(out, "result.json")) or (finished(stored) if stored else None)
    if result:
        return result
    os.makedirs(out, exist_ok=True)
    bins = os.path.join(out, "chronos.json")
    with open(bins, "w", encoding="utf-8") as f:
        json.dump({"kind": "chronos", "n_tokens": args.bins + 3, "low": -15.0, "high": 15.0}, f)
    lm = train(os.path.join(out, "lm"), args.train, [f"tokenizer={bins}", *LM, f"seed={seed}",
                                                     f"max_steps={args.lm_steps}", *args.set])  # fmt: skip
    clf_dir = os.path.join(out, "classify")
    flags = ["--resume"] if os.path.isfile(os.path.join(clf_dir, "last", "config.json")) else [
        "--task", "classify", "--checkpoint", os.path.join(out, "lm"), "--data", args.train, "--steps",
        str(args.steps), "--segment-len", "128", "--batch-size", "8", "--pooling", "document", "--seed", str(seed)]  # fmt: skip
    tuned = longseq(["finetune", "--out", clf_dir, "--quiet", *flags])
    predicted = longseq(["predict", "--checkpoint", os.path.join(clf_dir, "last"), "--data", args.test, "--out",
                         os.path.join(out, "test-predictions.jsonl"), "--quiet"])  # fmt: skip
    result = {"seed": seed, "lm": lm, "classify": tuned, "test": predicted, "error": 1 - predicted["accuracy"],
              "bins": args.bins, "lm_steps": args.lm_steps, "steps": args.steps, "machine": machine()}  # fmt: skip
    write_json(os.path.join(out, "result.json"), result)
    if stored:
        write_json(stored, result)
    return result


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--train", required=True)
    p.add_argument("--test", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--store")
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--bins", type=int, default=256, help="uniform bins over [-15, 15] (Chronos: 4,093)")
    p.add_argument("--lm-steps", type=int, default=3000)
    p.add_argument("--steps", type=int, default=2000, help="fine-tuning steps")
    p.add_argument("--set", nargs="*", default=[], help="overrides of the language model's run, KEY=VALUE")
    args = p.parse_args(argv)
    euclid = one_nn_euclidean(args.train, args.test)
    runs = [run_one(args, seed) for seed in args.seeds]
    mean, std = mean_std([r["error"] for r in runs])
    rows = [["longseq (LM + classify, memory carried)", len(runs), mean, std]]
    rows += [["1-NN Euclidean, measured here", "-", euclid, "-"]] + [
        [k + ", archive", "-", v, "-"] for k, v in ARCHIVE.items()
    ]
    text = table(["model", "seeds", "test error", "std"], rows)
    summary = {"runs": runs, "one_nn_euclidean": euclid, "archive": ARCHIVE}
    if args.store:
        write_json(os.path.join(args.store, "summary.json"), summary)
        with open(os.path.join(args.store, "summary.md"), "w", encoding="utf-8") as f:
            f.write(text)
    print(text)


if __name__ == "__main__":
    main()
