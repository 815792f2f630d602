"""Checkpoints: atomic, verified, never half-written.  Corruption, truncation and a manifest that omits files are
refused; a missing file or key is named; a failed save (a full disk) keeps the previous checkpoint; a kill in the
middle of a swap is repaired; rotation keeps the last N; RNG states round-trip; NaN weights are reported broken; a
checkpoint finds its corpus from any directory; a run directory resolves to its best/; format v1 checkpoints and
those of the backbone's older weight names load and score what they scored, and an old classifier keeps its
pooling."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from support import (
    ABC_TOKENIZER,
    TINY_CLI,
    assert_names,
    classify_run,
    label_first_documents,
    last_json,
    raises_naming,
    rewrite_listed,
    tiny_corpus,
    tiny_run,
)

from longseq import TrainConfig
from longseq.api import train
from longseq.cli import main
from longseq.data import (
    CharTokenizer,
)
from longseq.data.corpus import bundled_corpus_path
from longseq.eval import evaluate
from longseq.model import build_model
from longseq.tasks import task_for
from longseq.train import CheckpointError, load_checkpoint, save_checkpoint
from longseq.train import checkpoint as checkpoint_module
from longseq.train.checkpoint import TrainingState, load_training_state

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
    with raises_naming(CheckpointError, "manifest", "config.json", "tokenizer.json", "model.safetensors"):
        load_checkpoint(str(run_dir / "best"))
    assert main(["eval", "--checkpoint", str(run_dir / "best"), "--quiet"]) == 2
    assert "does not list" in capsys.readouterr().err


def test_a_training_checkpoint_must_list_its_training_state(run_dir):
    manifest = json.loads((run_dir / "last" / "manifest.json").read_text())
    del manifest["files"]["trainer.safetensors"]
    (run_dir / "last" / "manifest.json").write_text(json.dumps(manifest))
    with raises_naming(CheckpointError, "manifest", "trainer.safetensors"):
        load_training_state(str(run_dir / "last"))


def test_a_training_state_without_a_key_is_named(run_dir, capsys):
    state = json.loads((run_dir / "last" / "trainer_state.json").read_text())
    del state["data_state"]
    rewrite_listed(run_dir / "last", "trainer_state.json", json.dumps(state))
    with raises_naming(CheckpointError, "'data_state'", "trainer_state.json"):
        load_training_state(str(run_dir / "last"))
    argv = ["train", "--out", str(run_dir), "--resume", *TINY, "max_steps=3"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "data_state" in err and "Traceback" not in err


def test_a_gone_weights_file_is_named(run_dir, capsys):
    os.remove(run_dir / "last" / "model.safetensors")
    with raises_naming(CheckpointError, "missing", "model.safetensors"):
        load_training_state(str(run_dir / "last"))
    assert main(["eval", "--checkpoint", str(run_dir / "last"), "--quiet"]) == 2
    assert_names(capsys.readouterr().err, "missing", "model.safetensors")


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
    torch.nn.init.zeros_(model.transformer.stack.r_w_bias)
    with pytest.raises(CheckpointError, match="No space left"):
        save_checkpoint(str(tmp_path / "last"), model, run, tok)
    again, _, _, _ = load_checkpoint(str(tmp_path / "last"))
    for k, v in again.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".last")]


def test_a_failed_weight_write_keeps_the_previous_checkpoint_and_says_so(tmp_path, lm_checkpoint, monkeypatch):
    """safetensors reports a failed write (disk full) as SafetensorError, not OSError: it escaped the checkpoint's
    error handling as a bare traceback and left a temporary directory behind."""
    from safetensors import SafetensorError

    import longseq.train.checkpoint as checkpoint

    model, tokenizer, run, _ = load_checkpoint(lm_checkpoint)
    target = tmp_path / "ck"
    save_checkpoint(str(target), model, run, tokenizer)
    before = {p.name: p.read_bytes() for p in target.iterdir()}

    def full_disk(*args, **kwargs):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(checkpoint, "save_model", full_disk)
    with torch.no_grad():
        next(model.parameters()).add_(1.0)
    with raises_naming(CheckpointError, "No space left on device", "previous checkpoint", "intact"):
        save_checkpoint(str(target), model, run, tokenizer)
    assert {p.name: p.read_bytes() for p in target.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck", "lm"]  # no temporary directory left


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


def test_cuda_rng_states_round_trip_through_a_checkpoint(tmp_path, lm_checkpoint):
    model, tokenizer, run, _ = load_checkpoint(lm_checkpoint)
    states = [torch.randint(0, 255, (16,), dtype=torch.uint8), torch.randint(0, 255, (16,), dtype=torch.uint8)]
    training = TrainingState(
        step=3, data_state={"epoch": 0}, best_valid_loss=None, optimizer={"state": {}, "param_groups": []},
        torch_rng=torch.get_rng_state(), memory=None, tokens_seen=0, cuda_rng=states,
    )  # fmt: skip
    save_checkpoint(str(tmp_path / "ck"), model, run, tokenizer, training)
    loaded = load_training_state(str(tmp_path / "ck")).cuda_rng
    assert len(loaded) == 2 and all(torch.equal(a, b) for a, b in zip(loaded, states))


def test_a_checkpoint_with_nan_weights_is_reported_broken(tmp_path, lm_checkpoint, capsys):
    model, tokenizer, run, _ = load_checkpoint(lm_checkpoint)
    with torch.no_grad():
        next(model.parameters())[0].fill_(float("nan"))
    save_checkpoint(str(tmp_path / "broken"), model, run, tokenizer)
    capsys.readouterr()
    for argv in (["eval", "--checkpoint", str(tmp_path / "broken")],
                 ["generate", "--checkpoint", str(tmp_path / "broken"), "--prompt", "abc"]):  # fmt: skip
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "is broken" in err and "NaN" in err and "Traceback" not in err


def test_a_checkpoint_finds_its_corpus_from_any_directory_or_names_it(tmp_path, text_corpus, capsys, monkeypatch):
    data = text_corpus
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--data", os.path.basename(data), "--tokenizer", "char", "--out", "run", *TINY_CLI]) == 0
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    capsys.readouterr()
    assert main(["eval", "--checkpoint", str(tmp_path / "run" / "best"), "--json", "--quiet"]) == 0
    assert last_json(capsys)["tokens"] > 0
    os.rename(data, tmp_path / "moved.txt")
    assert main(["eval", "--checkpoint", str(tmp_path / "run" / "best"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "was trained on" in err and str(data) in err and "--data" in err


def test_eval_takes_a_run_directory_and_says_which_checkpoint(tmp_path, capsys):
    out = str(tmp_path / "run")
    assert main(["train", "--out", out, *TINY_CLI]) == 0
    capsys.readouterr()
    assert main(["eval", "--checkpoint", out, "--json", "--quiet", "--set", "max_segments=2"]) == 0
    captured = capsys.readouterr()
    assert "using its best/ checkpoint" in captured.err and json.loads(captured.out.splitlines()[-1])["tokens"] > 0


def test_a_checkpoint_whose_tokenizer_does_not_fit_the_model_is_an_error_naming_both_sizes(tmp_path):
    from longseq import DataConfig, ModelConfig, RunConfig
    from longseq.train import CheckpointError, load_checkpoint, save_checkpoint

    run = RunConfig(ModelConfig(vocab_size=12, n_layer=1, d_model=8, n_head=2, d_head=4, d_inner=16), DataConfig(),
                    TrainConfig())  # fmt: skip
    save_checkpoint(str(tmp_path / "ckpt"), build_model(run.model), run, CharTokenizer.build("abcdefghijklmnop"))
    with raises_naming(CheckpointError, "ckpt/tokenizer.json", "16", "12"):
        load_checkpoint(str(tmp_path / "ckpt"))


def test_a_checkpoint_saved_while_the_backbone_was_its_layer_stack_loads_and_scores_the_same(tmp_path, lm_checkpoint):
    """Before the backbone held its layer stack, the stack's weights were ``transformer.layers.*``,
    ``transformer.r_w_bias``, ...; today they are ``transformer.stack.*``.  A checkpoint of the old names loads
    (the backbone's load hook renames them) and gives the same logits."""
    from safetensors.torch import load_file

    model, tokenizer, run, _ = load_checkpoint(lm_checkpoint)
    stored = load_file(os.path.join(lm_checkpoint, "model.safetensors"))
    old = {name.replace("transformer.stack.", "transformer."): tensor for name, tensor in stored.items()}
    assert any(name.startswith("transformer.layers.") for name in old) and len(old) == len(stored)
    save_checkpoint(str(tmp_path / "old"), model, run, tokenizer, weights=old)
    loaded, _, _, _ = load_checkpoint(str(tmp_path / "old"))
    x = torch.randint(0, run.model.vocab_size, (2, 9))
    assert torch.equal(loaded(x).logits, model(x).logits)


FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")


@pytest.mark.parametrize("name", ["v1_plain", "v1_compact"])
def test_a_format_v1_checkpoint_loads_and_scores_the_same_loss(name):
    with open(os.path.join(FIXTURES, "v1_scores.json")) as f:
        record = json.load(f)
    model, tokenizer, run, _ = load_checkpoint(os.path.join(FIXTURES, name))
    with open(bundled_corpus_path(), encoding="utf-8") as f:
        ids = tokenizer.encode(f.read()[: record["text_chars"]])
    expected = record["scores"][name]
    result = evaluate(model, ids, batch_size=expected["batch_size"], tgt_len=expected["tgt_len"], kv_memory=False)
    assert result["tokens"] == expected["tokens"]
    assert result["loss"] == pytest.approx(expected["loss"], abs=1e-6)
    if name == "v1_compact":  # the renamed tensors arrived: compressors and memory tokens are not the init
        assert run.model.memory.cmem_len == 4 and run.model.memory.mem_tokens == 2
        assert not torch.equal(
            model.transformer.stack.memory_tokens, torch.zeros_like(model.transformer.stack.memory_tokens)
        )


def test_a_delta_model_saved_before_its_short_convolution_existed_loads_as_it_ran(tmp_path):
    """A ``delta`` model whose config was written before ``mixers.short_conv`` (the key absent) loads without the
    convolution, as it was trained, and gives the saved model's logits; a model saved today keeps its convolution
    (its weights among the loaded ones); a run.toml of that time trains again without it."""
    from longseq import DataConfig, ModelConfig, RunConfig
    from longseq.config.files import load_run_config, write_run_config

    fields = dict(vocab_size=12, n_layer=2, d_model=8, n_head=2, d_head=4, d_inner=16, dropout=0.0, chunk=8)
    tokenizer, x = CharTokenizer.build("abcdefghijkl"), torch.randint(0, 12, (2, 40))
    for name, conv in (("old", []), ("today", ["delta"])):
        run = RunConfig(
            ModelConfig(**fields, mixer=["delta", "attention"], short_conv=conv), DataConfig(), TrainConfig()
        )
        model = build_model(run.model).eval()
        save_checkpoint(str(tmp_path / name), model, run, tokenizer)
        if name == "old":  # as it was written before the option existed
            config = json.loads((tmp_path / name / "config.json").read_text())
            del config["run"]["model"]["mixers"]["short_conv"]
            rewrite_listed(tmp_path / name, "config.json", json.dumps(config))
        loaded, _, saved, _ = load_checkpoint(str(tmp_path / name))
        assert saved.model == run.model and saved.model.mixers.short_conv == conv
        assert (loaded.transformer.stack.layers[0].mixer.conv_weight is not None) == bool(conv)
        with torch.no_grad():
            torch.testing.assert_close(loaded(x).logits, model(x).logits, rtol=0, atol=0)
    written = tmp_path / "old-run.toml"  # a run.toml of that time, read again by train --config
    write_run_config(
        RunConfig(ModelConfig(**fields, mixer=["delta", "attention"]), DataConfig(), TrainConfig()), str(written)
    )
    written.write_text("\n".join(line for line in written.read_text().splitlines() if "short_conv" not in line))
    assert load_run_config(str(written)).model.mixers.short_conv == []


def test_a_run_records_its_pooling_and_an_old_checkpoint_keeps_last(tmp_path):
    from longseq.model.heads import DocumentClassifier
    from longseq.train.checkpoint import load_checkpoint, save_checkpoint

    train = label_first_documents(tmp_path / "train.jsonl", 6, seed=2)
    task = task_for(classify_run(train), ABC_TOKENIZER)
    assert task.prepare().task.pooling == "document"  # recorded in every checkpoint, so a later default changes nothing
    old = classify_run(train)
    save_checkpoint(str(tmp_path / "old"), DocumentClassifier(build_model(old.model), 3, "last"), old, ABC_TOKENIZER)
    config = json.loads((tmp_path / "old" / "config.json").read_text())  # as a format v2 run of before the change
    config["format"] = "longseq-checkpoint-v2"
    config["run"]["task"] = {"name": "classify", "options": {"train": train, "labels": ["blue", "green", "red"]}}
    rewrite_listed(tmp_path / "old", "config.json", json.dumps(config))
    model, _, run, _ = load_checkpoint(str(tmp_path / "old"))
    assert model.pooling == "last" and run.task.pooling == "last"


def test_a_linear_model_saved_before_its_restarts_existed_loads_as_it_ran(tmp_path):
    """A ``linear`` model whose config was written before ``mixers.reset_every`` and ``mixers.rotary`` (the keys
    absent) loads with both off, the unbounded, unrotated form it was trained with, and gives the saved model's
    logits; a model saved today keeps its own settings."""
    from longseq import DataConfig, ModelConfig, RunConfig

    fields = dict(vocab_size=12, n_layer=2, d_model=8, n_head=2, d_head=4, d_inner=16, dropout=0.0, chunk=8)
    tokenizer, x = CharTokenizer.build("abcdefghijkl"), torch.randint(0, 12, (2, 40))
    for name, settings in (("old", dict(reset_every=0, rotary=False)), ("today", dict(reset_every=16))):
        run = RunConfig(ModelConfig(**fields, mixer=["linear", "gla"], **settings), DataConfig(), TrainConfig())
        model = build_model(run.model).eval()
        save_checkpoint(str(tmp_path / name), model, run, tokenizer)
        if name == "old":  # as it was written before the two options existed
            config = json.loads((tmp_path / name / "config.json").read_text())
            del config["run"]["model"]["mixers"]["reset_every"], config["run"]["model"]["mixers"]["rotary"]
            rewrite_listed(tmp_path / name, "config.json", json.dumps(config))
        loaded, _, saved, _ = load_checkpoint(str(tmp_path / name))
        assert saved.model == run.model
        with torch.no_grad():
            torch.testing.assert_close(loaded(x).logits, model(x).logits, rtol=0, atol=0)


def test_load_checkpoint_takes_a_run_directory_as_every_command_does_and_says_which_checkpoint(lm_checkpoint):
    """``load_checkpoint(RUN_DIR)`` said "not a complete longseq checkpoint (no manifest.json)", which reads like
    corruption, while every command's ``--checkpoint`` takes a run directory: it takes one too, chooses as the
    commands do (best/, else last/) and names its choice in a warning."""
    import warnings

    from longseq.train.checkpoint import resolve_checkpoint

    run_dir = os.path.dirname(lm_checkpoint)
    with pytest.warns(UserWarning, match="run directory: using its best/"):
        model, _, run, metrics = load_checkpoint(run_dir)
    expected, _, expected_run, expected_metrics = load_checkpoint(lm_checkpoint)
    assert run == expected_run and metrics == expected_metrics
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), expected.state_dict().values()))
    assert resolve_checkpoint(run_dir) == lm_checkpoint  # the commands' choice
    shutil.rmtree(lm_checkpoint)
    with pytest.warns(UserWarning, match="using its last/"):
        assert load_checkpoint(run_dir)[2] == expected_run
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a checkpoint itself: nothing to say
        load_checkpoint(os.path.join(run_dir, "last"))
