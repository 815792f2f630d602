"""The benchmark scripts against the library they call: the recall studies run end to end (their ``--pilot``: 4
steps a row), and every name a script imports from longseq exists, so that an import moved by a refactor breaks a
test, not a study started hours later (``recall_pairs.py`` still imported ``train`` from its old place); and a
study script imports the longseq of its own tree, not an installed one (a study run from a worktree of another
commit would otherwise run the code of whichever tree is installed, and its results would name the wrong one)."""

import ast
import glob
import importlib
import importlib.util
import json
import math
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize(
    "script, options, stored",
    [
        ("recall_pairs.py", ["--rows", "gla", "--pairs", "8", "--seeds", "1"], "gla"),
        pytest.param(
            "recall.py",
            ["--tasks", "passkey-chunks", "--variants", "learned-4", "--seeds", "1"],
            "passkey-chunks",
            marks=pytest.mark.slow,
        ),
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


def _fallbacks(tree: ast.AST) -> set[int]:
    """Line numbers of imports inside ``except ImportError`` handlers (a script's fallback for older trees)."""
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ExceptHandler) and "ImportError" in ast.unparse(node.type or ast.Name("")):
            lines |= {n.lineno for n in ast.walk(node) if isinstance(n, ast.ImportFrom)}
    return lines


def test_every_longseq_name_a_benchmark_imports_exists():
    """Every ``from longseq... import name`` in benchmarks/ (module level or inside a function) names something
    that exists, outside fallbacks for older trees."""
    missing = []
    for path in sorted(glob.glob(os.path.join(ROOT, "benchmarks", "**", "*.py"), recursive=True)):
        tree = ast.parse(open(path, encoding="utf-8").read())
        skip = _fallbacks(tree)
        for node in ast.walk(tree):
            if not (isinstance(node, ast.ImportFrom) and (node.module or "").startswith("longseq")):
                continue
            if node.lineno in skip:
                continue
            module = importlib.import_module(node.module)
            for alias in node.names:
                if not hasattr(module, alias.name) and importlib.util.find_spec(f"{node.module}.{alias.name}") is None:
                    missing.append(f"{os.path.relpath(path, ROOT)}:{node.lineno} {node.module}.{alias.name}")
    assert not missing, missing


def test_the_runner_reuses_a_stored_run_whose_unread_defaults_changed():
    """A result stored when an option the model does not read had another default (an hourglass's ratio_loss in a
    model without one: 0.03 then, 0.3 now) is the same run; a changed option the model reads is not."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks", "studies"))
    from runner import read_config

    from longseq import DataConfig, ModelConfig, RunConfig, TrainConfig

    run = RunConfig(model=ModelConfig(vocab_size=50), data=DataConfig(), train=TrainConfig())
    old = run.to_dict()
    old["model"]["hourglass"]["ratio_loss"] = 0.03
    assert read_config(RunConfig.from_dict(old)) == read_config(run)
    old["model"]["d_inner"] = 17
    assert read_config(RunConfig.from_dict(old)) != read_config(run)


STUDIES = ["runner.py", "chunk_boundaries.py", "finetune_defaults.py", "context_clamp.py", "rope_scaling.py",
           "recall.py", "recall_pairs.py", "recall_tries.py", "listops.py", "smollm2.py", "linearize.py"]  # fmt: skip


PROBE = """
import json, os, runpy, sys
studies, root, scripts = sys.argv[1], sys.argv[2], sys.argv[3:]
base, found = list(sys.path), {}
for script in scripts:  # each from a clean slate: no longseq and none of the study modules imported yet
    sys.path[:] = [*base, studies]
    for name in [n for n, m in sys.modules.items() if (getattr(m, "__file__", None) or "").startswith(root)]:
        del sys.modules[name]
    try:
        runpy.run_path(os.path.join(studies, script))
        import longseq
        found[script] = longseq.__file__
    except ImportError as error:
        found[script] = str(error)
print(json.dumps(found))
"""


def test_a_study_script_imports_the_longseq_of_its_own_tree(tmp_path):
    """A decoy ``longseq`` on PYTHONPATH (where an installed or another tree's copy would be found first) is never
    imported: each script puts its tree ahead of it before its first longseq import."""
    decoy = tmp_path / "decoy" / "longseq"
    decoy.mkdir(parents=True)
    (decoy / "__init__.py").write_text("raise ImportError('the decoy longseq was imported')\n")
    studies = os.path.join(ROOT, "benchmarks", "studies")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "decoy")}
    command = [sys.executable, "-c", PROBE, studies, ROOT, *STUDIES]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    reported = json.loads(done.stdout.strip().splitlines()[-1])
    found = {script: os.path.realpath(path) for script, path in reported.items()}
    mine = os.path.join(os.path.realpath(ROOT), "longseq", "__init__.py")
    assert found == {script: mine for script in STUDIES}


def test_listops_runs_its_longseq_commands_on_its_own_tree(tmp_path):
    """listops.py runs the longseq command line in child processes: from a working directory that holds another
    longseq (a decoy that fails on import), they still run this tree's."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks", "studies"))
    try:
        import listops
    finally:
        sys.path.pop(0)
    decoy = tmp_path / "longseq"
    decoy.mkdir()
    (decoy / "__init__.py").write_text("raise ImportError('the decoy longseq was imported')\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    done = subprocess.run([*listops.LONGSEQ, "finetune", "--help"], cwd=tmp_path, env=env, capture_output=True,
                          text=True)  # fmt: skip
    assert done.returncode == 0 and "--task" in done.stdout, done.stderr[-2000:]


def test_the_store_keeps_what_the_summary_reads():
    """A stored result (``store_copy``) thins the loss by position to a few positions, keeping the bands the summary
    reads as the full curve gives them, and rounds the figures' wall times and shares; every other field is kept,
    and thinning twice is thinning once."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks", "studies"))
    from runner import position_bands, store_copy, summarize_variant

    losses = {key: [3.0 - 0.02 * p + 0.001 * (p % 7) + shift for p in range(64)] for key, shift in
              (("loss_memory", 0.0), ("loss_no_memory", 0.5))}  # fmt: skip
    per_position = {"positions": list(range(64)), **losses, "tokens": [100] * 64, "segments": 8, "skip_segments": 2}
    result = {"seed": 1, "overrides": [], "params": 10, "test": {"bpc": 2.0, "ppl": 4.0}, "train_tokens_per_s": 5.0,
              "per_position": per_position, "context_curve": {"contexts": [0, 64], "loss": [1.5, 1.4]},
              "memory_share": None, "run": {"model": {}}, "curve": [[250, 51.6597, 2.0818], [500, 125.6376, 1.8685]],
              "share_history": [[250, 0.474043]]}  # fmt: skip
    kept = store_copy(result)
    same = ("per_position", "curve", "share_history")
    assert {k: v for k, v in kept.items() if k not in same} == {k: v for k, v in result.items() if k not in same}
    assert kept["curve"] == [[250, 51.7, 2.0818], [500, 125.6, 1.8685]] and kept["share_history"] == [[250, 0.474]]
    assert kept["per_position"]["positions"] == [0, 1, 2, 4, 8, 16, 32, 63] and "tokens" not in kept["per_position"]
    assert kept["per_position"]["loss_memory"] == [losses["loss_memory"][p] for p in (0, 1, 2, 4, 8, 16, 32, 63)]
    assert kept["per_position"]["bands"] == {key: position_bands(losses[key]) for key in losses}
    assert store_copy(kept) == kept
    bands = summarize_variant([kept])["per_position_bpc"]["loss_memory"]
    assert bands["first_eighth"]["mean"] == pytest.approx(sum(losses["loss_memory"][:8]) / 8 / math.log(2), rel=1e-12)
