"""Checkpoint files: the manifest must list every file a checkpoint needs, and a missing file or key is a
checkpoint error that names it (never a bare KeyError or "No such file")."""

from __future__ import annotations

import json
import os

import pytest

from longseq.cli import main
from longseq.train import CheckpointError, load_checkpoint
from longseq.train.checkpoint import load_training_state

TINY = ["--tokenizer", "char", "--quiet", "--set", "max_steps=2", "eval_interval=2", "eval_max_segments=2",
        "n_layer=1", "d_model=16", "n_head=2", "d_head=8", "d_inner=32", "batch_size=2", "tgt_len=8",
        "eval_tgt_len=8", "mem_len=8", "save_every_s=0"]  # fmt: skip


@pytest.fixture
def run_dir(tmp_path, text_corpus):
    out = tmp_path / "run"
    assert main(["train", "--data", str(text_corpus), "--out", str(out), *TINY]) == 0
    return out


def test_a_manifest_that_omits_files_verifies_nothing_and_is_refused(run_dir, capsys):
    """``{"format": ..., "files": {}}`` beside bit-flipped weights loaded and scored."""
    weights = run_dir / "best" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-5] ^= 0xFF
    weights.write_bytes(bytes(data))
    (run_dir / "best" / "manifest.json").write_text(json.dumps({"format": "longseq-checkpoint-v2", "files": {}}))
    with pytest.raises(CheckpointError, match="manifest does not list config.json, tokenizer.json, model.safetensors"):
        load_checkpoint(str(run_dir / "best"))
    assert main(["eval", "--checkpoint", str(run_dir / "best"), "--quiet"]) == 2
    assert "does not list" in capsys.readouterr().err


def test_a_training_checkpoint_must_list_its_training_state(run_dir):
    manifest = json.loads((run_dir / "last" / "manifest.json").read_text())
    del manifest["files"]["trainer.safetensors"]
    (run_dir / "last" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="does not list trainer.safetensors"):
        load_training_state(str(run_dir / "last"))


def rewrite_listed(directory, name, text):
    """Replace a checkpoint file and update its manifest entry, as a consistent but incomplete checkpoint."""
    from longseq.data.sources import file_sha256

    path = directory / name
    path.write_text(text)
    manifest = json.loads((directory / "manifest.json").read_text())
    manifest["files"][name] = {"size": os.path.getsize(path), "sha256": file_sha256(str(path))}
    (directory / "manifest.json").write_text(json.dumps(manifest))


def test_a_training_state_without_a_key_is_named(run_dir, capsys):
    state = json.loads((run_dir / "last" / "trainer_state.json").read_text())
    del state["data_state"]
    rewrite_listed(run_dir / "last", "trainer_state.json", json.dumps(state))
    with pytest.raises(CheckpointError, match="lacks key 'data_state' of .*trainer_state.json"):
        load_training_state(str(run_dir / "last"))
    argv = ["train", "--out", str(run_dir), "--resume", *TINY, "max_steps=3"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "data_state" in err and "Traceback" not in err


def test_a_gone_weights_file_is_named(run_dir, capsys):
    os.remove(run_dir / "last" / "model.safetensors")
    with pytest.raises(CheckpointError, match="is missing model.safetensors"):
        load_training_state(str(run_dir / "last"))
    assert main(["eval", "--checkpoint", str(run_dir / "last"), "--quiet"]) == 2
    assert "is missing model.safetensors" in capsys.readouterr().err
