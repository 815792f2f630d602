"""Corpora and batching: files, layouts and directories of documents read and split, the published sizes, the
checks on what a run reads (empty, not UTF-8, a missing split, a validation split equal to the training one or
shorter than a segment, another corpus's vocabulary), and the ordered stream (rows continued across segments,
document ids carried, an exact resume)."""

import os

import numpy as np
import pytest
from support import TINY_CLI_8, assert_names, raises_naming

from longseq.cli import main
from longseq.data import (
    CharTokenizer,
    CorpusError,
    OrderedStream,
    load_corpus,
)

SHARED = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data")


@pytest.mark.skipif(not os.path.isdir(os.path.join(SHARED, "ptb")), reason="shared PTB not present")
def test_ptb_token_counts_match_published():
    corpus = load_corpus(os.path.join(SHARED, "ptb"), "word")
    assert (len(corpus.train), len(corpus.valid), len(corpus.test)) == (929_589, 73_760, 82_430)
    assert corpus.tokenizer.vocab_size == 10_000


def test_single_file_splits_90_5_5_and_directory_of_documents(tmp_path):
    (tmp_path / "one.txt").write_bytes(bytes(range(200)) * 5)
    corpus = load_corpus(str(tmp_path / "one.txt"), "byte")
    assert (len(corpus.train), len(corpus.valid), len(corpus.test)) == (900, 50, 50)
    assert list(corpus.valid[:3]) == [100, 101, 102]
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "b.txt").write_text("second document " * 30)
    (docs / "a.txt").write_text("first document " * 30)
    corpus = load_corpus(str(docs), "char")
    assert corpus.tokenizer.decode(corpus.train[:5]) == "first"


def test_standard_layouts_are_detected(tmp_path):
    for split in ("train", "valid", "test"):
        (tmp_path / f"wiki.{split}.tokens").write_text(f" = {split} = \n\n words here \n")
    corpus = load_corpus(str(tmp_path), "word")
    assert [corpus.tokenizer.words[i] for i in corpus.valid[:5]] == ["=", "<unk>", "=", "<eos>", "<eos>"]
    assert len(corpus.train) == 3 + 1 + 1 + 2 + 1  # one <eos> per line, blank lines included


def test_bad_corpora_get_clear_errors(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with pytest.raises(CorpusError, match="empty"):
        load_corpus(str(empty), "char")
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("caf\xe9 ".encode("latin-1") * 50)
    with pytest.raises(CorpusError, match="not valid UTF-8"):
        load_corpus(str(bad), "char")
    assert len(load_corpus(str(bad), "byte").train) > 0
    with pytest.raises(CorpusError, match="does not exist"):
        load_corpus(str(tmp_path / "missing"), "char")


def test_ordered_stream_continues_each_row_across_segments():
    ids = np.arange(103)
    stream = OrderedStream(ids, batch_size=4, tgt_len=7)
    rows = stream.data.numpy()
    inputs, labels = [], []
    while (segment := stream.next_segment(cycle=False)) is not None:
        inputs.append(segment.input_ids.numpy())
        labels.append(segment.labels.numpy())
    inputs, labels = np.concatenate(inputs, 1), np.concatenate(labels, 1)
    assert np.array_equal(inputs, rows[:, :-1]) and np.array_equal(labels, rows[:, 1:])
    assert rows.shape == (4, 25) and np.array_equal(rows[1], np.arange(25, 50))


def test_varlen_stream_resumes_identically():
    ids = np.arange(5000)
    a = OrderedStream(ids, 2, 20, varlen=True, seed=3)
    for _ in range(5):
        a.next_segment()
    b = OrderedStream(ids, 2, 20, varlen=True, seed=3)
    b.load_state_dict(a.state_dict())
    lengths = set()
    for _ in range(200):
        sa, sb = a.next_segment(), b.next_segment()
        assert np.array_equal(sa.input_ids, sb.input_ids)
        lengths.add(sa.input_ids.size(1))
    assert len(lengths) > 3 and max(lengths) <= 35 and min(lengths) >= 1


@pytest.mark.skipif(not os.path.isdir(os.path.join(SHARED, "ptb")), reason="shared PTB not present")
def test_character_ptb_conversion_matches_the_published_size():
    from longseq.data.corpus import ptb_to_char

    with open(os.path.join(SHARED, "ptb", "ptb.train.txt"), encoding="utf-8") as f:
        converted = ptb_to_char(f.read())
    assert len(converted.encode()) == 9_812_816  # data/SOURCES.md
    assert converted.startswith("a e r _ b a n k n o t e _ ")
    assert ptb_to_char(" a <unk> cat \n") == "a _ <unk> _ c a t \n"


def test_a_layout_missing_a_split_is_an_error_naming_the_file_not_a_directory_of_documents(tmp_path):
    """Read as documents, wiki.test.tokens would be split 90/5/5 and its text trained on."""
    from longseq.data import prepare_corpus

    for split in ("train", "test"):
        (tmp_path / f"wiki.{split}.tokens").write_text(f" {split} words here \n" * 50)
    for read in (
        lambda: load_corpus(str(tmp_path), "word"),
        lambda: prepare_corpus(str(tmp_path), "word", str(tmp_path / "p")),
    ):
        with raises_naming(CorpusError, "wiki.train.tokens", "wiki.test.tokens", "wiki.valid.tokens"):
            read()
    (tmp_path / "wiki.valid.tokens").write_text("")
    for read in (
        lambda: load_corpus(str(tmp_path), "char"),
        lambda: prepare_corpus(str(tmp_path), "char", str(tmp_path / "p"), progress=False),
    ):
        with pytest.raises(CorpusError, match=r"wiki.valid.tokens is empty"):
            read()


def test_a_character_only_in_the_test_split_does_not_stop_character_level_training(tmp_path):
    """A layout's character vocabulary is the characters of its three files (which characters exist, not their
    counts), as the byte tokenizer's 256 values all exist: a rare character of the test text is no reason to fail."""
    from longseq.data import prepare_corpus

    (tmp_path / "train.txt").write_text("plain ascii text\n" * 30)
    (tmp_path / "valid.txt").write_text("plain text\n" * 5)
    (tmp_path / "test.txt").write_text("a café in 東京\n" * 5)
    corpus = load_corpus(str(tmp_path), "char")
    assert {"é", "東", "京"} <= set(corpus.tokenizer.chars)
    assert corpus.tokenizer.decode(corpus.test) == "a café in 東京\n" * 5
    prepare_corpus(str(tmp_path), "char", str(tmp_path / "prepared"), progress=False)
    assert np.array_equal(load_corpus(str(tmp_path / "prepared"), "char").test, corpus.test)


def test_an_unseen_character_is_an_error_naming_the_file_the_character_its_place_and_the_fix(tmp_path, monkeypatch):
    """A tokenizer built elsewhere (a checkpoint's, a tokenizer file) meets a character it lacks."""
    from longseq.data import prepare_corpus
    from longseq.data.readers import base as reader_base

    monkeypatch.setattr(reader_base, "BLOCK_BYTES", 64)  # the place is counted across blocks
    tok = CharTokenizer.build("abcdefgh \n")
    tok.save(str(tmp_path / "chars.json"))
    (tmp_path / "one.txt").write_text("abc defg\n" * 40 + "ab\tc\n")
    words = ("one.txt", "line 41, column 3", "U+0009", "--tokenizer byte")
    with raises_naming(CorpusError, *words):
        load_corpus(str(tmp_path / "one.txt"), "char", tokenizer=tok)
    with raises_naming(CorpusError, *words):
        prepare_corpus(str(tmp_path / "one.txt"), str(tmp_path / "chars.json"), str(tmp_path / "out"), progress=False)


def test_a_word_vocabulary_from_another_corpus_is_refused_not_scored_as_unknown_words(tmp_path):
    """A checkpoint's word vocabulary read over a text it mostly does not know would score ``<unk>`` for most
    tokens: refused, naming the share and the corpus.  Its own corpus, with some unknown words, still reads."""
    from longseq.data.corpus import MAX_UNKNOWN_SHARE
    from longseq.data.tokenizers import WordTokenizer

    own = "the cat sat on the mat\n" * 30
    tok = WordTokenizer.build(own)
    (tmp_path / "own.txt").write_text(own + "the dog sat on the rug\n" * 10)  # 2 words in 12 unknown: kept
    corpus = load_corpus(str(tmp_path / "own.txt"), "word", tokenizer=tok)
    assert 0 < np.mean(np.concatenate([corpus.train, corpus.valid, corpus.test]) == tok.unk_id) < MAX_UNKNOWN_SHARE
    (tmp_path / "other.txt").write_text("a b c d e f the\n" * 40)  # a-f: 6 tokens in 8 (with "the" and the newline)
    with raises_naming(CorpusError, "75%", "other.txt", "unknown"):
        load_corpus(str(tmp_path / "other.txt"), "word", tokenizer=tok)


def test_ordered_stream_carries_document_ids():
    ids, docs = np.arange(40), np.repeat([0, 1, 2, 3], 10)
    segment = OrderedStream(ids, batch_size=2, tgt_len=6, doc_ids=docs).next_segment()
    assert segment.doc_ids.tolist() == [[0, 0, 0, 0, 0, 0], [2, 2, 2, 2, 2, 2]]


def test_validation_equal_to_training_data_and_a_split_shorter_than_a_segment_are_said(tmp_path, capsys):
    layout = tmp_path / "layout"
    layout.mkdir()
    for split in ("train", "valid", "test"):
        (layout / f"{split}.txt").write_text("the same text in every split\n" * 40)
    assert main(["train", "--data", str(layout), "--tokenizer", "char", "--out", str(tmp_path / "a"), *TINY_CLI_8]) == 0
    assert_names(capsys.readouterr().err, "valid", "training split")
    (tmp_path / "short.txt").write_text("abcdefgh ij\n" * 12)
    assert main(["train", "--data", str(tmp_path / "short.txt"), "--tokenizer", "char", "--out",
                 str(tmp_path / "b"), *TINY_CLI_8]) == 0  # fmt: skip
    err = capsys.readouterr().err
    assert_names(err, "7 tokens", "eval_tgt_len=8")
