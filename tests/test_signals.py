"""Signals a scheduler sends, delivered inside every phase of a step, once and twice: the run saves one whole
step, exits 128 + the first signal's number, and ``--resume`` ends where the uninterrupted run ends, bit for bit
(weights, optimizer moments, RNG, memory, ``metrics.jsonl`` and ``best/``).

The signals are sent from hooks that ``tests/fault_driver.py`` sets on the trainer (PyTorch's forward, gradient
and optimizer-step hooks; a wrapper around the checkpoint writer), so each lands in its phase however fast the
machine is.  The default run covers every phase, every signal and both counts for language modeling and for
fine-tuning; ``-m slow`` runs the whole product."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from safetensors.torch import load_file

DRIVER = os.path.join(os.path.dirname(__file__), "fault_driver.py")
TINY = ["--quiet", "--set", "eval_interval=5", "log_interval=1", "n_layer=2", "d_model=16", "n_head=2", "d_head=8",
        "d_inner=32", "mem_len=8", "tgt_len=8", "batch_size=4", "eval_max_segments=2", "warmup_steps=3",
        "save_every_s=0", "max_steps=12", "dropout=0.1"]  # fmt: skip
TIMING = {"elapsed_s", "tokens_per_s", "valid_tokens_per_s"}  # the only figures a resumed run may log differently
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}

# (phase, optimizer step, signals): validation and save land in the validation after step 10 or the final one, 12
LM_CASES = [("forward", 7, "SIGTERM"), ("backward", 7, "SIGHUP,SIGHUP"), ("optimizer", 7, "SIGTERM,SIGTERM"),
            ("optimizer", 3, "SIGINT"), ("validation", 10, "SIGINT,SIGTERM"), ("validation", 12, "SIGTERM"),
            ("save", 10, "SIGHUP")]  # fmt: skip
FT_CASES = [("forward", 3, "SIGHUP"), ("backward", 8, "SIGINT,SIGINT"), ("optimizer", 7, "SIGTERM,SIGTERM"),
            ("validation", 10, "SIGINT"), ("validation", 12, "SIGHUP,SIGINT"), ("save", 5, "SIGTERM")]  # fmt: skip
PHASES = ("forward", "backward", "optimizer", "validation", "save")
SIGNAL_NAMES = ("SIGINT", "SIGTERM", "SIGHUP")


def lm_command(corpus, out, *extra) -> list[str]:
    return ["train", "--data", str(corpus), "--tokenizer", "char", "--out", str(out), *extra, *TINY]


def finetune_command(tmp_path, out, *extra) -> list[str]:
    rows = [{"text": "hh gfe " * (1 + i % 3) + ("abc" if i % 2 else "defg"), "label": i % 2} for i in range(24)]
    (tmp_path / "cls.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return ["finetune", "--task", "classify", "--data", str(tmp_path / "cls.jsonl"), "--valid", str(tmp_path / "cls.jsonl"),
            "--checkpoint", str(tmp_path / "lm"), "--out", str(out), "--steps", "12", "--eval-interval", "5",
            "--lr", "3e-3", "--batch-size", "4", "--segment-len", "8", "--quiet", *extra]  # fmt: skip


def longseq(argv, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "longseq", *argv], capture_output=True, text=True, env=ENV, **kwargs)


def interrupted_then_resumed(command, out, case) -> str | None:
    """Run ``command(out)`` with the case's signals, then resume it; None when all went as it should, else what
    went wrong."""
    phase, step, names = case
    cut = subprocess.run([sys.executable, DRIVER, phase, str(step), names, "--", *command(out)],
                         capture_output=True, text=True, env=ENV)  # fmt: skip
    first = getattr(signal, names.split(",")[0])
    if cut.returncode != 128 + first or f"stopped by {signal.Signals(first).name}" not in cut.stderr:
        return f"{case}: exit {cut.returncode}, expected {128 + first}: {cut.stderr[-1500:]}"
    resumed = longseq(command(out, "--resume"))
    return None if resumed.returncode == 0 else f"{case}: resume exit {resumed.returncode}: {resumed.stderr[-1500:]}"


def records(run_dir) -> list[dict]:
    with open(os.path.join(run_dir, "metrics.jsonl"), encoding="utf-8") as f:
        return [{k: v for k, v in json.loads(line).items() if k not in TIMING} for line in f if line.strip()]


def untimed(data):
    """``data`` without the timing figures, at any depth."""
    if isinstance(data, dict):
        return {k: untimed(v) for k, v in data.items() if k not in TIMING}
    return data


def tensors_equal(a, b) -> bool:
    x, y = load_file(str(a)), load_file(str(b))
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


def differences(whole, run) -> list[str]:
    """What differs between two finished run directories (weights, training state, log, best/)."""
    found = []
    for name in ("last/model.safetensors", "last/trainer.safetensors", "best/model.safetensors"):
        if not tensors_equal(whole / name, run / name):
            found.append(name)
    for name in ("last/trainer_state.json", "best/config.json"):
        if untimed(json.loads((whole / name).read_text())) != untimed(json.loads((run / name).read_text())):
            found.append(name)
    if records(whole) != records(run):
        found.append("metrics.jsonl")
    return found


def run_cases(command, tmp_path, cases) -> None:
    """Every case in its own run directory, two at a time; each must resume to the uninterrupted run."""
    assert longseq(command(tmp_path / "whole")).returncode == 0
    outs = [tmp_path / f"cut-{i}" for i in range(len(cases))]
    with ThreadPoolExecutor(2) as pool:
        failures = [f for f in pool.map(lambda oc: interrupted_then_resumed(command, *oc), zip(outs, cases)) if f]
    assert not failures, "\n".join(failures)
    for case, out in zip(cases, outs):
        assert not differences(tmp_path / "whole", out), (case, differences(tmp_path / "whole", out))


@pytest.fixture
def lm_base(tmp_path, text_corpus):
    """A tiny language model to fine-tune, in tmp_path/lm."""
    assert longseq(lm_command(text_corpus, tmp_path / "lm", "--set", "max_steps=2")).returncode == 0
    return tmp_path / "lm"


def test_signals_in_every_phase_of_language_modeling_resume_bit_for_bit(tmp_path, text_corpus):
    run_cases(lambda out, *extra: lm_command(text_corpus, out, *extra), tmp_path, LM_CASES)


def test_signals_in_every_phase_of_fine_tuning_resume_bit_for_bit(tmp_path, lm_base):
    run_cases(lambda out, *extra: finetune_command(tmp_path, out, *extra), tmp_path, FT_CASES)


def every_case(steps: dict) -> list[tuple]:
    return [(phase, steps[phase], names) for phase in PHASES for sig in SIGNAL_NAMES
            for names in (sig, f"{sig},{SIGNAL_NAMES[(SIGNAL_NAMES.index(sig) + 1) % 3]}")]  # fmt: skip


@pytest.mark.slow
def test_every_signal_once_and_twice_in_every_phase_of_language_modeling(tmp_path, text_corpus):
    steps = {"forward": 7, "backward": 7, "optimizer": 7, "validation": 12, "save": 10}
    run_cases(lambda out, *extra: lm_command(text_corpus, out, *extra), tmp_path, every_case(steps))


@pytest.mark.slow
def test_every_signal_once_and_twice_in_every_phase_of_fine_tuning(tmp_path, lm_base):
    steps = {"forward": 7, "backward": 7, "optimizer": 7, "validation": 10, "save": 5}
    run_cases(lambda out, *extra: finetune_command(tmp_path, out, *extra), tmp_path, every_case(steps))


def test_a_second_signal_after_the_optimizer_update_is_not_applied_twice(tmp_path, text_corpus):
    """The issue's probe: SIGTERM twice, the second after ``optimizer.step()`` of step 7.  The second signal used
    to raise inside the step, which restored the data position of step 6 but kept step 7's weights and saved them
    as step 6 (so --resume applied step 7 twice), and exited 130.  Now the step finishes, last/ holds step 7 whole,
    and the exit code is SIGTERM's."""
    out = tmp_path / "cut"
    cut = subprocess.run([sys.executable, DRIVER, "optimizer", "7", "SIGTERM,SIGTERM", "--",
                          *lm_command(text_corpus, out)], capture_output=True, text=True, env=ENV)  # fmt: skip
    assert cut.returncode == 143, cut.stderr[-2000:]
    state = json.loads((out / "last" / "trainer_state.json").read_text())
    assert state["step"] == 7 and "stopped by SIGTERM at step 7" in cut.stderr
    assert [r["step"] for r in records(out) if "loss" in r][-1] == 7


def test_a_validation_stopped_by_a_signal_is_done_again_on_resume(tmp_path, text_corpus, metrics):
    """SIGTERM during the final validation left best/ an older model and 'nothing to train' on resume; now the
    resumed run validates that step first, logs it, and chooses best/ with it."""
    out = tmp_path / "cut"
    cut = subprocess.run([sys.executable, DRIVER, "validation", "12", "SIGTERM", "--", *lm_command(text_corpus, out)],
                         capture_output=True, text=True, env=ENV)  # fmt: skip
    assert cut.returncode == 143, cut.stderr[-2000:]
    assert json.loads((out / "last" / "trainer_state.json").read_text())["pending_validation"] is True
    assert not any(r["step"] == 12 and "valid_loss" in r for r in metrics(out))
    resumed = longseq([*lm_command(text_corpus, out, "--resume"), "--json"])
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "validation of step 12 was interrupted: it runs again first" in resumed.stderr
    summary = json.loads(resumed.stdout.splitlines()[-1])
    assert summary["loss"] is not None and summary["step"] == 12
    twelve = [r for r in metrics(out) if r["step"] == 12 and "valid_loss" in r]
    assert len(twelve) == 1 and twelve[0]["valid_loss"] == summary["loss"]
    assert json.loads((out / "last" / "trainer_state.json").read_text())["pending_validation"] is False
