"""Shared test setup and fixtures.

Every test, and every process a test starts, imports longseq from this source tree: pytest puts the repository
root first on ``sys.path`` (``pythonpath`` in pyproject.toml), and the environment variable below does the same
for the ``python -m longseq`` and ``torchrun`` processes the tests start, so a ``pip install .`` beside the
checkout never hides the code being edited."""

import json
import os

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)


def tiny_text(seed: int = 0, n: int = 6000) -> str:
    """``n`` characters of five made-up words: a corpus a two-layer model learns something of in a few steps."""
    rng = np.random.default_rng(seed)
    return " ".join(rng.choice(["abc", "defg", "hh", "gfe", "cab\n"], size=n // 3))[:n]


@pytest.fixture
def text_corpus(tmp_path):
    """The path of a small text corpus file (split 90/5/5 when read)."""
    path = tmp_path / "corpus.txt"
    path.write_text(tiny_text())
    return path


@pytest.fixture
def metrics():
    """``metrics(run_dir)``: the records of a run's metrics.jsonl."""

    def read(run_dir) -> list[dict]:
        with open(os.path.join(run_dir, "metrics.jsonl"), encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]

    return read
