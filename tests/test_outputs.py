"""Every command that writes refuses, by name, a target holding something it did not write, and deletes nothing
there; its own earlier output it replaces (a rerun works).  Training and ``data prepare`` have their own tests
(test_run_directory.py, test_prepared.py); here: convert both ways, diagnose, eval --plot, plot, predict, recall,
data listops, and a path inside a run directory that a trainer holds."""

from __future__ import annotations

import fcntl
import os

import pytest
from support import assert_names, train_tiny_lm

from longseq.cli import main

USER_FILE, USER_TEXT = "notes.txt", "my own notes, not longseq's\n"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> str:
    """A tiny trained language model (``best/`` of a two-step run): read by the tests, never written."""
    return train_tiny_lm(tmp_path_factory.mktemp("ckpt"))


@pytest.fixture(scope="module")
def export(checkpoint, tmp_path_factory) -> str:
    """The checkpoint exported to the transformers format by ``convert --to-hf``."""
    out = str(tmp_path_factory.mktemp("export") / "hf")
    assert main(["convert", "--to-hf", "--checkpoint", checkpoint, "--out", out]) == 0
    return out


def user_folder(path) -> str:
    path.mkdir(parents=True, exist_ok=True)
    (path / USER_FILE).write_text(USER_TEXT)
    return str(path)


def refused(argv, capsys, *words) -> None:
    """``argv`` exits 2 naming ``words``, and no file the user had is changed (every test checks its own)."""
    capsys.readouterr()
    assert main(argv) == 2
    assert_names(capsys.readouterr().err, *words)


def snapshot(directory) -> dict[str, bytes]:
    out = {}
    for root, _, files in os.walk(directory):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, directory)] = f.read()
    return out


def test_convert_from_hf_keeps_a_run_a_checkpoint_and_a_users_folder(checkpoint, export, tmp_path, capsys):
    """``convert --from-hf DIR --out X`` replaced the whole of X with exit 0: a run lost last/, best/ and its log."""
    run_dir = os.path.dirname(checkpoint)
    for target in (run_dir, checkpoint, user_folder(tmp_path / "mine")):
        before = snapshot(target)
        refused(["convert", "--from-hf", export, "--out", target], capsys, target, "did not write")
        assert snapshot(target) == before
    out = str(tmp_path / "converted")
    for _ in range(2):  # its own conversion it replaces
        assert main(["convert", "--from-hf", export, "--out", out]) == 0
    from longseq.train.checkpoint import load_checkpoint

    assert load_checkpoint(out)[3]["converted_from"] == os.path.abspath(export)


def test_convert_to_hf_keeps_the_checkpoint_it_reads_and_a_users_folder(checkpoint, tmp_path, capsys):
    """``convert --to-hf --checkpoint C --out C`` wrote the export over the checkpoint, which no longer loaded."""
    from longseq.train.checkpoint import load_checkpoint

    before = snapshot(checkpoint)
    for fmt in ("longseq", "transfo-xl"):
        refused(["convert", "--to-hf", "--checkpoint", checkpoint, "--out", checkpoint, "--format", fmt], capsys,
                checkpoint, "manifest.json")  # fmt: skip
    assert snapshot(checkpoint) == before and load_checkpoint(checkpoint)[0] is not None
    mine = user_folder(tmp_path / "mine")
    refused(["convert", "--to-hf", "--checkpoint", checkpoint, "--out", mine], capsys, mine, USER_FILE)
    assert (tmp_path / "mine" / USER_FILE).read_text() == USER_TEXT
    for fmt in ("longseq", "longseq", "transfo-xl", "transfo-xl"):  # a rerun replaces its own export
        out = str(tmp_path / fmt)
        assert main(["convert", "--to-hf", "--checkpoint", checkpoint, "--out", out, "--format", fmt]) == 0


def test_recall_plot_eval_and_predict_never_write_over_a_file_they_did_not_write(checkpoint, tmp_path, capsys):
    """``recall RUN --out RUN/best/config.json`` overwrote a checkpoint file; a figure or predictions path holding a
    user's file was replaced likewise."""
    config = os.path.join(checkpoint, "config.json")
    text = open(config).read()
    refused(["recall", checkpoint, "--out", config], capsys, config, "recall report")
    (tmp_path / "photo.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 32)  # a PNG longseq did not draw
    (tmp_path / "data.jsonl").write_text('{"text": "abc", "label": 1}\n')
    photo, data = str(tmp_path / "photo.png"), str(tmp_path / "data.jsonl")
    run_dir = os.path.dirname(checkpoint)
    refused(["recall", checkpoint, "--plot", photo], capsys, photo, "figure")
    refused(["plot", run_dir, "--out", photo], capsys, photo, "figure")
    refused(["eval", "--checkpoint", checkpoint, "--per-position", "--plot", photo], capsys, photo, "figure")
    refused(["predict", "--checkpoint", checkpoint, "--data", config, "--out", data], capsys, data, "predictions")
    assert open(config).read() == text and (tmp_path / "data.jsonl").read_text().startswith('{"text"')
    assert (tmp_path / "photo.png").read_bytes()[8:] == b"\0" * 32
    for _ in range(2):  # a figure plot drew it draws again
        assert main(["plot", run_dir, "--out", str(tmp_path / "curves.png")]) == 0


def test_diagnose_and_listops_refuse_a_folder_with_other_files(checkpoint, tmp_path, capsys):
    mine = user_folder(tmp_path / "mine")
    refused(["diagnose", "--checkpoint", checkpoint, "--out", mine], capsys, mine, USER_FILE)
    refused(["data", "listops", "--out", mine, "--train", "2", "--valid", "1", "--test", "1"], capsys, mine, USER_FILE)
    assert os.listdir(mine) == [USER_FILE] and (tmp_path / "mine" / USER_FILE).read_text() == USER_TEXT
    small = ["--train", "3", "--valid", "2", "--test", "2", "--min-length", "20", "--max-length", "40"]
    for seed in ("1", "2"):  # its own ListOps files it writes again
        assert main(["data", "listops", "--out", str(tmp_path / "lo"), "--seed", seed, *small]) == 0
    (tmp_path / "lo" / "train.jsonl").write_text('{"text": "my own data", "label": "x"}\n')  # the user's, same name
    refused(["data", "listops", "--out", str(tmp_path / "lo"), *small], capsys, "train.jsonl")
    assert (tmp_path / "lo" / "train.jsonl").read_text().startswith('{"text": "my own data"')


def test_no_command_writes_into_a_run_that_a_trainer_holds(checkpoint, export, tmp_path, capsys):
    """Into a run that was training, convert deleted files under the trainer: a path in a locked run is refused."""
    run_dir = tmp_path / "live"
    run_dir.mkdir()
    lock = open(run_dir / ".lock", "a+")
    lock.write("pid 4242\n")
    lock.flush()
    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a trainer holds it
    try:
        inside = str(run_dir / "converted")
        refused(["convert", "--from-hf", export, "--out", inside], capsys, "being trained into", "pid 4242")
        refused(["plot", str(run_dir), "--out", str(run_dir / "c.png")], capsys, "being trained into")
        assert sorted(os.listdir(run_dir)) == [".lock"]
    finally:
        lock.close()
    assert main(["convert", "--from-hf", export, "--out", inside]) == 0  # released: a path of its own is fine


def test_a_finished_run_leaves_no_lock(tmp_path, text_corpus):
    """A finished run left its ``.lock``, which other commands then met as a file longseq did not write."""
    from support import TINY_CLI

    out = tmp_path / "run"
    assert main(["train", "--data", str(text_corpus), "--tokenizer", "char", "--out", str(out), *TINY_CLI]) == 0
    assert not (out / ".lock").exists()
    assert main(["train", "--out", str(out), "--resume", *TINY_CLI]) == 0
    assert not (out / ".lock").exists()
