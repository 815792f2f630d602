"""Shared test setup: every test, and every process a test starts, imports longseq from this source tree.

pytest puts the repository root first on ``sys.path`` (``pythonpath`` in pyproject.toml); the environment
variable below does the same for the ``python -m longseq`` and ``torchrun`` processes the tests start, so a
``pip install .`` beside the checkout never hides the code being edited."""

import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
