"""What the issue-59 studies share: runs of this tree's ``longseq`` CLI that continue where they stopped, their
scores, and the results JSON and table each study keeps.

A run directory with a checkpoint is continued (``--resume``: its own config), one with ``result.json`` is finished
and read back; so a study's command can be given again after any stop, and gives the same table.  Every command is
``python -m longseq ... --json`` of this tree (not an installed longseq), with one thread unless ``OMP_NUM_THREADS``
says otherwise."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time

TREE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def longseq(args: list[str], log=print) -> dict:
    """``python -m longseq ARGS --json`` in this tree: the JSON object it printed last (an error with its stderr's
    tail when it fails)."""
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "PYTHONPATH": TREE}
    log("$ longseq " + " ".join(args))
    done = subprocess.run([sys.executable, "-m", "longseq", *args, "--json"], cwd=TREE, env=env, capture_output=True,
                          text=True)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"longseq {' '.join(args[:2])} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else {}


def train(out: str, data: str, sets: list[str], log=print) -> dict:
    """Train ``out`` on ``data`` with ``--set`` ``sets``, or continue it from its last checkpoint."""
    if os.path.isfile(os.path.join(out, "last", "config.json")):
        return longseq(["train", "--out", out, "--resume", "--quiet"], log)
    return longseq(["train", "--data", data, "--out", out, "--quiet", "--set", *sets], log)


def finished(path: str) -> dict | None:
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    return None


def write_json(path: str, data) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


def machine() -> dict:
    return {"python": platform.python_version(), "cpu": platform.processor() or platform.machine(),
            "threads": os.environ.get("OMP_NUM_THREADS", "1"), "date": time.strftime("%Y-%m-%d")}  # fmt: skip


def mean_std(values: list[float]) -> tuple[float, float]:
    n = len(values)
    mean = sum(values) / n
    return mean, (sum((v - mean) ** 2 for v in values) / (n - 1)) ** 0.5 if n > 1 else 0.0


def table(header: list[str], rows: list[list]) -> str:
    """A markdown table; floats to 4 places."""
    cell = lambda v: f"{v:.4f}" if isinstance(v, float) else str(v)  # noqa: E731
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]) + "\n"
