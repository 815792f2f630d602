"""Molecules on the MOSES benchmark (Polykovskiy et al., 2020): train a SMILES model, sample N molecules, score them
with MOSES' own metric code (validity, unique@1k and @10k, novelty, FCD/Test), beside MOSES' CharRNN.

Data (never committed, never downloaded by code): the ``molsets`` wheel holds the benchmark's split.  Get it with
``pip download --no-deps molsets`` (and ``pip install --no-deps molsets fcd_torch rdkit``: MOSES pins a dependency
that does not install on Python 3.11; its metric code needs rdkit, fcd_torch, pandas, scipy).  Steps, each
resumable (a finished step's file is reused)::

    # 1. the split as .smi files: train (MOSES train less its last 10,000), valid (those 10,000), test (MOSES test)
    python benchmarks/studies/smiles_moses.py prepare --wheel /work/data/wheels/molsets-0.3.1-py3-none-any.whl \\
        --out /work/data/moses
    # 2. train (any longseq run; the study's settings are in benchmarks/results/moses/README.md), 3 seeds
    python -m longseq train --data /work/data/moses --out runs/moses/xl-seed1 --set tokenizer=smiles doc_reset=true \\
        seed=1 ... --resume
    # SELFIES instead: prepare --selfies --out /work/data/moses-selfies, train on it, score --selfies --data (SMILES)
    # 3. sample 30,000 molecules and score them (MOSES' code, its test set as the FCD reference)
    python benchmarks/studies/smiles_moses.py score --checkpoint runs/moses/xl-seed1 --data /work/data/moses \\
        --samples 30000 --out benchmarks/results/moses/xl-seed1.json

Sampling runs ``--batch`` streams from a line start, each drawing molecules one after another (with ``doc_reset``
each is read alone); a stream's molecules are its lines, and the last unfinished one is dropped.  A molecule
longer than ``--max-len`` tokens is cut and counted invalid.  The reference sets (train for novelty, test for FCD)
must hold valid SMILES only: one that RDKit cannot read is refused with its file and line.  Only MOSES functions
that read no pickle are called (its precomputed test statistics and the SA score are pickles; the FCD reference is
computed from the test SMILES instead).
"""

from __future__ import annotations

import argparse
import csv
import gzip
import io
import json
import os
import sys
import time
import types
import zipfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # this tree's longseq

CHAR_RNN = {"valid": 0.9748, "unique@1k": 1.0, "unique@10k": 0.9994, "novelty": 0.8419, "FCD/Test": 0.0732}
VALID_SIZE = 10_000


def read_split(wheel: str, split: str) -> list[str]:
    """The SMILES of a MOSES split (train, test, test_scaffolds) from the molsets wheel."""
    with zipfile.ZipFile(wheel) as z, z.open(f"moses/dataset/data/{split}.csv.gz") as raw:
        rows = csv.reader(io.TextIOWrapper(gzip.GzipFile(fileobj=raw), encoding="utf-8"))
        header = next(rows)
        column = header.index("SMILES")
        return [row[column] for row in rows]


def prepare(args) -> dict:
    os.makedirs(args.out, exist_ok=True)
    train = read_split(args.wheel, "train")
    parts = {"train": train[:-VALID_SIZE], "valid": train[-VALID_SIZE:], "test": read_split(args.wheel, "test")}
    if args.selfies:  # the same molecules as SELFIES strings (Krenn et al., 2020): every string decodes to a molecule
        import selfies

        parts = {split: [selfies.encoder(m) for m in molecules] for split, molecules in parts.items()}
    for split, molecules in parts.items():
        path = os.path.join(args.out, f"{split}.smi")
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.writelines(m + "\n" for m in molecules)
        os.replace(tmp, path)
    return {split: len(molecules) for split, molecules in parts.items()}


def read_smi(path: str, limit: int = 0) -> list[str]:
    with open(path, encoding="utf-8") as f:
        molecules = [line.split()[0] for line in f if line.strip()]
    return molecules[:limit] if limit else molecules


def check_valid(molecules: list[str], path: str) -> None:
    """Every reference molecule RDKit reads, or a ValueError naming the file and the line."""
    from rdkit import Chem, RDLogger

    RDLogger.DisableLog("rdApp.*")
    for number, smiles in enumerate(molecules, 1):
        if Chem.MolFromSmiles(smiles) is None:
            raise ValueError(f"{path}, line {number}: {smiles!r} is not a valid SMILES (RDKit cannot read it)")


def sample(checkpoint: str, n: int, batch: int, max_len: int, seed: int, temperature: float) -> list[str]:
    """``n`` molecules drawn from ``checkpoint``, ``batch`` streams at a time (see the module docstring)."""
    import torch

    from longseq.generation import generate_stream
    from longseq.train.checkpoint import load_checkpoint, resolve_checkpoint

    model, tokenizer, run, _ = load_checkpoint(resolve_checkpoint(checkpoint, lambda _: None))
    start = tokenizer.encode_prompt(tokenizer.start_text)
    generator = torch.Generator().manual_seed(seed)
    prompt = torch.as_tensor(start)[None].repeat(batch, 1)
    molecules: list[str] = []
    while len(molecules) < n:  # rounds of 8 x max_len tokens a stream, each from a fresh line start
        rows = torch.cat(list(generate_stream(model, prompt, 8 * max_len, temperature=temperature,
                                              recurrence=run.model.recurrence(), segment_len=run.data.tgt_len,
                                              generator=generator)), dim=1)  # fmt: skip
        for row in rows.tolist():
            lines = tokenizer.decode(row).split("\n")[:-1]  # the last line is unfinished
            molecules.extend(line if len(tokenizer.encode(line)) <= max_len else "" for line in lines)
    return molecules[:n]


def _decoded(selfies, string: str) -> str:
    try:
        return selfies.decoder(string) or ""
    except selfies.DecoderError:
        return ""


def moses_compat() -> None:
    """Two shims for MOSES 0.3.1 (2020) on today's libraries, neither touching a metric: its SA scorer imports
    ``rdkit.six`` (gone from RDKit; the SA score is not computed here), and its filters module joins two tables with
    ``DataFrame.append`` (gone in pandas 2; ``concat`` is the same join)."""
    import pandas as pd

    if "rdkit.six" not in sys.modules:
        sys.modules["rdkit.six"] = types.SimpleNamespace(iteritems=lambda d: iter(d.items()))
    if not hasattr(pd.DataFrame, "append"):
        pd.DataFrame.append = lambda self, other, sort=False: pd.concat([self, other], sort=sort)


def moses_metrics(generated: list[str], train: list[str], test: list[str], device: str) -> dict:
    """MOSES' own functions: fraction_valid, fraction_unique (at 1k and 10k of the valid ones), novelty, and FCD
    against the test set (fcd_torch), as ``get_all_metrics`` calls them."""
    moses_compat()
    from moses.metrics.metrics import FCDMetric, fraction_unique, fraction_valid, novelty, remove_invalid
    from moses.utils import disable_rdkit_log

    disable_rdkit_log()
    metrics = {"valid": fraction_valid(generated)}
    valid = remove_invalid(generated, canonize=True)
    for k in (1000, 10000):
        if len(valid) >= k:
            metrics[f"unique@{k // 1000}k"] = fraction_unique(valid, k)
    metrics["novelty"] = novelty(valid, train)
    metrics["FCD/Test"] = FCDMetric(n_jobs=1, device=device, batch_size=512)(gen=valid, ref=test)
    return metrics


def score(args) -> dict:
    train_path, test_path = os.path.join(args.data, "train.smi"), os.path.join(args.data, "test.smi")
    train, test = read_smi(train_path), read_smi(test_path, args.test_limit)
    check_valid(test, test_path)  # validity matters: FCD's reference
    begun = time.perf_counter()
    generated = sample(args.checkpoint, args.samples, args.batch, args.max_len, args.seed, args.temperature)
    if args.selfies:  # the model writes SELFIES: scored as the SMILES they decode to ("" where one does not)
        import selfies

        generated = [_decoded(selfies, s) for s in generated]
    sampled = time.perf_counter() - begun
    metrics = moses_metrics(generated, train, test, args.device)
    result = {"checkpoint": args.checkpoint, "samples": len(generated), "sample_s": sampled, "metrics": metrics,
              "char_rnn": CHAR_RNN, "test_reference": len(test), "examples": generated[:20]}  # fmt: skip
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
    return result


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="step", required=True)
    prep = sub.add_parser("prepare", help="the MOSES split from the molsets wheel as train/valid/test.smi")
    prep.add_argument("--wheel", required=True)
    prep.add_argument("--out", required=True)
    prep.add_argument("--selfies", action="store_true", help="write SELFIES strings instead of SMILES")
    sc = sub.add_parser("score", help="sample molecules from a checkpoint and score them with MOSES' code")
    sc.add_argument("--checkpoint", required=True)
    sc.add_argument("--data", required=True, help="the SMILES directory `prepare` wrote (the references)")
    sc.add_argument("--selfies", action="store_true", help="the checkpoint writes SELFIES: decode before scoring")
    sc.add_argument("--samples", type=int, default=30_000)
    sc.add_argument("--batch", type=int, default=500)
    sc.add_argument("--max-len", type=int, default=100, help="tokens; a longer molecule is cut and counted invalid")
    sc.add_argument("--temperature", type=float, default=1.0)
    sc.add_argument("--seed", type=int, default=0)
    sc.add_argument("--test-limit", type=int, default=0, help="the first N test molecules as FCD's reference (0: all)")
    sc.add_argument("--device", default="cpu")
    sc.add_argument("--out", help="result JSON")
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    result = prepare(args) if args.step == "prepare" else score(args)
    json.dump({k: v for k, v in result.items() if k != "examples"}, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
