"""The run directory: a rerun is refused and --overwrite starts over; only what longseq wrote is ever replaced or
deleted; a run that stopped before its first checkpoint starts afresh; an --out that is a file and a failed run
leave nothing behind; a second trainer on a locked run is refused without touching the live run's half-written
save; a full disk names the file and what is safe."""

from __future__ import annotations

import json
import os
import signal
import subprocess

import pytest
from support import FAULT_CLI, TINY_CLI, TRAIN_COMMAND, assert_names, logged_steps, pause_when, step_losses

from longseq.cli import main

TINY = ["--tokenizer", "char", "--quiet", "--set", "max_steps=3", "eval_interval=3", "eval_max_segments=2",
        "n_layer=1", "d_model=16", "n_head=2", "d_head=8", "d_inner=32", "batch_size=2", "tgt_len=8",
        "eval_tgt_len=8", "mem_len=8", "save_every_s=0"]  # fmt: skip


def test_overwrite_refuses_what_longseq_did_not_write_and_never_deletes_it(tmp_path, text_corpus, capsys):
    """A directory with the user's own best/ (no manifest) and notes.txt was refused as "already holds a run", then
    --overwrite deleted the folder."""
    out = tmp_path / "mine"
    (out / "best").mkdir(parents=True)
    (out / "best" / "weights.pt.txt").write_text("the user's own")
    (out / "notes.txt").write_text("notes")
    for flags in ([], ["--overwrite"], ["--resume"]):
        assert main(["train", "--data", str(text_corpus), "--out", str(out), *flags, *TINY]) == 2
        err = capsys.readouterr().err
        assert_names(err, "best", "did not write", "never deletes")
    assert (out / "best" / "weights.pt.txt").read_text() == "the user's own" and (out / "notes.txt").exists()
    (out / "best" / "weights.pt.txt").unlink()
    (out / "best").rmdir()
    assert main(["train", "--data", str(text_corpus), "--out", str(out), *TINY]) == 0  # notes.txt is left alone
    assert main(["train", "--data", str(text_corpus), "--out", str(out), "--overwrite", *TINY]) == 0
    assert (out / "notes.txt").read_text() == "notes" and (out / "best" / "manifest.json").exists()


@pytest.mark.parametrize("name, content", [("run.toml", "my = 'config'\n"), ("metrics.jsonl", "not json\n")])
def test_a_file_of_the_users_under_a_run_files_name_is_refused_by_name(tmp_path, text_corpus, capsys, name, content):
    out = tmp_path / "run"
    out.mkdir()
    (out / name).write_text(content)
    assert main(["train", "--data", str(text_corpus), "--out", str(out), "--overwrite", *TINY]) == 2
    assert_names(capsys.readouterr().err, name, "did not write")
    assert (out / name).read_text() == content


@pytest.mark.parametrize("flags", [[], ["--resume"]])
def test_a_run_that_died_before_its_first_checkpoint_starts_afresh(tmp_path, text_corpus, capsys, flags):
    """lr=inf gave three NaN steps and stopped before any checkpoint; it left run.toml and metrics.jsonl, so a rerun
    was refused ("continue it with --resume") and --resume failed ("last does not exist").  Either now starts the
    run afresh and says so; the dead run's log records are gone."""
    out = tmp_path / "run"
    assert main(["train", "--data", str(text_corpus), "--out", str(out), *TINY, "max_steps=4"]) == 0
    for name in ("last", "best"):  # what a run killed before its first save leaves: run.toml and its log
        for f in os.listdir(out / name):
            os.remove(out / name / f)
        os.rmdir(out / name)
    with open(out / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 99, "skipped": "loss nan"}) + "\n")
    capsys.readouterr()
    assert main(["train", "--data", str(text_corpus), "--out", str(out), *flags, *TINY]) == 0
    assert "stopped before its first checkpoint" in capsys.readouterr().err
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert max(steps) == 3 and 99 not in steps


def test_a_full_disk_while_logging_names_the_log_and_the_safe_checkpoint(tmp_path, text_corpus, capsys, monkeypatch):
    from longseq.train.rundir import RunDirectory

    original, calls = RunDirectory.append_metrics, {"n": 0}

    def full(self, record):
        calls["n"] += 1
        if record.get("step") == 5 and "loss" in record:
            raise OSError(28, "No space left on device")
        return original(self, record)

    monkeypatch.setattr(RunDirectory, "append_metrics", full)
    out = tmp_path / "run"
    argv = ["train", "--data", str(text_corpus), "--out", str(out), *TINY, "max_steps=6", "save_interval=2",
            "log_interval=1"]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert_names(err, str(out / "metrics.jsonl"), "No space left on device")
    assert_names(err, str(out / "last"), "step 4", "intact", "--resume")
    monkeypatch.setattr(RunDirectory, "append_metrics", original)
    assert main([*argv, "--resume"]) == 0


def test_rerunning_into_an_existing_run_is_refused_and_overwrite_starts_over(tmp_path, capsys):
    out = str(tmp_path / "run")
    assert main(["train", "--out", out, *TINY_CLI]) == 0
    before = (tmp_path / "run" / "metrics.jsonl").read_text()
    capsys.readouterr()
    assert main(["train", "--out", out, *TINY_CLI]) == 2
    err = capsys.readouterr().err
    assert "already holds a run" in err and "--resume" in err and "--overwrite" in err
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == before  # nothing touched
    assert main(["train", "--out", out, "--overwrite", *TINY_CLI, "max_steps=2", "eval_interval=1"]) == 0
    steps = [json.loads(line)["step"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert max(steps) == 2  # the old run's records are gone, not appended to


def test_out_pointing_at_a_file_and_a_failed_run_leave_nothing_behind(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    assert main(["train", "--out", str(tmp_path / "file"), *TINY_CLI]) == 2
    assert "is a file" in capsys.readouterr().err
    assert main(["train", "--out", str(tmp_path / "new"), "--data", str(tmp_path / "missing.txt"), *TINY_CLI]) == 2
    assert "does not exist" in capsys.readouterr().err and not (tmp_path / "new").exists()


def test_a_second_trainer_on_a_locked_run_is_refused_and_the_first_finishes_unharmed(tmp_path, text_corpus):
    settings = ["--data", str(text_corpus), *FAULT_CLI, "max_steps=40", "save_interval=5"]
    subprocess.run([*TRAIN_COMMAND, "--out", str(tmp_path / "alone"), *settings], check=True, capture_output=True)
    out = tmp_path / "shared"
    first = subprocess.Popen([*TRAIN_COMMAND, "--out", str(out), *settings], stderr=subprocess.DEVNULL)
    pause_when(lambda: logged_steps(out) >= 7, first)  # paused past its first save, holding the lock
    for extra in (["--resume"], ["--overwrite"]):
        second = subprocess.run([*TRAIN_COMMAND, "--out", str(out), *extra, *settings], capture_output=True, text=True)
        assert second.returncode == 2, second.stderr[-1000:]
        assert_names(second.stderr, "being trained into", "pid")
    first.send_signal(signal.SIGCONT)
    assert first.wait(timeout=300) == 0
    assert step_losses(out) == step_losses(tmp_path / "alone") and len(step_losses(out)) == 40


def test_a_refused_second_trainer_leaves_the_live_runs_half_written_save_alone(tmp_path):
    """A second process on a locked run repaired its checkpoint before asking for the lock: it deleted the live run's
    temporary checkpoint (``.last.tmp-PID``) in the middle of its save, and the live run then died (exit 2)."""
    import fcntl

    from longseq.config import ConfigError
    from longseq.train.rundir import RunDirectory

    out = tmp_path / "run"
    (out / "last").mkdir(parents=True)
    (out / "last" / "manifest.json").write_text('{"format": "longseq-checkpoint-v2", "files": {}}')  # its checkpoint
    saving = out / ".last.tmp-999999"  # the live run's save in progress
    saving.mkdir()
    (saving / "model.safetensors").write_bytes(b"half")
    lock = open(out / ".lock", "a+")
    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the live run holds the lock
    try:
        for flags in ({"resume": True, "overwrite": False}, {"resume": False, "overwrite": True}):
            with pytest.raises(ConfigError, match="is being trained into"):
                RunDirectory(str(out), **flags).open()
            assert (saving / "model.safetensors").read_bytes() == b"half"
    finally:
        lock.close()
