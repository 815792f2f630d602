"""Signals a scheduler sends, delivered inside every phase of a step, once and twice: the run saves one whole
step, exits 128 + the first signal's number, and ``--resume`` ends where the uninterrupted run ends, bit for bit
(weights, optimizer moments, RNG, memory, ``metrics.jsonl`` and ``best/``).

The signals are sent from hooks that ``tests/fault_driver.py`` sets on the trainer (PyTorch's forward, gradient
and optimizer-step hooks; a wrapper around the checkpoint writer), so each lands in its phase however fast the
machine is.  The default run covers every phase, every signal and both counts for language modeling and for
fine-tuning; ``-m slow`` runs the whole product.

Beside them: a Ctrl-C (KeyboardInterrupt) inside a step and a SIGTERM inside a checkpoint save, through the Python
API; and through the command line, a scheduler's signal when no checkpoint is due, SIGKILL at random moments, and a
fine-tuning run killed or stopped, each resumed to the uninterrupted run's losses or weights bit for bit."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from safetensors.torch import load_file
from support import (
    FAULT_CLI,
    TRAIN_COMMAND,
    assert_names,
    logged_steps,
    pause_when,
    step_losses,
    tiny_corpus,
    tiny_run,
    tiny_text,
)

from longseq.api import train
from longseq.train import checkpoint as checkpoint_module
from longseq.train.checkpoint import load_training_state

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
    if cut.returncode != 128 + first or signal.Signals(first).name not in cut.stderr:
        return f"{case}: exit {cut.returncode}, expected {128 + first}: {cut.stderr[-1500:]}"
    resumed = longseq(command(out, "--resume"))
    return None if resumed.returncode == 0 else f"{case}: resume exit {resumed.returncode}: {resumed.stderr[-1500:]}"


def untimed_records(run_dir) -> list[dict]:
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
    if untimed_records(whole) != untimed_records(run):
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


@pytest.mark.slow
def test_signals_in_every_phase_of_language_modeling_resume_bit_for_bit(tmp_path, text_corpus):
    run_cases(lambda out, *extra: lm_command(text_corpus, out, *extra), tmp_path, LM_CASES)


@pytest.mark.slow
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
    """An adversarial probe: SIGTERM twice, the second after ``optimizer.step()`` of step 7.  The second signal used
    to raise inside the step, which restored the data position of step 6 but kept step 7's weights and saved them
    as step 6 (so --resume applied step 7 twice), and exited 130.  Now the step finishes, last/ holds step 7 whole,
    and the exit code is SIGTERM's."""
    out = tmp_path / "cut"
    cut = subprocess.run([sys.executable, DRIVER, "optimizer", "7", "SIGTERM,SIGTERM", "--",
                          *lm_command(text_corpus, out)], capture_output=True, text=True, env=ENV)  # fmt: skip
    assert cut.returncode == 143, cut.stderr[-2000:]
    state = json.loads((out / "last" / "trainer_state.json").read_text())
    assert state["step"] == 7
    assert_names(cut.stderr, "SIGTERM", "step 7")
    assert [r["step"] for r in untimed_records(out) if "loss" in r][-1] == 7


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
    assert_names(resumed.stderr, "validation", "step 12", "again")
    summary = json.loads(resumed.stdout.splitlines()[-1])
    assert summary["loss"] is not None and summary["step"] == 12
    twelve = [r for r in metrics(out) if r["step"] == 12 and "valid_loss" in r]
    assert len(twelve) == 1 and twelve[0]["valid_loss"] == summary["loss"]
    assert json.loads((out / "last" / "trainer_state.json").read_text())["pending_validation"] is False


def test_interrupt_inside_a_step_saves_the_last_completed_step(tmp_path, monkeypatch):
    from longseq.model import TransformerXLLM

    corpus = tiny_corpus()
    whole = train(tiny_run(), str(tmp_path / "whole"), corpus=corpus, progress=False)
    original = TransformerXLLM.forward
    calls = {"n": 0}

    def interrupting(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2 * 7 + 2:  # the second chunk of step 8 (grad_accum=2; no evaluations in this run)
            raise KeyboardInterrupt
        return original(self, *args, **kwargs)

    monkeypatch.setattr(TransformerXLLM, "forward", interrupting)
    with pytest.raises(KeyboardInterrupt):
        train(tiny_run(eval_interval=100), str(tmp_path / "cut"), corpus=corpus, progress=False)
    monkeypatch.setattr(TransformerXLLM, "forward", original)
    resumed = train(tiny_run(), str(tmp_path / "cut"), corpus=corpus, progress=False, resume=True)
    assert resumed.losses == whole.losses[7:]


def test_sigterm_during_a_checkpoint_save_is_taken_after_the_save(tmp_path, monkeypatch):
    """SIGTERM arriving in the middle of writing a checkpoint: the save completes, the run stops at that step,
    and the resumed run gives the uninterrupted run's losses bit for bit."""
    from longseq.train import Interrupted

    corpus = tiny_corpus()
    run = lambda: tiny_run(max_steps=12, save_interval=2, eval_interval=100)  # noqa: E731
    whole = train(run(), str(tmp_path / "whole"), corpus=corpus, progress=False)
    original, calls = checkpoint_module._write_checkpoint_files, {"n": 0}

    def signalled(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:  # the save at step 6
            os.kill(os.getpid(), signal.SIGTERM)
        return original(*args, **kwargs)

    monkeypatch.setattr(checkpoint_module, "_write_checkpoint_files", signalled)
    with pytest.raises(Interrupted) as stopped:
        train(run(), str(tmp_path / "cut"), corpus=corpus, progress=False)
    assert stopped.value.step == 6 and stopped.value.exit_code == 128 + signal.SIGTERM
    monkeypatch.setattr(checkpoint_module, "_write_checkpoint_files", original)
    resumed = train(run(), str(tmp_path / "cut"), corpus=corpus, progress=False, resume=True)
    assert resumed.losses == whole.losses[6:]


def test_sigkill_at_random_moments_then_resume_gives_the_same_losses(tmp_path, text_corpus):
    """The CLI run is killed with SIGKILL twice at random moments (checkpoints are written every step, so kills
    land inside saves too); resuming gives the uninterrupted run's losses bit for bit."""
    settings = ["--data", str(text_corpus), *FAULT_CLI, "max_steps=60", "save_interval=1"]
    subprocess.run([*TRAIN_COMMAND, "--out", str(tmp_path / "whole"), *settings], check=True, capture_output=True)
    out = tmp_path / "killed"
    rng = random.Random(7)
    for attempt in range(2):
        extra = ["--resume"] if attempt else []
        proc = subprocess.Popen([*TRAIN_COMMAND, "--out", str(out), *extra, *settings], stderr=subprocess.DEVNULL)
        start = load_training_state(str(out / "last")).step if attempt else 0  # the run is not alive here
        target = start + rng.randint(3, 12)
        pause_when(lambda target=target: logged_steps(out) >= target, proc)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert proc.returncode == -signal.SIGKILL  # killed mid-run, not finished
        assert load_training_state(str(out / "last")).step < 60
    subprocess.run([*TRAIN_COMMAND, "--out", str(out), "--resume", *settings], check=True, capture_output=True)
    assert step_losses(out) == step_losses(tmp_path / "whole") and len(step_losses(out)) == 60


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_scheduler_signal_saves_a_checkpoint_that_resumes_bit_for_bit(tmp_path, text_corpus, sig):
    """No checkpoint is due (no evaluation, no save interval, no time cadence) when the signal comes: the run saves
    last/ at the next step boundary, exits 128 + signal with the resume command, and --resume continues exactly."""
    settings = ["--data", str(text_corpus), *FAULT_CLI, "max_steps=40"]
    subprocess.run([*TRAIN_COMMAND, "--out", str(tmp_path / "whole"), *settings], check=True, capture_output=True)
    out = tmp_path / "stopped"
    proc = subprocess.Popen([*TRAIN_COMMAND, "--out", str(out), *settings], stderr=subprocess.PIPE, text=True)
    pause_when(lambda: logged_steps(out) >= 5, proc)
    proc.send_signal(sig)
    proc.send_signal(signal.SIGCONT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + sig, err[-2000:]
    assert_names(err, signal.Signals(sig).name, "longseq train", "--resume")
    stopped_at = load_training_state(str(out / "last")).step
    assert 5 <= stopped_at < 40 and not (out / "best").exists()  # nothing had been saved before the signal
    subprocess.run([*TRAIN_COMMAND, "--out", str(out), "--resume", *settings], check=True, capture_output=True)
    assert step_losses(out) == step_losses(tmp_path / "whole") and len(step_losses(out)) == 40


def classify_finetune_command(tmp_path, lm, out, *extra):
    rows = [{"text": "hh gfe " * 3 + ("abc" if i % 2 else "defg"), "label": i % 2} for i in range(16)]
    (tmp_path / "cls.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return [sys.executable, "-m", "longseq", "finetune", "--task", "classify", "--data", str(tmp_path / "cls.jsonl"),
            "--checkpoint", lm, "--out", str(out), "--steps", "60", "--lr", "3e-3", "--batch-size", "4",
            "--segment-len", "8", "--quiet", "--json", *extra]  # fmt: skip


@pytest.mark.parametrize("sig", [pytest.param(signal.SIGKILL, marks=pytest.mark.slow), signal.SIGTERM])
def test_fine_tuning_killed_and_resumed_ends_bit_for_bit_where_the_whole_run_does(tmp_path, lm_checkpoint, sig):
    from safetensors.torch import load_file

    lm = lm_checkpoint
    subprocess.run(classify_finetune_command(tmp_path, lm, tmp_path / "whole"), check=True, capture_output=True)
    out = tmp_path / "cut"
    proc = subprocess.Popen(
        classify_finetune_command(tmp_path, lm, out, "--save-interval", "1"), stderr=subprocess.DEVNULL
    )
    pause_when(lambda: logged_steps(out) >= 2, proc)  # logs every 6 steps (a tenth), saves every step
    proc.send_signal(sig)
    proc.send_signal(signal.SIGCONT)
    proc.wait(timeout=120)
    assert proc.returncode in (-signal.SIGKILL, 128 + signal.SIGTERM)
    assert 6 <= load_training_state(str(out / "last")).step < 60
    resumed = subprocess.run(classify_finetune_command(tmp_path, lm, out, "--resume"), capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    whole, cut = (
        load_file(str(tmp_path / "whole" / "last" / "model.safetensors")),
        load_file(str(out / "last" / "model.safetensors")),
    )
    assert whole.keys() == cut.keys() and all(torch.equal(whole[k], cut[k]) for k in whole)


def test_the_printed_resume_command_works_as_printed(tmp_path):
    """After a signal, the run printed "resume with: longseq train --config tiny.toml ... --resume", which that
    command refused ("change settings with --set, not --config"), and it did not quote a path with a space."""
    import shlex

    folder = tmp_path / "my configs"
    folder.mkdir()
    (folder / "tiny.toml").write_text("[model]\nn_layer = 1\n\n[train]\nmax_steps = 6\n")
    (tmp_path / "corpus.txt").write_text(tiny_text())
    argv = ["train", f"--config={folder / 'tiny.toml'}", "--data", "corpus.txt", "--out", "my run", *TINY[:1],
            "--set", *[s for s in TINY[2:] if not s.startswith(("n_layer", "max_steps"))]]  # fmt: skip
    cut = subprocess.run([sys.executable, DRIVER, "forward", "3", "SIGINT", "--", *argv, "--tokenizer", "char"],
                         capture_output=True, text=True, env=ENV, cwd=tmp_path)  # fmt: skip
    assert cut.returncode == 128 + signal.SIGINT, cut.stderr[-1500:]
    printed = cut.stderr.split("resume with: ", 1)[1].splitlines()[0]
    command = shlex.split(printed)
    assert command[:2] == ["longseq", "train"] and "--config" not in printed and "'my run'" in printed
    resumed = subprocess.run([sys.executable, "-m", "longseq", *command[1:]], capture_output=True, text=True,
                             env=ENV, cwd=tmp_path)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-1500:]
    assert sorted(step_losses(tmp_path / "my run")) == list(range(1, 7))
