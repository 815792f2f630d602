"""The adversarial pass of the reliability issue: ways a careful newcomer lost work, got a silently wrong number or a
bare traceback that the fifteen reported items did not cover.  One regression test each, on tiny models."""

import json

import numpy as np
import pytest
import torch
from test_faults import records
from test_train import corpus_file, tiny_corpus, tiny_run

from longseq.cli import main
from longseq.config import ModelConfig, RunConfig
from longseq.model import TransformerXLLM
from longseq.train import load_checkpoint, save_checkpoint, train
from longseq.train.checkpoint import CheckpointError


def tiny_config(**overrides) -> ModelConfig:
    """The model of ``tiny_run`` with fields of the model or its sections changed by name."""
    fields = dict(vocab_size=10, n_layer=2, d_model=16, n_head=2, d_head=8, d_inner=32, dropout=0.2, dropatt=0.1)
    return ModelConfig(**{**fields, "mem_len": 8, **overrides})


def tiny_lstm_config() -> ModelConfig:
    """The LSTM baseline of ``tiny_config``'s size: only the options an LSTM reads."""
    return ModelConfig(arch="lstm", vocab_size=10, n_layer=2, d_model=16, dropout=0.2)


def tiny_model(**overrides) -> TransformerXLLM:
    torch.manual_seed(0)
    return TransformerXLLM(tiny_config(**overrides))


def test_an_evaluation_that_scores_no_token_is_an_error_not_a_loss_of_zero():
    """``eval --context-curve 0,8 --skip-segments 1000`` printed loss 0.0 (a perfect model) over 0 tokens."""
    from longseq.eval.context import context_curve
    from longseq.eval.evaluate import evaluate

    model, ids = tiny_model(), tiny_corpus().valid[:81]  # 2 streams of 40: 5 segments of 8
    last = evaluate(model, ids, batch_size=2, tgt_len=8, skip_segments=4)
    assert last["tokens"] == 2 * 7 and last["loss"] > 0  # the last, shorter segment is scored alone
    for skip in (5, 1000):
        with pytest.raises(ValueError, match=f"no token was scored: the pass read 5 segment.* skip_segments={skip}"):
            evaluate(model, ids, batch_size=2, tgt_len=8, skip_segments=skip)
        with pytest.raises(ValueError, match="no token was scored"):
            context_curve(model, ids, [0, 8], tgt_len=8, batch_size=2, skip_segments=skip)


def classify_file(tmp_path) -> str:
    rows = [{"text": ["hh gfe abc", "cab defg"][i % 2] * 2, "label": i % 2} for i in range(8)]
    path = tmp_path / "cls.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return str(path)


def lm_checkpoint(tmp_path) -> str:
    train(tiny_run(max_steps=2, eval_interval=2), str(tmp_path / "lm"), corpus=tiny_corpus(), progress=False)
    return str(tmp_path / "lm" / "best")


def test_finetune_resume_extends_with_steps_and_refuses_what_it_cannot_change(tmp_path, capsys):
    """``finetune --resume --steps 6`` used to ignore --steps (and --task, --data, --lr ...) without a word."""
    lm, data = lm_checkpoint(tmp_path), classify_file(tmp_path)
    args = ["finetune", "--task", "classify", "--data", data, "--checkpoint", lm, "--segment-len", "8",
            "--batch-size", "4", "--quiet", "--json"]  # fmt: skip
    assert main([*args, "--out", str(tmp_path / "whole"), "--steps", "4"]) == 0
    assert main([*args, "--out", str(tmp_path / "ft"), "--steps", "2"]) == 0
    capsys.readouterr()
    assert main(["finetune", "--resume", "--out", str(tmp_path / "ft"), "--steps", "4", "--quiet", "--json"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["steps"] == 4
    losses = {name: [(r["step"], r["loss"]) for r in records(tmp_path / name / "metrics.jsonl") if "loss" in r]
              for name in ("whole", "ft")}  # fmt: skip
    assert losses["ft"] == losses["whole"] and len(losses["ft"]) == 4  # steps 3, 4 continue exactly
    before = (tmp_path / "ft" / "last" / "manifest.json").read_text()
    span = ["finetune", "--task", "span", "--data", data, "--checkpoint", lm, "--out", str(tmp_path / "span")]
    assert main([*span, "--pooling", "mean"]) == 2  # pooling is not an option of span
    assert "--pooling (task.pooling) is an option of the classify task, not of span" in capsys.readouterr().err
    other = ["finetune", "--resume", "--out", str(tmp_path / "ft"), "--task", "span", "--data", lm + "/x.jsonl"]
    assert main([*other, "--lr", "0.01", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "--task 'classify' -> 'span'" in err and "--data" in err and "--lr" not in err.split(".")[0]
    assert main([*args, "--out", str(tmp_path / "ft"), "--resume", "--steps", "4"]) == 0  # the same command: fine
    assert (tmp_path / "ft" / "last" / "manifest.json").read_text() == before  # already at step 4: untouched


def interrupt_json_writes_after(lines: int, monkeypatch) -> None:
    """A Ctrl-C inside :func:`longseq.data.tasks.write_jsonl`, after ``lines`` lines."""
    import longseq.data.tasks as tasks

    calls = [0]

    def dumps(row, **kwargs):
        calls[0] += 1
        if calls[0] > lines:
            raise KeyboardInterrupt
        return json.dumps(row, **kwargs)

    monkeypatch.setattr(tasks, "json", type("J", (), {"dumps": staticmethod(dumps), "loads": json.loads}))


def test_predict_never_writes_over_its_input_and_names_bad_files(tmp_path, capsys, monkeypatch):
    """``predict --data d.jsonl --out d.jsonl`` replaced the user's data with predictions; --out DIR was a bare
    IsADirectoryError, an empty file "torch.cat(): expected a non-empty list", a list label a silent 0 accuracy."""
    data = classify_file(tmp_path)
    ft = ["finetune", "--task", "classify", "--data", data, "--checkpoint", lm_checkpoint(tmp_path),
          "--segment-len", "8", "--batch-size", "4", "--steps", "1", "--out", str(tmp_path / "ft"), "--quiet"]  # fmt: skip
    assert main(ft) == 0
    original = open(data).read()
    predict = ["predict", "--checkpoint", str(tmp_path / "ft")]
    (tmp_path / "empty.jsonl").write_text("\n")
    (tmp_path / "list.jsonl").write_text('{"text": "abc", "label": 0}\n\n{"text": "abc", "label": [1]}\n')
    cases = [(data, data, "is the input file --data"), (data, str(tmp_path), "is a directory"),
             (str(tmp_path / "empty.jsonl"), "o.jsonl", "empty.jsonl: no records"),
             (str(tmp_path / "list.jsonl"), "o.jsonl", "list.jsonl:3: field 'label' has the wrong type list")]  # fmt: skip
    capsys.readouterr()
    for source, out, message in cases:
        assert main([*predict, "--data", source, "--out", out]) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err
    assert open(data).read() == original
    out = tmp_path / "out.jsonl"
    assert main([*predict, "--data", data, "--out", str(out)]) == 0
    complete = out.read_text()
    assert len(complete.splitlines()) == 8
    interrupt_json_writes_after(3, monkeypatch)  # Ctrl-C after three lines of the second write
    assert main([*predict, "--data", data, "--out", str(out)]) == 130
    assert out.read_text() == complete and sorted(p.name for p in tmp_path.iterdir() if "out.jsonl" in p.name) == [
        "out.jsonl"
    ]


def test_a_failed_weight_write_keeps_the_previous_checkpoint_and_says_so(tmp_path, monkeypatch):
    """safetensors reports a failed write (disk full) as SafetensorError, not OSError: it escaped the checkpoint's
    error handling as a bare traceback and left a temporary directory behind."""
    from safetensors import SafetensorError

    import longseq.train.checkpoint as checkpoint

    model, tokenizer, run, _ = load_checkpoint(lm_checkpoint(tmp_path))
    target = tmp_path / "ck"
    save_checkpoint(str(target), model, run, tokenizer)
    before = {p.name: p.read_bytes() for p in target.iterdir()}

    def full_disk(*args, **kwargs):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(checkpoint, "save_model", full_disk)
    with torch.no_grad():
        next(model.parameters()).add_(1.0)
    with pytest.raises(CheckpointError, match="No space left on device.*the previous checkpoint is intact"):
        save_checkpoint(str(target), model, run, tokenizer)
    assert {p.name: p.read_bytes() for p in target.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck", "lm"]  # no temporary directory left


def naive_greedy(model, prompt: torch.Tensor, n: int, window: int | None) -> torch.Tensor:
    """Greedy decoding that reads the whole text (or its last ``window`` tokens) again for every token."""
    ids = prompt
    with torch.no_grad():
        for _ in range(n):
            context = ids if window is None else ids[:, -window:]
            logits = model(context, None, mem_len=0).logits[:, -1]  # (B, V)
            ids = torch.cat([ids, logits.argmax(-1, keepdim=True)], dim=1)
    return ids[:, prompt.size(1) :]


def test_generation_from_an_lstm_and_a_vanilla_transformer_matches_reading_the_text_again():
    """generate on an LSTM checkpoint was AttributeError 'LSTMLM' has no 'read'; on the vanilla Transformer (absolute
    positions) a StopIteration from the key/value cache.  Greedy tokens equal reading the text again each step."""
    from longseq.generation import generate
    from longseq.model.lstm import LSTMLM

    prompt = torch.as_tensor(tiny_corpus().valid[:30].astype(np.int64))[None].repeat(2, 1)  # (2, 30)
    prompt[1, :5] = 3  # two different rows
    torch.manual_seed(0)
    lstm = LSTMLM(tiny_config(arch="lstm")).eval()
    assert torch.equal(generate(lstm, prompt, 12, temperature=0, segment_len=8), naive_greedy(lstm, prompt, 12, None))
    vanilla = tiny_model(pos="absolute", mem_len=0).eval()
    for window in (8, 16):
        got = generate(vanilla, prompt, 12, temperature=0, segment_len=window)
        assert torch.equal(got, naive_greedy(vanilla, prompt, 12, window))


def test_diagnose_and_convert_name_what_they_cannot_read_or_write(tmp_path, capsys, monkeypatch):
    """diagnose of an LSTM, a stack without attention or a fine-tuned checkpoint was an AttributeError or TypeError traceback, a
    negative --tgt-len or --warmup 'input_ids must be a non-empty integer tensor'; convert --to-hf of an LSTM or a
    fine-tuned model an AttributeError ('crit'); an --out that cannot be made a bare OSError traceback."""
    from longseq.diagnostics import diagnose
    from longseq.model.lstm import LSTMLM

    ids = tiny_corpus().valid
    for overrides, message in (({"mixer": "ssm,rnn"}, "has no attention layer .mixers ssm,rnn.*--per-position"),
                               ({"arch": "lstm"}, "holds a LSTMLM")):  # fmt: skip
        model = LSTMLM(tiny_config(**overrides)) if "arch" in overrides else tiny_model(**overrides)
        with pytest.raises(ValueError, match=message):
            diagnose(model, ids, str(tmp_path / "d"), tgt_len=8)
    for setting, value in (("tgt_len", -5), ("warmup", -1), ("batch_size", 0), ("max_segments", -1)):
        with pytest.raises(ValueError, match=f"diagnose: {setting} must be >= "):
            diagnose(tiny_model(), ids, str(tmp_path / "d"), **{"tgt_len": 8, setting: value})
    assert not (tmp_path / "d").exists()  # refused before anything was written

    lstm = tmp_path / "lstm"
    run = tiny_run(max_steps=1, eval_interval=1)
    train(RunConfig(tiny_lstm_config(), run.data, run.train), str(lstm), corpus=tiny_corpus(), progress=False)
    capsys.readouterr()
    to_hf = ["convert", "--to-hf", "--checkpoint", str(lstm), "--out", str(tmp_path / "hf")]
    assert main([*to_hf, "--format", "transfo-xl"]) == 2
    assert "only a language model exports to HF TransfoXL; this is a LSTMLM" in capsys.readouterr().err
    assert not (tmp_path / "hf").exists()
    assert main([*to_hf, "--quiet"]) == 0  # the transformers format holds every longseq language model
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["longseq"]["arch"] == "lstm"
    lm = lm_checkpoint(tmp_path)
    (tmp_path / "file").write_text("x")
    for argv in (["convert", "--to-hf", "--checkpoint", lm, "--out", str(tmp_path / "file")],
                 ["diagnose", "--checkpoint", lm, "--data", str(corpus_file(tmp_path)), "--out", str(tmp_path / "file")]):  # fmt: skip
        assert main([*argv, "--quiet"]) == 2
        err = capsys.readouterr().err
        assert str(tmp_path / "file") in err and "Traceback" not in err
    import longseq.diagnostics.report as report

    def read_only(path, *args, **kwargs):
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(report.os, "makedirs", read_only)
    assert (
        main(["diagnose", "--checkpoint", lm, "--data", str(corpus_file(tmp_path)), "--out", "/ro/d", "--quiet"]) == 2
    )
    assert "longseq diagnose: error: [Errno 13] Permission denied: '/ro/d'" in capsys.readouterr().err


def test_recl_limits_the_vanilla_transformer_and_the_lstm_to_each_context_by_sliding_windows(tmp_path, capsys):
    """RECL read the vanilla Transformer with a memory over absolute positions (it looked for ``config.pos``, which
    the config redesign moved to ``config.positions.pos``): its losses differed from the sliding windows the protocol
    asks by up to 0.4 nats a token.  An LSTM's context curve printed one loss for every memory length."""
    from longseq.eval.context import context_curve
    from longseq.eval.recl import context_losses
    from longseq.eval.sliding import sliding_window_losses
    from longseq.model.lstm import LSTMLM

    ids, run = tiny_corpus().valid[:120], tiny_run()
    torch.manual_seed(0)
    lstm = LSTMLM(tiny_lstm_config())
    for model in (tiny_model(pos="absolute", mem_len=0), lstm):
        for context in (4, 16):
            expected = sliding_window_losses(model, ids, context=context)
            np.testing.assert_allclose(context_losses(model, run, ids, context), expected, rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="the lstm reads its whole past"):
        context_curve(lstm, ids, [0, 8], tgt_len=8, batch_size=2)
    run = tiny_run(max_steps=1, eval_interval=1)
    train(RunConfig(lstm.config, run.data, run.train), str(tmp_path / "lstm"), corpus=tiny_corpus(), progress=False)
    capsys.readouterr()
    argv = ["eval", "--checkpoint", str(tmp_path / "lstm"), "--data", str(corpus_file(tmp_path)), "--quiet"]
    assert main([*argv, "--set", "mem_len=0"]) == 2  # was the same loss as with any memory, in silence
    assert "--set mem_len: the lstm reads its whole past" in capsys.readouterr().err


def test_listops_with_a_bad_argument_or_an_interruption_leaves_existing_files_whole(tmp_path, capsys, monkeypatch):
    """``data listops --out DIR --min-length 100 --max-length 50`` truncated DIR/train.jsonl to nothing before the
    generator refused the lengths; ``--train -1`` wrote an empty train file and reported success."""
    base = ["data", "listops", "--out", str(tmp_path / "lo"), "--valid", "2", "--test", "2", "--quiet"]
    good = [*base, "--train", "4", "--min-length", "10", "--max-length", "60"]
    assert main(good) == 0
    files = {p.name: p.read_text() for p in (tmp_path / "lo").iterdir()}
    assert sorted(files) == ["test.jsonl", "train.jsonl", "valid.jsonl"] and len(files["train.jsonl"].splitlines()) == 4
    capsys.readouterr()
    assert main([*base, "--train", "4", "--min-length", "100", "--max-length", "50"]) == 2
    assert "min_length <= max_length" in capsys.readouterr().err
    assert main([*base, "--train", "-1"]) == 2
    assert "--train must be >= 1 example, got -1" in capsys.readouterr().err
    interrupt_json_writes_after(5, monkeypatch)  # Ctrl-C in the middle of the second file
    assert main(good) == 130
    assert {p.name: p.read_text() for p in (tmp_path / "lo").iterdir()} == files


@pytest.mark.parametrize("argv,message", [(["eval", "--steps", "0"], "--steps must be >= 1, got 0"),
                                          (["train", "--batch", "-1"], "--batch must be >= 1, got -1"),
                                          (["generate", "--new-tokens", "0"], "--new-tokens must be >= 1, got 0"),
                                          (["eval-speed", "--attn-len", "0"], "--attn-len lengths must be >= 1")])  # fmt: skip
def test_bench_names_a_size_out_of_range_before_measuring_anything(argv, message, capsys, monkeypatch):
    """``bench eval --steps 0`` built the model, ran the memory-filling segments and died in a ZeroDivisionError."""
    import longseq.eval.speed as speed

    def never(*args, **kwargs):
        raise AssertionError("a benchmark ran")

    for name in ("eval_per_token", "train_throughput", "generate_speed", "eval_speed_vs_vanilla", "bench_config"):
        monkeypatch.setattr(speed, name, never)
    assert main(["bench", *argv]) == 2
    assert message in capsys.readouterr().err


def test_resuming_on_another_corpus_is_refused_and_on_a_moved_copy_accepted(tmp_path, capsys):
    """``train --resume --data OTHER`` continued the run's stream position in another corpus, with a warning only,
    and best/ then compared validation losses of two corpora.  The run records the sha256 of its token ids: other
    data is refused by name, the same bytes at a new path continue (said on stderr)."""
    import shutil

    from test_reliability import TINY

    first = corpus_file(tmp_path)
    other = tmp_path / "other.txt"
    other.write_text(first.read_text()[::-1])  # the same characters, another text
    moved = tmp_path / "moved" / "corpus.txt"
    moved.parent.mkdir()
    shutil.copy(first, moved)
    out = str(tmp_path / "run")
    assert main(["train", "--data", str(first), "--tokenizer", "char", "--out", out, *TINY, "max_steps=2"]) == 0
    capsys.readouterr()
    before = (tmp_path / "run" / "last" / "manifest.json").read_text()
    assert main(["train", "--data", str(other), "--out", out, "--resume", *TINY, "max_steps=4"]) == 2
    err = capsys.readouterr().err
    assert "not the data the run was trained on" in err and "train and valid splits differ" in err
    assert str(other) in err and "Traceback" not in err
    assert (tmp_path / "run" / "last" / "manifest.json").read_text() == before  # nothing was trained or saved
    assert main(["train", "--data", str(moved), "--out", out, "--resume", *TINY, "max_steps=3"]) == 0
    err = capsys.readouterr().err
    assert f"resuming on {moved}: the same token ids as {first}" in err


def test_json_output_is_strict_json_when_a_number_is_not_finite(tmp_path, capsys):
    """``train --resume`` of a finished run printed ``"train_loss": NaN``: not JSON, so jq refused the line."""
    from test_reliability import TINY

    from longseq.cli.common import emit

    emit({"loss": float("nan"), "curve": [1.5, float("inf")], "nested": {"x": -float("inf")}, "n": 3}, True)
    strict = json.loads(capsys.readouterr().out, parse_constant=lambda name: pytest.fail(f"{name} in JSON output"))
    assert strict == {"loss": None, "curve": [1.5, None], "nested": {"x": None}, "n": 3}
    out = str(tmp_path / "run")
    assert main(["train", "--data", str(corpus_file(tmp_path)), "--tokenizer", "char", "--out", out, *TINY]) == 0
    capsys.readouterr()
    assert main(["train", "--out", out, "--resume", "--json", *TINY]) == 0  # finished: no step, no training loss
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert json.loads(line, parse_constant=lambda name: pytest.fail(name))["train_loss"] is None
    assert main(["train", "--out", out, "--resume", *TINY]) == 0  # the text summary said "loss: nan"
    text = capsys.readouterr().out
    assert "nan" not in text.lower() and "train_loss: n/a" in text and "loss: n/a" in text


def test_vocab_size_with_a_tokenizer_it_cannot_size_is_an_error(tmp_path, capsys):
    """``--vocab-size`` was ignored in silence for byte, char and word tokenizers (train and data prepare)."""
    from test_reliability import TINY

    corpus = str(corpus_file(tmp_path))
    out = str(tmp_path / "run")
    assert main(["train", "--data", corpus, "--tokenizer", "char", "--vocab-size", "512", "--out", out, *TINY]) == 2
    assert "--vocab-size sizes a BPE" in capsys.readouterr().err and not (tmp_path / "run").exists()
    prepare = ["data", "prepare", "--data", corpus, "--out", str(tmp_path / "p"), "--quiet"]
    assert main([*prepare, "--tokenizer", "word", "--vocab-size", "512"]) == 2
    assert "not 'word'" in capsys.readouterr().err and not (tmp_path / "p").exists()
    assert main([*prepare, "--tokenizer", "char"]) == 0  # without it: as before


def test_an_unseen_character_in_a_task_file_names_the_file_and_record(tmp_path, capsys):
    """An unseen character in a fine-tuning record said "at line 1, column 1" of the record's text alone."""
    data = tmp_path / "cls.jsonl"
    rows = [{"text": "abc cab", "label": 0}, {"text": "cab dZe", "label": 1}]
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    argv = ["finetune", "--task", "classify", "--data", str(data), "--checkpoint", lm_checkpoint(tmp_path),
            "--segment-len", "8", "--batch-size", "2", "--steps", "1", "--out", str(tmp_path / "ft"), "--quiet"]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"{data}: record 2, field 'text': character 'Z'" in err and "Traceback" not in err


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
