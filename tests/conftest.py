"""Shared test setup and fixtures.

Every test, and every process a test starts, imports longseq from this source tree: pytest puts the repository
root first on ``sys.path`` (``pythonpath`` in pyproject.toml), and the environment variable below does the same
for the ``python -m longseq`` and ``torchrun`` processes the tests start, so a ``pip install .`` beside the
checkout never hides the code being edited.

The plain helpers these fixtures are built on (tiny corpora, runs and models, the attention harness, key-word
checks of errors) are in ``support.py``; no test module imports another."""

import os

import pytest
from support import corpus_file, records, tiny_run, tiny_text, train_tiny_lm, write_classify_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# pytest -n N (.ci/run): N workers share the cores, one torch thread each, and so do the processes they start
if os.environ.get("PYTEST_XDIST_WORKER"):
    import torch

    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)


@pytest.fixture
def text_corpus(tmp_path):
    """The path of a small text corpus file (split 90/5/5 when read)."""
    path = tmp_path / "corpus.txt"
    path.write_text(tiny_text())
    return path


@pytest.fixture
def metrics():
    """``metrics(run_dir)``: the records of a run's metrics.jsonl."""
    return records


@pytest.fixture
def lm_checkpoint(tmp_path) -> str:
    """A tiny character language model trained two steps into ``tmp_path/lm``: the path of its ``best/``."""
    return train_tiny_lm(tmp_path)


@pytest.fixture
def classify_file(tmp_path) -> str:
    """Eight two-class records in ``tmp_path/cls.jsonl``: the file's path."""
    return write_classify_file(tmp_path)


@pytest.fixture(scope="session")
def trained_checkpoint(tmp_path_factory) -> str:
    """A tiny trained character model (mem_len 8, segments of 8) whose config names its corpus file: the path of
    its ``last/`` (trained once per session; tests read it, never write it)."""
    from longseq.api import train

    tmp = tmp_path_factory.mktemp("ckpt")
    run = tiny_run(max_steps=4, eval_interval=4)
    run.data.path, run.data.varlen = str(corpus_file(tmp)), False
    train(run, str(tmp / "run"), progress=False)
    return str(tmp / "run" / "last")
