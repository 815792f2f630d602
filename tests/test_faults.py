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

import torch
from test_train import corpus_file, tiny_corpus, tiny_run

from longseq.train import load_checkpoint, train
from longseq.train.checkpoint import load_training_state


def records(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


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
    skipped = [r for r in records(tmp_path / "hit" / "metrics.jsonl") if "skipped" in r]
    assert [r["step"] for r in skipped] == [4] and "nan" in skipped[0]["skipped"]
    model, _, _, _ = load_checkpoint(str(tmp_path / "hit" / "last"))
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_consecutive_bad_steps_roll_back_and_lower_the_learning_rate(tmp_path):
    corpus = tiny_corpus()
    run = tiny_run(max_steps=12, save_interval=2, eval_interval=100, nan_patience=2, nan_lr_factor=0.5)
    result = train(run, str(tmp_path), corpus=corpus, progress=False, after_backward=inject_nan_at(5, times=2))
    assert result.step == 12
    log = records(tmp_path / "metrics.jsonl")
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


def test_sigkill_at_random_moments_then_resume_gives_the_same_losses(tmp_path):
    """The CLI run is killed with SIGKILL twice at random moments (checkpoints are written every step, so kills
    land inside saves too); resuming gives the uninterrupted run's losses bit for bit."""
    data = corpus_file(tmp_path)
    settings = ["--data", str(data), "--tokenizer", "char", "--quiet", "--set", "max_steps=24", "save_interval=1",
                "eval_interval=1000", "log_interval=1", "n_layer=2", "d_model=16", "n_head=2", "d_head=8",
                "d_inner=32", "mem_len=8", "tgt_len=8", "batch_size=4", "eval_max_segments=2", "warmup_steps=3"]  # fmt: skip
    command = [sys.executable, "-m", "longseq", "train"]
    subprocess.run([*command, "--out", str(tmp_path / "whole"), *settings], check=True, capture_output=True)
    out = tmp_path / "killed"
    rng = random.Random(7)
    for attempt in range(2):
        extra = ["--resume"] if attempt else []
        proc = subprocess.Popen([*command, "--out", str(out), *extra, *settings], stderr=subprocess.DEVNULL)
        deadline = time.time() + 120
        while not (out / "last").exists() and proc.poll() is None and time.time() < deadline:
            time.sleep(0.02)
        time.sleep(rng.uniform(0.0, 0.6))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert proc.returncode == -signal.SIGKILL  # killed mid-run, not finished
        assert load_training_state(str(out / "last")).step < 24
    subprocess.run([*command, "--out", str(out), "--resume", *settings], check=True, capture_output=True)

    def losses(path):
        return {r["step"]: r["loss"] for r in records(path / "metrics.jsonl") if "loss" in r}

    assert losses(out) == losses(tmp_path / "whole") and len(losses(out)) == 24
