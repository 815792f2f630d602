"""The command line end to end on a tiny run (train, eval, generate, resume), its errors one clear line each (exit
code 2, no traceback), and ``--json`` output that stays strict JSON when a number is not finite."""

from __future__ import annotations

import json
import os

import pytest
from support import TINY_CLI, assert_names, last_json, tiny_corpus, tiny_lstm_config, tiny_run

from longseq.api import train
from longseq.cli import main
from longseq.config import RunConfig


def test_cli_train_eval_generate(tmp_path, capsys):
    out = str(tmp_path / "run")
    assert main(["train", "--out", out, "--json", *TINY_CLI]) == 0
    result = last_json(capsys)
    for key in ("loss", "ppl", "tokens", "tokens_per_s", "bpc", "unigram_bpc"):
        assert key in result
    assert result["tokens"] == 4 * 2 * 16
    assert (
        main(["eval", "--checkpoint", f"{out}/best", "--json", "--quiet", "--set", "max_segments=3", "mem_len=48"]) == 0
    )
    metrics = last_json(capsys)
    assert metrics["tokens"] == 3 * 2 * 16 and metrics["bpc"] == pytest.approx(metrics["loss"] / 0.6931471805599453)
    args = ["generate", "--checkpoint", f"{out}/best", "--prompt", "ROMEO:", "--max-new-tokens", "12", "--json"]
    assert main([*args, "--seed", "3"]) == 0
    first = last_json(capsys)
    assert main([*args, "--seed", "3"]) == 0
    assert last_json(capsys)["text"] == first["text"] and len(first["text"]) == 12
    # resume continues to a larger max_steps
    assert main(["train", "--out", out, "--resume", "--json", "--quiet", "--set", "max_steps=6"]) == 0
    assert last_json(capsys)["step"] == 6


@pytest.mark.parametrize(
    "argv,words",
    [
        (["train", "--preset", "wt-103"], ("preset", "'wt-103'")),
        (["train", "--set", "mem_lenn=3"], ("mem_lenn", "mem_len")),
        (["train", "--set", "lr=fast"], ("lr", "number")),
        (["train", "--set", "dropout"], ("dropout", "key=value")),
        (["eval", "--checkpoint", "/nonexistent/ckpt"], ("/nonexistent/ckpt", "does not exist")),
        (["eval", "--checkpoint", ".", "--set", "window=3"], ("config key", "'window'")),
    ],
)
def test_cli_errors_are_one_clear_line(argv, words, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert_names(err, *words)
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_json_output_is_strict_json_when_a_number_is_not_finite(tmp_path, text_corpus, capsys):
    """``train --resume`` of a finished run printed ``"train_loss": NaN``: not JSON, so jq refused the line."""
    from longseq.cli.common import emit

    emit({"loss": float("nan"), "curve": [1.5, float("inf")], "nested": {"x": -float("inf")}, "n": 3}, True)
    strict = json.loads(capsys.readouterr().out, parse_constant=lambda name: pytest.fail(f"{name} in JSON output"))
    assert strict == {"loss": None, "curve": [1.5, None], "nested": {"x": None}, "n": 3}
    out = str(tmp_path / "run")
    assert main(["train", "--data", str(text_corpus), "--tokenizer", "char", "--out", out, *TINY_CLI]) == 0
    capsys.readouterr()
    assert main(["train", "--out", out, "--resume", "--json", *TINY_CLI]) == 0  # finished: no step trained
    line = capsys.readouterr().out.strip().splitlines()[-1]
    summary = json.loads(line, parse_constant=lambda name: pytest.fail(name))
    logged = [json.loads(row) for row in open(os.path.join(out, "metrics.jsonl"))]
    last_train = [row for row in logged if "loss" in row][-1]
    last_valid = [row for row in logged if "valid_loss" in row][-1]
    # it reported train_loss null and tokens_per_s 0.0 though metrics.jsonl holds the run's values
    assert summary["train_loss"] == last_train["loss"] and summary["tokens_per_s"] == last_train["tokens_per_s"] > 0
    assert summary["loss"] == last_valid["valid_loss"] and summary["step"] == last_valid["step"] == 4
    assert main(["train", "--out", out, "--resume", *TINY_CLI]) == 0  # the text summary said "loss: nan"
    text = capsys.readouterr().out
    assert "nan" not in text.lower() and f"train_loss: {last_train['loss']:.4f}\n" in text


def test_convert_names_what_it_cannot_write(tmp_path, lm_checkpoint, capsys):
    """convert --to-hf (no transformers needed) of an LSTM was an AttributeError ('crit'), an --out that cannot be made a bare OSError
    traceback."""
    run = tiny_run(max_steps=1, eval_interval=1)
    lstm = tmp_path / "lstm"
    train(RunConfig(tiny_lstm_config(), run.data, run.train), str(lstm), corpus=tiny_corpus(), progress=False)
    capsys.readouterr()
    to_hf = ["convert", "--to-hf", "--checkpoint", str(lstm), "--out", str(tmp_path / "hf")]
    assert main([*to_hf, "--format", "transfo-xl"]) == 2
    assert_names(capsys.readouterr().err, "language model", "HF TransfoXL", "LSTMLM")
    assert not (tmp_path / "hf").exists()
    assert main([*to_hf, "--quiet"]) == 0  # the transformers format holds every longseq language model
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["longseq"]["arch"] == "lstm"
    (tmp_path / "file").write_text("x")
    argv = ["convert", "--to-hf", "--checkpoint", lm_checkpoint, "--out", str(tmp_path / "file"), "--quiet"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert str(tmp_path / "file") in err and "Traceback" not in err


@pytest.mark.parametrize("form", ["longseq", "transfo-xl"])
def test_a_full_disk_during_convert_to_hf_leaves_no_broken_export_and_names_the_path(
    form, tmp_path, lm_checkpoint, capsys, monkeypatch
):
    """A full disk during ``convert --to-hf`` left a directory of half the files (a config.json without weights, or
    a truncated model.safetensors) and named no path.  The export is written beside ``--out`` and renamed into place:
    a write that fails (an OSError injected halfway) leaves ``--out`` as it was, new or an earlier export byte for
    byte, no temporary directory behind, and one line naming ``--out`` and the reason."""
    import errno

    from safetensors.torch import save_file

    import longseq.interop.hf_longseq as hf_longseq
    import longseq.interop.transfo_xl as transfo_xl

    out = tmp_path / "hf"
    argv = ["convert", "--to-hf", "--checkpoint", lm_checkpoint, "--out", str(out), "--format", form, "--quiet"]

    def full_disk(tensors, path, metadata=None):
        save_file(tensors, path, metadata=metadata)
        with open(path, "r+b") as f:
            f.truncate(os.path.getsize(path) // 2)
        raise OSError(errno.ENOSPC, "No space left on device", path)

    module = hf_longseq if form == "longseq" else transfo_xl
    monkeypatch.setattr(module, "save_file", full_disk)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert_names(err, str(out), "No space left on device", "nothing was written")
    assert "Traceback" not in err and not out.exists()
    assert not [name for name in os.listdir(tmp_path) if name.startswith(".hf.")]  # no temporary directory left
    monkeypatch.setattr(module, "save_file", save_file)
    assert main(argv) == 0  # an export, complete
    before = {name: (out / name).read_bytes() for name in os.listdir(out)}
    monkeypatch.setattr(module, "save_file", full_disk)
    assert main(argv) == 2  # over the earlier export: it stays whole
    assert_names(capsys.readouterr().err, str(out), "No space left on device", "intact")
    assert {name: (out / name).read_bytes() for name in os.listdir(out)} == before
    assert not [name for name in os.listdir(tmp_path) if name.startswith(".hf.")]


def test_threads_sets_torchs_cpu_threads_for_train_eval_and_generate(tmp_path, trained_checkpoint, capsys, monkeypatch):
    """On a shared CPU there was no way to set the thread count of train, eval or generate (``--threads`` was bench's
    alone): each takes ``--threads N`` and runs with torch's threads set to N; 0 is refused by name."""
    import torch

    before, seen = torch.get_num_threads(), []

    def spy(n):
        seen.append(n)
        real(n)

    real = torch.set_num_threads
    monkeypatch.setattr(torch, "set_num_threads", spy)
    target = 1 if before != 1 else 2
    commands = [
        ["train", "--out", str(tmp_path / "run"), *TINY_CLI],
        ["eval", "--checkpoint", trained_checkpoint, "--quiet", "--set", "max_segments=2"],
        ["generate", "--checkpoint", trained_checkpoint, "--prompt", "ab", "--max-new-tokens", "3", "--json"],
    ]
    try:
        for command in commands:
            seen.clear()
            assert main([*command, "--threads", str(target)]) == 0, command
            assert seen == [target] and torch.get_num_threads() == target, command
            real(before)
    finally:
        real(before)
    with pytest.raises(SystemExit):
        main(["eval", "--checkpoint", trained_checkpoint, "--threads", "0"])
    assert_names(capsys.readouterr().err, "--threads", ">= 1")
