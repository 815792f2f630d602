"""The genome study script (``benchmarks/studies/genomes.py``): its count models equal counting written out by hand,
its count models are scored on exactly the positions the neural models' evaluation scores, and its pilot runs every
step end to end (prepare, baselines, a cell of two models, the protein masked LM, the summary) on generated data."""

from __future__ import annotations

import gzip
import importlib.util
import json
import math
import os
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest

from longseq.data.batching import OrderedStream
from longseq.data.tokenizers import NucleotideTokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "studies", "genomes.py")


@pytest.fixture(scope="module")
def study():
    spec = importlib.util.spec_from_file_location("genomes_study", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_count_model_is_counting_written_out(study):
    rng = np.random.default_rng(0)
    text = "".join(rng.choice(list("ACGTN"), p=[0.3, 0.2, 0.2, 0.28, 0.02], size=3000))
    bases = study.bases_of(NucleotideTokenizer().encode(text))
    order, alpha = 3, 0.5
    counts = Counter(
        (text[t - order : t], text[t]) for t in range(order, len(text)) if "N" not in text[t - order : t + 1]
    )
    table = study.count_table(bases, order)
    for (context, base), n in counts.items():
        code = sum("ACGT".index(ch) * 4**j for j, ch in enumerate(reversed(context)))
        assert table[code, "ACGT".index(base)] == n
    assert table.sum() == sum(counts.values())
    held = "".join(rng.choice(list("ACGTN"), p=[0.3, 0.2, 0.2, 0.28, 0.02], size=800))
    bits, n = study.count_bits(table, study.bases_of(NucleotideTokenizer().encode(held)), order, alpha)
    totals = Counter()
    for (context, _), c in counts.items():
        totals[context] += c
    expected = [-math.log2((counts[(held[t - order : t], held[t])] + alpha) / (totals[held[t - order : t]] + 4 * alpha))
                for t in range(order, len(held)) if "N" not in held[t - order : t + 1]]  # fmt: skip
    assert n == len(expected) and bits == pytest.approx(np.mean(expected), abs=1e-12)


def test_the_count_models_score_the_positions_the_evaluation_scores(study):
    n, segment, warmup, per_row = 8 * 700 + 5, 32, 128, 256
    stream = OrderedStream(np.arange(n), study.SCORED_ROWS, segment)
    skip, scored = -(-warmup // segment), per_row // segment
    labels = []
    for index in range(skip + scored):
        segment_ids = stream.next_segment(cycle=False)
        if index >= skip:
            labels.append(segment_ids.labels.flatten().numpy())
    assert np.array_equal(np.sort(np.concatenate(labels)), np.flatnonzero(study.scored_positions(n, warmup, per_row)))


def fake_data(folder) -> tuple[str, str]:
    rng = np.random.default_rng(0)
    motif = "".join(rng.choice(list("ACGT"), size=11))
    seq = "N" * 300 + "".join(motif if rng.random() > 0.1 else motif.lower() for _ in range(6000))
    with gzip.open(folder / "g.fa.gz", "wt") as f:
        f.write(">X test\n" + "\n".join(seq[i : i + 70] for i in range(0, len(seq), 70)) + "\n")
    residues = "ACDEFGHIKLMNPQRSTVWY"
    proteins = [f">p{i}\n{''.join(rng.choice(list(residues), size=60))}\n" for i in range(60)]
    (folder / "p.fasta").write_text("".join(proteins))
    return str(folder / "g.fa.gz"), str(folder / "p.fasta")


@pytest.mark.slow
def test_the_pilot_runs_every_step_and_stores_its_results(tmp_path):
    pytest.importorskip("Bio")
    fasta, proteins = fake_data(tmp_path)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ROOT}
    work, store = str(tmp_path / "work"), str(tmp_path / "store")
    steps = [["prepare", "--fasta", fasta, "--proteins", proteins], ["baselines"],
             ["train", "--models", "xl", "ssm", "--contexts", "64", "--seeds", "1"], ["protein", "--seeds", "1"]]  # fmt: skip
    for step in steps:
        command = [sys.executable, SCRIPT, step[0], "--work", work, "--store", store, "--pilot", *step[1:]]
        proc = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300, check=False)
        assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((tmp_path / "store" / "summary.json").read_text())
    assert set(summary["table"]) == {"xl", "ssm"} and summary["protein_mlm"]["test_ppl"]["n"] == 1
    cell = json.loads((tmp_path / "store" / "cells" / "ssm" / "ctx64" / "seed1.json").read_text())
    assert 0 < cell["test"]["bits_per_base"] < 3 and cell["test"]["tokens"] == 256 * 8
    assert "| xl |" in (tmp_path / "store" / "summary.md").read_text()
