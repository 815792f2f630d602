"""The Trainer: training lowers the loss and keeps the best; an exact resume (bit-identical losses, weights and
log), and what a resume refuses (another model, other data; a moved copy of the same data continues); the NaN guard
(skip, roll back, lower the learning rate) and half precision (bf16 and fp16 with its loss scaler); per-layer
gradient norms; the memory-length curriculum; checkpoints by the clock; a time budget; samples during training; a
restored memory on the model's device."""

import json
import math
import shutil

import numpy as np
import pytest
import torch
from support import TINY_CLI, assert_names, assert_said, fit_tiny, raises_naming, records, tiny_corpus, tiny_run

from longseq import ConfigError, ModelConfig
from longseq.api import train
from longseq.cli import main
from longseq.config import RunConfig
from longseq.model import Memory
from longseq.tasks.lm import LanguageModeling
from longseq.train import TrainingError, load_checkpoint
from longseq.train.checkpoint import load_training_state
from longseq.train.trainer import Trainer


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
    with raises_naming(TrainingError, "checkpoint", "roll back"):
        train(
            tiny_run(lr=1e30, warmup_steps=0, clip=0.0), str(tmp_path / "guarded"), corpus=tiny_corpus(), progress=False
        )


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


def test_per_layer_gradient_norms_are_logged(tmp_path):
    train(tiny_run(max_steps=4, grad_norm_interval=2), str(tmp_path), corpus=tiny_corpus(), progress=False)
    with open(tmp_path / "metrics.jsonl") as f:
        norms = [r for r in map(json.loads, f) if "grad_norms" in r]
    assert [r["step"] for r in norms] == [2, 4]
    assert set(norms[0]["grad_norms"]) == {"embedding", "layer0", "layer1", "top"}
    assert all(math.isfinite(v) and v > 0 for v in norms[0]["grad_norms"].values())


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_half_precision_follows_float32_training(tmp_path, precision):
    """200 steps of a tiny model: bf16 autocast, and fp16 autocast with dynamic loss scaling, stay within 0.05 nats
    of float32 (mean over the last 50 steps)."""
    corpus = tiny_corpus()
    common = dict(max_steps=200, eval_interval=1000, log_interval=50, grad_accum=1, lr=3e-3)
    fp32 = train(tiny_run(**common), str(tmp_path / "fp32"), corpus=corpus, progress=False)
    half = train(tiny_run(**common, precision=precision), str(tmp_path / precision), corpus=corpus, progress=False)
    assert np.mean(fp32.losses[-50:]) < np.mean(fp32.losses[:10]) - 0.3  # it did learn
    assert abs(np.mean(half.losses[-50:]) - np.mean(fp32.losses[-50:])) < 0.05
    assert not all(a == b for a, b in zip(half.losses, fp32.losses))  # half precision really ran


def test_fp16_overflow_is_left_to_the_loss_scaler_and_resume_keeps_its_scale(tmp_path):
    """An infinite gradient under fp16 is an overflow: the loss scaler skips that update and halves its scale (the
    NaN guard stays quiet); a run stopped after it and resumed continues bit for bit and keeps the halved scale
    (the losses alone cannot tell: scaling by a power of two is exact)."""
    corpus = tiny_corpus()

    def poison_step_3():
        left = [1]

        def hook(step, model):
            if step == 3 and left[0]:
                left[0] -= 1
                next(model.parameters()).grad.fill_(float("inf"))

        return hook

    run = tiny_run(max_steps=8, eval_interval=1000, log_interval=1, precision="fp16", save_interval=4)
    whole = train(run, str(tmp_path / "whole"), corpus=corpus, progress=False, after_backward=poison_step_3())
    train(run, str(tmp_path / "split"), corpus=corpus, progress=False, stop_after=4, after_backward=poison_step_3())
    state = json.loads((tmp_path / "split" / "last" / "trainer_state.json").read_text())
    assert state["scaler"]["scale"] == 2.0**15  # 2^16 halved once
    resumed = train(run, str(tmp_path / "split"), corpus=corpus, progress=False, resume=True)
    assert resumed.losses == whole.losses[4:]
    state = json.loads((tmp_path / "split" / "last" / "trainer_state.json").read_text())
    assert state["scaler"]["scale"] == 2.0**15  # carried over the resume, not reset to 2^16
    with open(tmp_path / "whole" / "metrics.jsonl") as f:
        assert not any("skipped" in r for r in map(json.loads, f))


def test_fp16_nan_loss_is_skipped_and_rolled_back_like_float32(tmp_path):
    """A weight poisoned to inf makes every following loss NaN: under fp16 the guard skips those steps (the loss
    scaler is closed each time) and rolls back to the last checkpoint, and the run finishes."""

    def poison_step_3():
        left = [1]

        def hook(step, model):
            if step == 3 and left[0]:
                left[0] -= 1
                with torch.no_grad():
                    next(model.parameters()).fill_(float("inf"))

        return hook

    run = tiny_run(max_steps=6, eval_interval=1000, log_interval=1, precision="fp16", save_interval=2)
    result = train(run, str(tmp_path), corpus=tiny_corpus(), progress=False, after_backward=poison_step_3())
    with open(tmp_path / "metrics.jsonl") as f:
        log = list(map(json.loads, f))
    assert sum("skipped" in r for r in log) == 3 and sum("rollback" in r for r in log) == 1
    assert result.step == 6 and all(math.isfinite(x) for x in result.losses[-3:])


def test_memory_length_curriculum_grows_the_carried_memory(tmp_path):
    """mem_len_start=2 growing to mem_len=8 over 6 steps: after step k the memory holds mem_len_at(k) positions."""
    from longseq.tasks.lm import LanguageModeling, mem_len_at
    from longseq.train import Trainer

    run = tiny_run(max_steps=10, eval_interval=100, grad_accum=1, mem_len_start=2, mem_len_warmup_steps=6)
    run.data.varlen = False
    assert [mem_len_at(k, run.train, 8) for k in range(8)] == [2, 3, 4, 5, 6, 7, 8, 8]
    trainer = Trainer(LanguageModeling(run, corpus=tiny_corpus()), run, str(tmp_path), progress=False)
    trainer._open()
    lengths = []
    for _ in range(8):
        trainer.step()
        lengths.append(trainer.memory.mem_length)
    trainer.dir.close()
    assert lengths == [2, 3, 4, 5, 6, 7, 8, 8]


def test_memory_curriculum_as_a_fraction_of_the_run_scales_with_max_steps():
    """mem_len_warmup_frac=0.6 of 10 steps is the 6-step ramp above; of 20 steps it is a 12-step ramp; setting both
    forms, or a fraction outside [0, 1], is refused."""
    from longseq.tasks.lm import mem_len_at

    by_steps = tiny_run(max_steps=10, mem_len_start=2, mem_len_warmup_steps=6).train
    by_frac = tiny_run(max_steps=10, mem_len_start=2, mem_len_warmup_frac=0.6).train
    assert [mem_len_at(k, by_frac, 8) for k in range(12)] == [mem_len_at(k, by_steps, 8) for k in range(12)]
    longer = tiny_run(max_steps=20, mem_len_start=2, mem_len_warmup_frac=0.6).train
    assert longer.mem_len_ramp_steps == 12 and [mem_len_at(k, longer, 8) for k in (0, 6, 11, 12)] == [2, 5, 7, 8]
    with pytest.raises(ConfigError, match="not both"):
        tiny_run(mem_len_start=0, mem_len_warmup_steps=6, mem_len_warmup_frac=0.5)
    with raises_naming(ConfigError, "mem_len_warmup_frac", "[0, 1]"):
        tiny_run(mem_len_start=0, mem_len_warmup_frac=1.5)


def test_resume_with_a_changed_model_is_one_message_naming_the_fields(tmp_path, capsys):
    out = str(tmp_path / "run")
    assert main(["train", "--out", out, *TINY_CLI]) == 0
    capsys.readouterr()
    assert main(["train", "--out", out, "--resume", "--quiet", "--set", "d_model=32", "max_steps=6"]) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if "error" in line]
    assert len(errors) == 1 and "model.d_model: 16 -> 32" in errors[0] and "size mismatch" not in err


def test_checkpoints_are_saved_by_the_clock_between_evaluations(tmp_path, monkeypatch):
    """save_every_s: with a clock that advances 0.35 s a step and a 1 s cadence, last/ is saved at steps 3, 6, 9."""
    import longseq.train.trainer as trainer_module

    now = [0.0]
    monkeypatch.setattr(trainer_module.time, "monotonic", lambda: now[0])
    saves = []
    original = trainer_module.Trainer.save

    def recording(self, directory, with_state, metrics=None):
        if with_state:
            saves.append(self.step_count)
        return original(self, directory, with_state, metrics)

    monkeypatch.setattr(trainer_module.Trainer, "save", recording)

    def tick(step, model):
        now[0] += 0.35

    run = tiny_run(max_steps=10, eval_interval=100, save_every_s=1.0)
    train(run, str(tmp_path), corpus=tiny_corpus(), progress=False, after_backward=tick)
    assert saves == [3, 6, 9, 10]


def test_resuming_on_another_corpus_is_refused_and_on_a_moved_copy_accepted(tmp_path, text_corpus, capsys):
    """``train --resume --data OTHER`` continued the run's stream position in another corpus, with a warning only,
    and best/ then compared validation losses of two corpora.  The run records the sha256 of its token ids: other
    data is refused by name, the same bytes at a new path continue (said on stderr)."""

    first = text_corpus
    other = tmp_path / "other.txt"
    other.write_text(first.read_text()[::-1])  # the same characters, another text
    moved = tmp_path / "moved" / "corpus.txt"
    moved.parent.mkdir()
    shutil.copy(first, moved)
    out = str(tmp_path / "run")
    assert main(["train", "--data", str(first), "--tokenizer", "char", "--out", out, *TINY_CLI, "max_steps=2"]) == 0
    capsys.readouterr()
    before = (tmp_path / "run" / "last" / "manifest.json").read_text()
    assert main(["train", "--data", str(other), "--out", out, "--resume", *TINY_CLI, "max_steps=4"]) == 2
    err = capsys.readouterr().err
    assert_names(err, str(other), "train and valid splits differ")
    assert "Traceback" not in err
    assert (tmp_path / "run" / "last" / "manifest.json").read_text() == before  # nothing was trained or saved
    assert main(["train", "--data", str(moved), "--out", out, "--resume", *TINY_CLI, "max_steps=3"]) == 0
    err = capsys.readouterr().err
    assert_names(err, str(moved), str(first), "same token ids")


def loss_records(path) -> list[tuple[int, float]]:
    return [(r["step"], r["loss"]) for r in records(path) if "loss" in r]


def test_a_time_budget_stops_validates_saves_and_resumes_exactly(tmp_path):
    whole = fit_tiny(tmp_path / "whole", max_steps=6, eval_interval=4, log_interval=1)
    messages: list[str] = []
    timed = fit_tiny(tmp_path / "timed", messages.append, max_steps=6, eval_interval=4, log_interval=1, max_time_s=25)
    assert (timed.step, timed.stopped_on_time, timed.elapsed_s) == (3, True, 30.0)  # the boundary after 25 s
    assert_said(messages, "stopped on time", "step 3", "max_steps 6")
    valid = [r for r in records(tmp_path / "timed") if "valid_loss" in r]
    assert [r["step"] for r in valid] == [3]  # the final validation, off the eval_interval cadence
    best = json.loads((tmp_path / "timed" / "best" / "config.json").read_text())["metrics"]
    assert best["step"] == 3 and best["loss"] == valid[0]["valid_loss"]
    assert json.loads((tmp_path / "timed" / "last" / "trainer_state.json").read_text())["step"] == 3

    messages = []  # the same budget: the run's time (30 s) counts across resumes, so nothing is left
    again = fit_tiny(tmp_path / "timed", messages.append, resume=True, max_steps=6, eval_interval=4, log_interval=1,
                max_time_s=25)  # fmt: skip
    assert (again.step, again.stopped_on_time) == (3, True)
    assert_said(messages, "30s", "max_time_s 25")
    more = fit_tiny(tmp_path / "timed", resume=True, max_steps=6, eval_interval=4, log_interval=1, max_time_s=1000)
    assert (more.step, more.stopped_on_time, more.elapsed_s) == (6, False, 60.0)
    assert loss_records(tmp_path / "timed") == loss_records(tmp_path / "whole") and len(whole.losses) == 6


def test_train_json_says_it_stopped_on_time(tmp_path, text_corpus, capsys):

    from longseq.cli import main

    args = ["train", "--data", str(text_corpus), "--out", str(tmp_path / "run"), "--json", "--set",
            "n_layer=1", "d_model=16", "n_head=2", "d_head=8", "d_inner=32", "tgt_len=8", "mem_len=8",
            "batch_size=4", "eval_max_segments=2", "max_steps=100000", "max_time_s=0.001"]  # fmt: skip
    assert main(args) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out.splitlines()[-1])
    assert summary["stopped_on_time"] is True and 1 <= summary["step"] < 100000
    assert_names(captured.err, "stopped on time", f"step {summary['step']}", "max_steps 100000")
    assert summary["loss"] is not None and summary["elapsed_s"] >= 0.001


def test_samples_change_nothing_in_the_run(tmp_path):
    plain = fit_tiny(tmp_path / "plain", max_steps=4, eval_interval=100, log_interval=1)
    messages: list[str] = []
    sampled = fit_tiny(tmp_path / "sampled", messages.append, max_steps=4, eval_interval=100, log_interval=1,
                  sample_interval=2, sample_tokens=12, sample_prompt="abc")  # fmt: skip
    assert sampled.losses == plain.losses  # bit for bit
    assert loss_records(tmp_path / "sampled") == loss_records(tmp_path / "plain")
    samples = [m for m in messages if "sample of 12 tokens (temperature 0.8) after 'abc'" in m]
    assert [m.split(":")[0] for m in samples] == ["step 2", "step 4"]
    assert all(m.split("\n", 1)[1].startswith("abc") and len(m.split("\n", 1)[1]) == 3 + 12 for m in samples)
    from safetensors.torch import load_file

    a, b = (load_file(str(tmp_path / n / "last" / "model.safetensors")) for n in ("plain", "sampled"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_sample_reads_no_global_random_number_and_keeps_the_model_mode(tmp_path):
    run = tiny_run(sample_interval=1, sample_tokens=8, sample_temperature=1.0)
    task = LanguageModeling(run, corpus=tiny_corpus())
    task.run = task.prepare()
    model = task.build_model().train()
    state = torch.get_rng_state()
    header, first = task.sample(model, 7)
    assert torch.equal(torch.get_rng_state(), state) and model.training
    assert task.sample(model, 7)[1] == first and "after 'abc cab\\n hh defg'" in header  # 16 validation tokens
    greedy = LanguageModeling(tiny_run(sample_interval=1, sample_temperature=0.0), corpus=tiny_corpus())
    greedy.run = greedy.prepare()
    assert "(greedy)" in greedy.sample(model, 1)[0]


def test_sample_settings_are_checked(tmp_path):
    with raises_naming(ConfigError, "sample_prompt", "'xyz!'", "tokenizer"):
        LanguageModeling(tiny_run(sample_interval=1, sample_prompt="xyz!"), corpus=tiny_corpus()).prepare()
    for bad, message in (({"sample_interval": -1}, "sample_interval must be >= 0"),
                         ({"max_time_s": -1.0}, "max_time_s must be >= 0"),
                         ({"sample_temperature": -0.5}, "sample_temperature must be >= 0")):  # fmt: skip
        with pytest.raises(ConfigError, match=message):
            tiny_run(**bad)


def test_a_restored_memory_is_on_the_models_device(tmp_path):
    """Resume and the NaN rollback both go through Trainer.restore: the memory read from the checkpoint lands on
    the trainer's device (here ``meta``), every tensor of it."""
    from longseq.api import train
    from longseq.config import DataConfig, TrainConfig
    from longseq.data import CharTokenizer, Corpus
    from longseq.tasks.lm import LanguageModeling
    from longseq.train.checkpoint import load_training_state

    text = "abcab cabba bacca " * 100
    tok = CharTokenizer.build(text)
    ids = tok.encode(text)
    corpus = Corpus(ids[:1400], ids[1400:1600], ids[1600:], tok, "generated")
    run = RunConfig(ModelConfig(vocab_size=4, n_layer=2, d_model=8, n_head=2, d_head=4, d_inner=8, mem_len=4,
                                mixer=["attention", "ssm"], head_dim=4),
                    DataConfig(tgt_len=4, batch_size=2, eval_batch_size=2, eval_tgt_len=4),
                    TrainConfig(max_steps=3, eval_interval=3, device="cpu"))  # fmt: skip
    train(run, str(tmp_path / "run"), corpus=corpus, progress=False)
    state = load_training_state(str(tmp_path / "run" / "last"))
    assert state.memory is not None and all(t.device.type == "cpu" for layer in state.memory.layers
                                            for t in layer.all_tensors())  # fmt: skip
    trainer = Trainer(LanguageModeling(run, corpus=corpus), run, str(tmp_path / "run"), resume=True, progress=False)
    trainer.dir.open()
    try:
        trainer.build()
        trainer.device = torch.device("meta")
        trainer.restore(state)
    finally:
        trainer.dir.close()
    tensors = [t for layer in trainer.memory.layers for t in layer.all_tensors()]
    assert tensors and all(t.device.type == "meta" for t in tensors)
    assert isinstance(trainer.memory, Memory)


def test_a_training_step_reads_the_device_once(tmp_path):
    """The trainer's bookkeeping and the NaN guard read the step's loss and gradient norm together, once; the
    tasks keep their losses on the device (they read one value per segment before)."""
    from longseq.config import DataConfig, ModelConfig, RunConfig, TrainConfig
    from longseq.data import CharTokenizer, Corpus
    from longseq.diagnostics.syncs import HostSyncs
    from longseq.tasks.lm import LanguageModeling
    from longseq.train.trainer import Trainer

    text = "abcab cabba bacca " * 100
    tok = CharTokenizer.build(text)
    ids = tok.encode(text)
    corpus = Corpus(ids[:1400], ids[1400:1600], ids[1600:], tok, "generated")
    run = RunConfig(
        ModelConfig(vocab_size=4, n_layer=2, d_model=16, n_head=2, d_head=8, d_inner=32, mem_len=8),
        DataConfig(tgt_len=8, batch_size=4, eval_batch_size=2, eval_tgt_len=8),
        TrainConfig(max_steps=3, grad_accum=2),
    )
    trainer = Trainer(LanguageModeling(run, corpus=corpus), run, str(tmp_path / "run"), progress=False)
    trainer.dir.open()
    try:
        trainer.build()
        trainer.step()  # the memory fills
        with HostSyncs() as syncs:
            assert trainer.step()
    finally:
        trainer.dir.close()
    assert len(syncs.where) == 1 and "Tensor.tolist" in syncs.where[0], syncs.where


def test_the_path_from_a_step_to_the_score_function_is_short(tmp_path):
    """``benchmarks/tools/call_depth.py``'s count (frames, not time): from ``Trainer.step`` to the score function of
    the default model's kernel, at most 9 frames of longseq in 6 files (13 in 8 before the language model had one
    entry point); the chain goes through the one forward, the stack's loop and the layer, no pass-through frame."""
    import importlib.util
    import os

    path = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "tools", "call_depth.py")
    spec = importlib.util.spec_from_file_location("call_depth", path)
    call_depth = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(call_depth)
    depth = call_depth.measure(str(tmp_path / "run"))
    assert depth["frames"] <= 9 and depth["files"] <= 6, depth["chain"]
    names = [frame.split(" ")[0] for frame in depth["chain"]]
    assert names[0] == "step" and names[-1] == "_relative_scores" and "_recur" not in names, depth["chain"]
