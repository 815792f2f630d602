"""Exact resume, atomic and verified checkpoints, schedules, NaN guard."""

import json
import os

import numpy as np
import pytest
import torch
from support import tiny_corpus, tiny_run

from longseq import TrainConfig
from longseq.train import CheckpointError, TrainingError, learning_rate, load_checkpoint, save_checkpoint, train
from longseq.train import checkpoint as checkpoint_module


def test_resume_gives_bit_identical_losses(tmp_path):
    corpus = tiny_corpus()
    whole = train(tiny_run(), str(tmp_path / "whole"), corpus=corpus, progress=False)
    first = train(tiny_run(), str(tmp_path / "split"), corpus=corpus, progress=False, stop_after=6)
    second = train(tiny_run(), str(tmp_path / "split"), corpus=corpus, progress=False, resume=True)
    assert len(whole.losses) == 14 and len(first.losses) == 6 and len(second.losses) == 8
    assert first.losses + second.losses == whole.losses  # bit for bit
    a, _, _, _ = load_checkpoint(str(tmp_path / "whole" / "last"))
    b, _, _, _ = load_checkpoint(str(tmp_path / "split" / "last"))
    for (name, p), q in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(p, q), name

    # the metrics log of the resumed run matches the uninterrupted one
    def steps(path):
        with open(path) as f:
            return [json.loads(line)["step"] for line in f]

    assert steps(tmp_path / "whole" / "metrics.jsonl") == steps(tmp_path / "split" / "metrics.jsonl")


def test_training_reduces_loss_and_keeps_best(tmp_path):
    corpus = tiny_corpus()
    result = train(tiny_run(max_steps=30, eval_interval=10), str(tmp_path), corpus=corpus, progress=False)
    assert np.mean(result.losses[-5:]) < np.mean(result.losses[:5])
    _, _, _, metrics = load_checkpoint(str(tmp_path / "best"))
    assert metrics["loss"] == pytest.approx(result.best_valid_loss)


def test_nan_loss_is_a_clear_error(tmp_path):
    with pytest.raises(TrainingError, match="loss nan"):
        run = tiny_run(lr=1e30, warmup_steps=0, clip=0.0, nan_patience=0)
        train(run, str(tmp_path), corpus=tiny_corpus(), progress=False)
    with pytest.raises(TrainingError, match="no checkpoint to roll back to"):
        train(
            tiny_run(lr=1e30, warmup_steps=0, clip=0.0), str(tmp_path / "guarded"), corpus=tiny_corpus(), progress=False
        )


def test_checkpoint_corruption_and_truncation_are_reported(tmp_path):
    corpus = tiny_corpus()
    train(tiny_run(max_steps=2, eval_interval=2), str(tmp_path), corpus=corpus, progress=False)
    best = tmp_path / "best"
    weights = best / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-10] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="corrupt"):
        load_checkpoint(str(best))
    weights.write_bytes(bytes(data[:-100]))
    with pytest.raises(CheckpointError, match="truncated"):
        load_checkpoint(str(best))
    os.remove(best / "manifest.json")
    with pytest.raises(CheckpointError, match="manifest"):
        load_checkpoint(str(best))
    with pytest.raises(CheckpointError, match="does not exist"):
        train(tiny_run(), str(tmp_path / "fresh"), corpus=corpus, progress=False, resume=True)
    save_checkpoint(str(tmp_path / "weights"), *load_checkpoint(str(tmp_path / "last"))[:3])
    with pytest.raises(CheckpointError, match="weights only"):
        checkpoint_module.load_training_state(str(tmp_path / "weights"))


def test_failed_save_keeps_previous_checkpoint(tmp_path, monkeypatch):
    corpus = tiny_corpus()
    train(tiny_run(max_steps=2, eval_interval=2), str(tmp_path), corpus=corpus, progress=False)
    model, tok, run, _ = load_checkpoint(str(tmp_path / "last"))
    before = {k: v.clone() for k, v in model.state_dict().items()}

    def broken(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint_module, "save_model", broken)
    torch.nn.init.zeros_(model.transformer.r_w_bias)
    with pytest.raises(CheckpointError, match="No space left"):
        save_checkpoint(str(tmp_path / "last"), model, run, tok)
    again, _, _, _ = load_checkpoint(str(tmp_path / "last"))
    for k, v in again.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".last")]


def test_schedules():
    cfg = TrainConfig(max_steps=100, lr=1.0, min_lr=0.1, warmup_steps=10, schedule="cosine")
    assert learning_rate(0, cfg) == pytest.approx(0.1)
    assert learning_rate(9, cfg) == pytest.approx(1.0)
    assert learning_rate(10, cfg) == pytest.approx(1.0)
    assert learning_rate(100, cfg) == pytest.approx(0.1)
    assert learning_rate(55, cfg) == pytest.approx(0.55)
    linear = TrainConfig(max_steps=100, lr=1.0, min_lr=0.0, warmup_steps=0, schedule="linear")
    assert learning_rate(50, linear) == pytest.approx(0.5)
    inv = TrainConfig(max_steps=100, lr=1.0, warmup_steps=4, schedule="inv_sqrt")
    assert learning_rate(16, inv) == pytest.approx(0.5)
    assert learning_rate(70, TrainConfig(max_steps=100, lr=1.0, warmup_steps=4, schedule="constant")) == 1.0


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
