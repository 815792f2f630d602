"""The run directory: only what longseq wrote is ever replaced or deleted, a run that stopped before its first
checkpoint starts afresh, and a full disk names the file and what is safe."""

from __future__ import annotations

import json
import os

import pytest

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
        assert "holds best, which longseq did not write" in err and "never deletes" in err
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
    assert f"holds {name}, which longseq did not write" in capsys.readouterr().err
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


def test_a_non_finite_setting_is_a_config_error(tmp_path, text_corpus, capsys):
    for setting in ("lr=inf", "lr=nan", "weight_decay=inf", "init_std=nan"):
        assert main(["train", "--data", str(text_corpus), "--out", str(tmp_path / "r"), *TINY, setting]) == 2
        assert "finite number" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


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
    assert f"could not append to {out / 'metrics.jsonl'}: No space left on device" in err
    assert f"{out / 'last'} (step 4) is intact" in err and "--resume" in err
    monkeypatch.setattr(RunDirectory, "append_metrics", original)
    assert main([*argv, "--resume"]) == 0
