"""The recall studies' scripts run end to end (their ``--pilot``: 4 steps a row), so an import moved by a refactor
breaks a test, not a study started hours later (``recall_pairs.py`` still imported ``train`` from its old place)."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize(
    "script, options, stored",
    [
        ("recall_pairs.py", ["--rows", "gla", "--pairs", "8", "--seeds", "1"], "gla"),
        ("recall.py", ["--tasks", "passkey-chunks", "--variants", "learned-4", "--seeds", "1"], "passkey-chunks"),
    ],
)
def test_a_recall_study_pilot_stores_its_row(script, options, stored, tmp_path):
    store = tmp_path / "store"
    command = [sys.executable, os.path.join(ROOT, "benchmarks", "studies", script), "--work", str(tmp_path / "work"),
               "--store", str(store), "--pilot", *options]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ROOT}
    proc = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    found = [os.path.join(d, f) for d, _, files in os.walk(store / stored) for f in files if f.endswith(".json")]
    assert found, f"nothing stored under {store / stored}: {proc.stdout[-1000:]}"
    row = json.load(open(found[0], encoding="utf-8"))
    accuracy = row["accuracy"] if "accuracy" in row else row["valid"]["accuracy"]
    assert 0.0 <= accuracy <= 1.0
