"""Inputs that used to pass in silence: each gets a clear error or a warning that names it."""

from __future__ import annotations

import json

import pytest
import torch

from longseq import ModelConfig, TransformerXLLM
from longseq.cli import main

TINY = ["--quiet", "--set", "max_steps=2", "eval_interval=2", "eval_max_segments=2", "n_layer=1", "d_model=16",
        "n_head=2", "d_head=8", "d_inner=32", "batch_size=2", "tgt_len=8", "eval_tgt_len=8", "mem_len=8",
        "save_every_s=0"]  # fmt: skip


def words(vocab: list[str], n: int, seed: int) -> str:
    g = torch.Generator().manual_seed(seed)
    picks = torch.randint(0, len(vocab), (n,), generator=g).tolist()
    return "\n".join(" ".join(vocab[i] for i in picks[k : k + 10]) for k in range(0, n, 10)) + "\n"


def test_eval_reports_the_unknown_rate_and_warns_when_the_vocabulary_barely_covers(tmp_path, capsys):
    """A PTB word model on WikiText-2 printed ppl 7701 with 41.8% of the tokens <unk>, and nothing else."""
    own = [f"w{i}" for i in range(30)]
    (tmp_path / "a.txt").write_text(words(own, 3000, 0))
    (tmp_path / "b.txt").write_text(words(own[:20] + [f"x{i}" for i in range(12)], 3000, 1))  # ~3/8 unknown
    out = str(tmp_path / "run")
    assert main(["train", "--data", str(tmp_path / "a.txt"), "--tokenizer", "word", "--out", out, *TINY]) == 0
    capsys.readouterr()
    assert main(["eval", "--checkpoint", out, "--json", "--quiet", "--set", "max_segments=4"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out.splitlines()[-1])["unk_rate"] == 0.0 and "<unk>" not in captured.err
    assert main(["eval", "--checkpoint", out, "--data", str(tmp_path / "b.txt"), "--json", "--quiet"]) == 0
    captured = capsys.readouterr()
    rate = json.loads(captured.out.splitlines()[-1])["unk_rate"]
    assert 0.25 < rate < 0.5 and f"{rate:.1%} of the tokens of the valid split" in captured.err


def test_predict_refuses_gold_labels_the_classifier_does_not_know_and_scores_the_labelled(tmp_path, capsys):
    """a/b/c gold labels against a neg/pos classifier wrote neg/pos and reported accuracy 0.0; a file with some
    labels dropped the metric in silence."""
    lm = str(tmp_path / "lm")
    text = tmp_path / "c.txt"
    text.write_text("good bad fine poor\n" * 200)
    assert main(["train", "--data", str(text), "--tokenizer", "char", "--out", lm, *TINY]) == 0
    rows = [{"text": "good fine" if i % 2 else "bad poor", "label": "pos" if i % 2 else "neg"} for i in range(8)]
    (tmp_path / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    ft = str(tmp_path / "ft")
    argv = ["finetune", "--task", "classify", "--data", str(tmp_path / "train.jsonl"), "--checkpoint", lm, "--out", ft,
            "--steps", "2", "--segment-len", "8", "--batch-size", "4", "--quiet"]  # fmt: skip
    assert main(argv) == 0
    other = [{"text": "good", "label": x} for x in ("a", "b", "c")]
    (tmp_path / "other.jsonl").write_text("\n".join(json.dumps(r) for r in other) + "\n")
    capsys.readouterr()
    predict = ["predict", "--checkpoint", ft, "--out", str(tmp_path / "p.jsonl"), "--json"]
    assert main([*predict, "--data", str(tmp_path / "other.jsonl")]) == 2
    err = capsys.readouterr().err
    assert "does not know ('a', 'b', 'c')" in err and "it knows 'neg', 'pos'" in err
    some = [{"text": "good fine", "label": "pos"}, {"text": "bad poor"}, {"text": "bad", "label": "neg"}]
    (tmp_path / "some.jsonl").write_text("\n".join(json.dumps(r) for r in some) + "\n")
    assert main([*predict, "--data", str(tmp_path / "some.jsonl")]) == 0
    captured = capsys.readouterr()
    result = json.loads(captured.out.splitlines()[-1])
    assert result["scored"] == 2 and "accuracy" in result and "2 of the 3 records" in captured.err


def test_options_the_architecture_does_not_read_are_refused(tmp_path, text_corpus, capsys):
    """arch=lstm with cmem_len, attention=window and pos=shaw trained a plain LSTM while the log claimed an
    effective range of 96."""
    base = ["train", "--data", str(text_corpus), "--tokenizer", "char", "--out", str(tmp_path / "r"), *TINY]
    assert main([*base, "arch=lstm", "cmem_len=4", "cmem_rate=2", "attention=window", "pos=shaw"]) == 2
    err = capsys.readouterr().err
    for name in ("memory.cmem_len=4", "pattern.attention=window", "positions.pos=shaw", "n_head=2", "d_head=8"):
        assert name in err
    assert not (tmp_path / "r").exists()
    for setting, name in (["window=32", "pattern.window=32"], ["d_state=8", "mixers.d_state=8"],
                          ["max_relative_distance=9", "positions.max_relative_distance=9"]):  # fmt: skip
        assert main([*base, setting]) == 2
        assert name in capsys.readouterr().err
    assert main([*base, "attention=window", "window=32"]) == 0  # read: accepted
    assert main(["train", "--data", str(text_corpus), "--tokenizer", "char", "--out", str(tmp_path / "lstm"),
                 "--quiet", "--set", "arch=lstm", "max_steps=2", "eval_interval=2"]) == 0  # the preset's own: fine  # fmt: skip


def test_a_task_file_with_invalid_utf8_names_the_file_and_line(tmp_path, capsys):
    from longseq.data.tasks import TaskDataError, read_jsonl

    path = tmp_path / "bad.jsonl"
    path.write_bytes(b'{"text": "fine", "label": 0}\n{"text": "caf\xe9", "label": 1}\n')
    with pytest.raises(TaskDataError, match=r"bad.jsonl:2: not valid UTF-8 \(byte 14 of the line"):
        read_jsonl(str(path), "classify")


def test_validation_equal_to_training_data_and_a_split_shorter_than_a_segment_are_said(tmp_path, capsys):
    layout = tmp_path / "layout"
    layout.mkdir()
    for split in ("train", "valid", "test"):
        (layout / f"{split}.txt").write_text("the same text in every split\n" * 40)
    assert main(["train", "--data", str(layout), "--tokenizer", "char", "--out", str(tmp_path / "a"), *TINY]) == 0
    assert "holds the training split's tokens exactly" in capsys.readouterr().err
    (tmp_path / "short.txt").write_text("abcdefgh ij\n" * 12)
    assert main(["train", "--data", str(tmp_path / "short.txt"), "--tokenizer", "char", "--out",
                 str(tmp_path / "b"), *TINY]) == 0  # fmt: skip
    err = capsys.readouterr().err
    assert "has 7 tokens, not more than one segment (eval_tgt_len=8)" in err


def tiny_model() -> TransformerXLLM:
    torch.manual_seed(0)
    return TransformerXLLM(ModelConfig(vocab_size=20, n_layer=2, d_model=16, n_head=2, d_head=8, d_inner=32))


def test_the_model_checks_the_dtypes_of_mems_and_labels_by_name():
    """float64 mems into a float32 model failed deep in linear.py; integer mems and float labels were cast in
    silence."""
    model = tiny_model()
    ids = torch.randint(0, 20, (2, 6))
    mems = model(ids).mems
    for bad, dtype in (([m.double() for m in mems], "float64"), ([m.long() for m in mems], "int64")):
        with pytest.raises(
            ValueError, match=rf"mems\[0\] holds torch.{dtype} tensors, but the model reads torch.float32"
        ):
            model(ids, mems=bad)
    with pytest.raises(ValueError, match="labels must be integer token ids"):
        model(ids, labels=ids.float())
    with torch.autocast("cpu", dtype=torch.bfloat16):  # under autocast a half-precision memory is the model's own
        assert torch.isfinite(model(ids, mems=[m.bfloat16() for m in mems], labels=ids).loss)


def test_a_loss_over_no_labelled_token_is_nan_not_zero():
    model = tiny_model()
    ids = torch.randint(0, 20, (2, 6))
    out = model(ids, labels=torch.full_like(ids, -100))
    assert torch.isnan(out.loss) and torch.equal(out.nll, torch.zeros(2, 6))
    some = torch.full_like(ids, -100)
    some[0, 2] = 5
    assert torch.isfinite(model(ids, labels=some).loss)
