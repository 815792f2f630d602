"""Bits per byte for every LM evaluation (issue 31, item 6).

Claims: a tokenizer counts the UTF-8 bytes of a file's text exactly from its ids (byte, char, byte-level BPE; a
word tokenizer the text of its words joined by single spaces, lines ended by a newline); ``evaluate``'s bpb is the
total NLL in bits over the bytes of the scored tokens, held to a naive computation from the decoded text, also
when the pass is cut short; a byte model's bpb is its bpc, a character model's differs where characters take
several bytes; the sliding-window evaluator, the trainer's validation records, ``longseq eval`` and ``longseq
train`` report it.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from longseq import ModelConfig
from longseq.data.tokenizers import ByteTokenizer, CharTokenizer, WordTokenizer, build_tokenizer
from longseq.eval.evaluate import evaluate, segment_losses
from longseq.eval.sliding import evaluate_sliding, sliding_window_losses
from longseq.model import TransformerXLLM

TEXT = "Grüße aus Köln, 東京 und Zürich!\nnaïve café — déjà vu.\n\nplain ascii line\n" * 6


def model_for(vocab_size: int, pos: str = "sinusoidal") -> TransformerXLLM:
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=vocab_size, n_layer=1, d_model=16, n_head=2, d_head=8, d_inner=32,
                            mem_len=8 if pos != "absolute" else 0, pos=pos)  # fmt: skip
    return TransformerXLLM(config).eval()


def canonical(text: str) -> str:
    """A word tokenizer's text: each line's words joined by one space, ended by a newline."""
    return "".join(" ".join(line.split()) + "\n" for line in text.split("\n")[:-1])


@pytest.mark.parametrize("kind", ["byte", "char", "bpe", "word"])
def test_the_ids_of_a_text_count_its_bytes(kind):
    text = TEXT if kind != "word" else canonical(TEXT.replace(",", " ,"))
    tokenizer = build_tokenizer(kind, text, vocab_size=300)
    ids = tokenizer.encode(text)
    assert tokenizer.text_bytes(ids) == len(text.encode("utf-8"))
    assert tokenizer.text_bytes(ids[5:], previous=ids[4:-1]) == len(text.encode("utf-8")) - tokenizer.text_bytes(
        ids[:5]
    )


def test_a_word_tokenizer_counts_its_canonical_text_not_its_decoding():
    tokenizer = WordTokenizer.build("the cat sat\n\non the mat\n")
    ids = tokenizer.encode("  the  cat sat \n\non the mat\n")  # the spacing of the file is not kept
    assert tokenizer.text_bytes(ids) == len("the cat sat\n\non the mat\n")
    assert tokenizer.decode(ids) == "the cat sat \n\non the mat \n"  # decoding pads every word with a space


def naive_bpb(model, tokenizer, ids, *, batch_size: int, tgt_len: int, max_segments: int = 0) -> tuple[float, int]:
    """Bits over the UTF-8 bytes of each stream's scored tokens decoded (the text those labels are)."""
    nll = list(segment_losses(model, ids, batch_size=batch_size, tgt_len=tgt_len, max_segments=max_segments))
    bits = sum(float(n.double().sum()) for n in nll) / math.log(2)
    scored = sum(n.size(1) for n in nll)  # tokens per stream
    rows = len(ids) // batch_size
    texts = [tokenizer.decode(ids[b * rows + 1 : b * rows + 1 + scored]) for b in range(batch_size)]
    n_bytes = sum(len(t.encode("utf-8")) for t in texts)
    return bits / n_bytes, n_bytes


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_evaluate_bits_per_byte_is_the_naive_count_of_the_decoded_text(kind):
    tokenizer = build_tokenizer(kind, TEXT, vocab_size=300)
    ids = tokenizer.encode(TEXT)
    model = model_for(tokenizer.vocab_size)
    for max_segments in (0, 2):  # a pass cut short counts the bytes of the tokens it scored
        metrics = evaluate(model, ids, batch_size=1, tgt_len=16, max_segments=max_segments, tokenizer=tokenizer,
                           bits_unit="bpc" if kind == "char" else None)  # fmt: skip
        expected, n_bytes = naive_bpb(model, tokenizer, ids, batch_size=1, tgt_len=16, max_segments=max_segments)
        assert metrics["bytes"] == n_bytes and metrics["bpb"] == pytest.approx(expected, rel=1e-12)
    assert metrics["tokens"] == 2 * 16 and metrics["bytes"] < len(TEXT.encode())
    if kind == "char":  # characters of several bytes: fewer bits per byte than per character
        chars = metrics["tokens"]
        assert metrics["bpb"] == pytest.approx(metrics["bpc"] * chars / metrics["bytes"], rel=1e-12)
        assert metrics["bpb"] < metrics["bpc"]


def test_several_streams_count_every_stream_s_scored_bytes():
    tokenizer = CharTokenizer.build(TEXT)
    ids = tokenizer.encode(TEXT)
    model = model_for(tokenizer.vocab_size)
    metrics = evaluate(model, ids, batch_size=3, tgt_len=8, max_segments=4, tokenizer=tokenizer)
    expected, n_bytes = naive_bpb(model, tokenizer, ids, batch_size=3, tgt_len=8, max_segments=4)
    assert metrics["bytes"] == n_bytes and metrics["bpb"] == pytest.approx(expected, rel=1e-12)


def test_a_byte_model_s_bpb_is_its_bpc():
    tokenizer = ByteTokenizer()
    ids = tokenizer.encode(TEXT)
    metrics = evaluate(model_for(256), ids, batch_size=2, tgt_len=16, bits_unit="bpc", tokenizer=tokenizer)
    assert metrics["bytes"] == metrics["tokens"] and metrics["bpb"] == pytest.approx(metrics["bpc"], rel=1e-12)


def test_a_word_model_s_bpb_counts_its_words_spaces_and_line_ends():
    text = canonical(TEXT)
    tokenizer = WordTokenizer.build(text)
    ids = tokenizer.encode(text)
    model = model_for(tokenizer.vocab_size)
    metrics = evaluate(model, ids, batch_size=1, tgt_len=8, tokenizer=tokenizer)
    bits = sum(float(n.double().sum()) for n in segment_losses(model, ids, batch_size=1, tgt_len=8)) / math.log(2)
    first = tokenizer.words[int(ids[0])]  # the first token is read, never scored
    assert metrics["bytes"] == len(text.encode()) - len(first.encode())
    assert metrics["bpb"] == pytest.approx(bits / metrics["bytes"], rel=1e-12)
    assert "bpc" not in metrics


def test_the_sliding_window_evaluator_reports_bpb_of_its_targets():
    tokenizer = CharTokenizer.build(TEXT)
    ids = tokenizer.encode(TEXT)
    model = model_for(tokenizer.vocab_size, pos="absolute")
    metrics = evaluate_sliding(model, ids, context=8, batch_size=8, max_targets=40, tokenizer=tokenizer)
    losses = sliding_window_losses(model, ids, context=8, batch_size=8, max_targets=40)
    n_bytes = len(tokenizer.decode(ids[1:41]).encode())
    assert metrics["bytes"] == n_bytes and metrics["bpb"] == pytest.approx(losses.sum() / math.log(2) / n_bytes)


def test_training_and_the_command_line_report_bpb(tmp_path, capsys):
    from support import records

    from longseq.cli import main

    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TEXT * 8)
    run = ["train", "--data", str(corpus), "--out", str(tmp_path / "run"), "--json", "--quiet", "--set", "n_layer=1",
           "d_model=16", "n_head=2", "d_head=8", "d_inner=32", "tgt_len=8", "mem_len=8", "eval_tgt_len=8",
           "batch_size=4", "eval_batch_size=2", "max_steps=2", "eval_interval=2", "eval_max_segments=3"]  # fmt: skip
    assert main(run) == 0
    summary = json.loads(capsys.readouterr().out.splitlines()[-1])
    valid = [r for r in records(tmp_path / "run") if "valid_loss" in r]
    assert valid[-1]["valid_bpb"] == summary["bpb"] and valid[-1]["valid_bytes"] > valid[-1]["valid_tokens"]
    assert summary["bpb"] < summary["bpc"]  # several bytes in some characters
    assert main(["eval", "--checkpoint", str(tmp_path / "run" / "best"), "--json", "--quiet", "--set",
                 "max_segments=3"]) == 0  # fmt: skip
    scored = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert scored["bpb"] == pytest.approx(summary["bpb"], rel=1e-9) and scored["bytes"] == valid[-1]["valid_bytes"]
    assert main(["eval", "--checkpoint", str(tmp_path / "run" / "best"), "--quiet", "--set", "max_segments=3"]) == 0
    text = capsys.readouterr().out
    assert text.index("bpc:") < text.index("bpb:") < text.index("tokens:")  # beside loss and perplexity


def test_no_tokenizer_no_bpb():
    ids = np.arange(200) % 20
    metrics = evaluate(model_for(20), ids, batch_size=2, tgt_len=8)
    assert "bpb" not in metrics and "bytes" not in metrics
