"""Faults: the NaN guard (skip, roll back, lower the learning rate), checkpoint rotation, recovery from a kill
in the middle of a checkpoint swap, and SIGKILL at a random moment followed by an exact resume."""

import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
from support import corpus_file, records, tiny_corpus, tiny_run

from longseq.train import load_checkpoint, train
from longseq.train.checkpoint import load_training_state


def inject_nan_at(step, times=1):
    """An after_backward hook that poisons one gradient the first ``times`` attempts at optimizer step ``step``
    (a skipped step is attempted again with the next batch under the same number)."""
    left = [times]

    def hook(current, model):
        if current == step and left[0] > 0:
            left[0] -= 1
            next(model.parameters()).grad.fill_(float("nan"))

    return hook


def test_nan_guard_skips_an_injected_nan_gradient_and_continues(tmp_path):
    corpus = tiny_corpus()
    clean = train(tiny_run(max_steps=10), str(tmp_path / "clean"), corpus=corpus, progress=False)
    hit = train(
        tiny_run(max_steps=10), str(tmp_path / "hit"), corpus=corpus, progress=False, after_backward=inject_nan_at(4)
    )
    assert hit.step == 10 and all(math.isfinite(x) for x in hit.losses)
    assert hit.losses[:3] == clean.losses[:3]  # identical until the fault
    skipped = [r for r in records(tmp_path / "hit") if "skipped" in r]
    assert [r["step"] for r in skipped] == [4] and "nan" in skipped[0]["skipped"]
    model, _, _, _ = load_checkpoint(str(tmp_path / "hit" / "last"))
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_consecutive_bad_steps_roll_back_and_lower_the_learning_rate(tmp_path):
    corpus = tiny_corpus()
    run = tiny_run(max_steps=12, save_interval=2, eval_interval=100, nan_patience=2, nan_lr_factor=0.5)
    result = train(run, str(tmp_path), corpus=corpus, progress=False, after_backward=inject_nan_at(5, times=2))
    assert result.step == 12
    log = records(tmp_path)
    rollback = [r for r in log if "rollback" in r]
    assert len(rollback) == 1 and rollback[0]["step"] == 4 and rollback[0]["lr_scale"] == 0.5
    assert load_training_state(str(tmp_path / "last")).lr_scale == 0.5  # kept for an exact resume
    lrs = {r["step"]: r["lr"] for r in log if "lr" in r}
    assert lrs[6] < 0.6 * lrs[4]  # the schedule continues at half the rate


def test_checkpoints_rotate_keeping_the_last_n(tmp_path):
    run = tiny_run(max_steps=10, save_interval=2, eval_interval=100, keep_last=3)
    train(run, str(tmp_path), corpus=tiny_corpus(), progress=False)
    assert sorted(os.listdir(tmp_path / "history")) == ["step-00000006", "step-00000008"]
    assert load_training_state(str(tmp_path / "last")).step == 10
    assert load_training_state(str(tmp_path / "history" / "step-00000006")).step == 6


def test_a_kill_in_the_middle_of_a_checkpoint_swap_is_repaired(tmp_path):
    corpus = tiny_corpus()
    train(tiny_run(max_steps=4, save_interval=2, eval_interval=100), str(tmp_path), corpus=corpus, progress=False)
    last = tmp_path / "last"
    # killed after renaming the old checkpoint aside, before the new one was complete
    os.rename(last, tmp_path / ".last.old-99999")
    os.makedirs(tmp_path / ".last.tmp-99998")
    (tmp_path / ".last.tmp-99998" / "config.json").write_text("{")
    assert load_training_state(str(last)).step == 4
    assert sorted(os.listdir(tmp_path)).count("last") == 1 and not list(tmp_path.glob(".last.*"))
    # killed after the new checkpoint was complete but before it was renamed into place
    shutil.copytree(last, tmp_path / ".last.tmp-99997")
    os.rename(last, tmp_path / ".last.old-99996")
    os.utime(tmp_path / ".last.tmp-99997")  # the newer of the two
    resumed = train(tiny_run(max_steps=6, save_interval=2, eval_interval=100), str(tmp_path), corpus=corpus,
                    progress=False, resume=True)  # fmt: skip
    assert resumed.step == 6 and not list(tmp_path.glob(".last.*"))


TINY_CLI = ["--tokenizer", "char", "--quiet", "--set", "eval_interval=1000", "log_interval=1", "n_layer=2",
            "d_model=16", "n_head=2", "d_head=8", "d_inner=32", "mem_len=8", "tgt_len=8", "batch_size=4",
            "eval_max_segments=2", "warmup_steps=3", "save_every_s=0"]  # fmt: skip
TRAIN = [sys.executable, "-m", "longseq", "train"]


def losses(path) -> dict:
    return {r["step"]: r["loss"] for r in records(path) if "loss" in r}


def logged_steps(path) -> int:
    try:
        return len(losses(path))
    except (FileNotFoundError, json.JSONDecodeError):
        return 0


def pause_when(condition, proc, seconds=120):
    """Wait until ``condition()`` holds for the running ``proc``, then stop it (SIGSTOP) where it is: a fault is then
    injected into a live run however fast the machine is (SIGCONT lets it go on)."""
    deadline = time.time() + seconds
    while not condition() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGSTOP)
    assert proc.poll() is None, "the run ended before the fault could be injected"


def test_sigkill_at_random_moments_then_resume_gives_the_same_losses(tmp_path):
    """The CLI run is killed with SIGKILL twice at random moments (checkpoints are written every step, so kills
    land inside saves too); resuming gives the uninterrupted run's losses bit for bit."""
    settings = ["--data", str(corpus_file(tmp_path)), *TINY_CLI, "max_steps=60", "save_interval=1"]
    subprocess.run([*TRAIN, "--out", str(tmp_path / "whole"), *settings], check=True, capture_output=True)
    out = tmp_path / "killed"
    rng = random.Random(7)
    for attempt in range(2):
        extra = ["--resume"] if attempt else []
        proc = subprocess.Popen([*TRAIN, "--out", str(out), *extra, *settings], stderr=subprocess.DEVNULL)
        start = load_training_state(str(out / "last")).step if attempt else 0  # the run is not alive here
        target = start + rng.randint(3, 12)
        pause_when(lambda target=target: logged_steps(out) >= target, proc)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert proc.returncode == -signal.SIGKILL  # killed mid-run, not finished
        assert load_training_state(str(out / "last")).step < 60
    subprocess.run([*TRAIN, "--out", str(out), "--resume", *settings], check=True, capture_output=True)
    assert losses(out) == losses(tmp_path / "whole") and len(losses(out)) == 60


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_scheduler_signal_saves_a_checkpoint_that_resumes_bit_for_bit(tmp_path, sig):
    """No checkpoint is due (no evaluation, no save interval, no time cadence) when the signal comes: the run saves
    last/ at the next step boundary, exits 128 + signal with the resume command, and --resume continues exactly."""
    settings = ["--data", str(corpus_file(tmp_path)), *TINY_CLI, "max_steps=40"]
    subprocess.run([*TRAIN, "--out", str(tmp_path / "whole"), *settings], check=True, capture_output=True)
    out = tmp_path / "stopped"
    proc = subprocess.Popen([*TRAIN, "--out", str(out), *settings], stderr=subprocess.PIPE, text=True)
    pause_when(lambda: logged_steps(out) >= 5, proc)
    proc.send_signal(sig)
    proc.send_signal(signal.SIGCONT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + sig, err[-2000:]
    assert f"stopped by {signal.Signals(sig).name}" in err and "resume with: longseq train" in err and "--resume" in err
    stopped_at = load_training_state(str(out / "last")).step
    assert 5 <= stopped_at < 40 and not (out / "best").exists()  # nothing had been saved before the signal
    subprocess.run([*TRAIN, "--out", str(out), "--resume", *settings], check=True, capture_output=True)
    assert losses(out) == losses(tmp_path / "whole") and len(losses(out)) == 40


def test_sigterm_during_a_checkpoint_save_is_taken_after_the_save(tmp_path, monkeypatch):
    """SIGTERM arriving in the middle of writing a checkpoint: the save completes, the run stops at that step,
    and the resumed run gives the uninterrupted run's losses bit for bit."""
    from longseq.train import Interrupted
    from longseq.train import checkpoint as checkpoint_module

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


def test_a_second_trainer_on_a_locked_run_is_refused_and_the_first_finishes_unharmed(tmp_path):
    settings = ["--data", str(corpus_file(tmp_path)), *TINY_CLI, "max_steps=40", "save_interval=5"]
    subprocess.run([*TRAIN, "--out", str(tmp_path / "alone"), *settings], check=True, capture_output=True)
    out = tmp_path / "shared"
    first = subprocess.Popen([*TRAIN, "--out", str(out), *settings], stderr=subprocess.DEVNULL)
    pause_when(lambda: logged_steps(out) >= 7, first)  # paused past its first save, holding the lock
    for extra in (["--resume"], ["--overwrite"]):
        second = subprocess.run([*TRAIN, "--out", str(out), *extra, *settings], capture_output=True, text=True)
        assert second.returncode == 2 and "is being trained into by pid" in second.stderr, second.stderr[-1000:]
    first.send_signal(signal.SIGCONT)
    assert first.wait(timeout=300) == 0
    assert losses(out) == losses(tmp_path / "alone") and len(losses(out)) == 40


def finetune_command(tmp_path, lm, out, *extra):
    rows = [{"text": "hh gfe " * 3 + ("abc" if i % 2 else "defg"), "label": i % 2} for i in range(16)]
    (tmp_path / "cls.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return [sys.executable, "-m", "longseq", "finetune", "--task", "classify", "--data", str(tmp_path / "cls.jsonl"),
            "--checkpoint", lm, "--out", str(out), "--steps", "60", "--lr", "3e-3", "--batch-size", "4",
            "--segment-len", "8", "--quiet", "--json", *extra]  # fmt: skip


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_fine_tuning_killed_and_resumed_ends_bit_for_bit_where_the_whole_run_does(tmp_path, sig):
    from safetensors.torch import load_file

    train(tiny_run(max_steps=2, eval_interval=2), str(tmp_path / "lm"), corpus=tiny_corpus(), progress=False)
    lm = str(tmp_path / "lm" / "best")
    subprocess.run(finetune_command(tmp_path, lm, tmp_path / "whole"), check=True, capture_output=True)
    out = tmp_path / "cut"
    proc = subprocess.Popen(finetune_command(tmp_path, lm, out, "--save-interval", "1"), stderr=subprocess.DEVNULL)
    pause_when(lambda: logged_steps(out) >= 2, proc)  # logs every 6 steps (a tenth), saves every step
    proc.send_signal(sig)
    proc.send_signal(signal.SIGCONT)
    proc.wait(timeout=120)
    assert proc.returncode in (-signal.SIGKILL, 128 + signal.SIGTERM)
    assert 6 <= load_training_state(str(out / "last")).step < 60
    resumed = subprocess.run(finetune_command(tmp_path, lm, out, "--resume"), capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    whole, cut = (
        load_file(str(tmp_path / "whole" / "last" / "model.safetensors")),
        load_file(str(out / "last" / "model.safetensors")),
    )
    assert whole.keys() == cut.keys() and all(torch.equal(whole[k], cut[k]) for k in whole)
