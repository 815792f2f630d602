"""Tokenizers: exact round trips (property-based) and through their JSON files, the word vocabulary's and the
BPE's frequency order, loading any saved tokenizer, the UTF-8 bytes of a text counted from its ids, and the checks
that name a tokenizer file, a character or a vocabulary size that does not fit."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import TINY_CLI, UNICODE_TEXT, assert_names, canonical, raises_naming

from longseq.cli import main
from longseq.config import ConfigError, DataConfig
from longseq.data import (
    ByteTokenizer,
    CharTokenizer,
    TokenizerError,
    WordTokenizer,
    load_tokenizer,
)
from longseq.data.corpus import bundled_corpus_path, load_corpus
from longseq.data.tokenizers import (
    EOS,
    UNK,
    BPETokenizer,
    build_tokenizer,
    check_tokenizer_fits,
    iter_pieces,
    newline_id,
    tokenizer_from_dict,
    train_bpe,
)

with open(bundled_corpus_path(), encoding="utf-8") as f:
    TRAINING_TEXT = (
        f.read(20_000) + "Ünïcödé façade — naïve café, 東京 and emoji 😀 too.\n\ttabs\tand  double  spaces\r\n"
    )
BPE = build_tokenizer("bpe", TRAINING_TEXT, vocab_size=400)
PROPERTY = settings(max_examples=150, deadline=None)


@PROPERTY
@given(st.text())
def test_byte_tokenizer_round_trips_any_text(text):
    tok = ByteTokenizer()
    assert tok.decode(tok.encode(text)) == text


@PROPERTY
@given(st.text(min_size=1), st.data())
def test_char_tokenizer_round_trips_any_text_over_its_vocabulary(training, data):
    tok = CharTokenizer.build(training)
    text = "".join(data.draw(st.lists(st.sampled_from(sorted(set(training))))))
    assert tok.decode(tok.encode(text)) == text
    assert tokenizer_from_dict(json.loads(json.dumps(tok.to_dict()))).encode(text).tolist() == tok.encode(text).tolist()


WORDS = st.text(st.characters(blacklist_categories=("Z", "C")), min_size=1, max_size=8).filter(
    lambda w: w.split() == [w] and w not in (EOS, UNK)
)
SPACES = st.text(" \t", min_size=1, max_size=3)


@PROPERTY
@given(st.lists(st.lists(WORDS, max_size=6), min_size=1, max_size=6), st.data())
def test_word_tokenizer_round_trips_lines_of_its_words(lines, data):
    """Round trip for the word tokenizer: a text of vocabulary words, separated by any runs of spaces and tabs, in
    lines that each end with a newline, decodes to the same words in the same lines; and ``encode(decode(ids))``
    is ``ids`` for any ids that end with ``<eos>``.  (Whitespace inside a line is not kept: decode writes one
    space after every word.)"""
    text = "".join(data.draw(SPACES).join(words) + "\n" for words in lines)
    tok = WordTokenizer.build(text)
    ids = tok.encode(text)
    decoded = tok.decode(ids)
    assert [line.split() for line in decoded.split("\n")[:-1]] == lines
    assert tok.encode(decoded).tolist() == ids.tolist()


@PROPERTY
@given(st.text())
def test_bpe_round_trips_any_text(text):
    ids = BPE.encode(text)
    assert BPE.decode(ids) == text
    assert ids.dtype == np.int64 and (ids.size == 0 or 0 <= ids.min() <= ids.max() < BPE.vocab_size)


@PROPERTY
@given(st.text(st.characters(codec="utf-8"), max_size=300), st.lists(st.integers(0, 300), max_size=6))
def test_pieces_and_bpe_ids_do_not_depend_on_how_the_text_is_cut(text, cuts):
    """A file read in blocks encodes exactly as its whole text: the pieces are those of the text."""
    bounds = [0, *sorted(c for c in cuts if c <= len(text)), len(text)]
    chunks = [text[a:b] for a, b in zip(bounds, bounds[1:])]
    assert list(iter_pieces(chunks, limit=7)) == list(iter_pieces([text], limit=7))
    assert "".join(iter_pieces(chunks, limit=7)) == text
    assert all(len(p) <= 7 and "\n" not in p[:-1] for p in iter_pieces([text], limit=7))
    assert BPE.encode_pieces(list(iter_pieces(chunks))).tolist() == BPE.encode(text).tolist()


def test_bpe_ids_are_ordered_by_frequency_in_the_training_text():
    counts = np.bincount(BPE.encode(TRAINING_TEXT), minlength=BPE.vocab_size)
    assert BPE.vocab_size == 400 and BPE.ordered
    assert np.all(np.diff(counts) <= 0)  # id 0 the most frequent, as the adaptive softmax cutoffs need
    unordered = train_bpe(iter_pieces([TRAINING_TEXT]), 400)
    raw = np.bincount(unordered.encode(TRAINING_TEXT), minlength=400)
    assert np.any(np.diff(raw) > 0)  # the library's own ids are not: the remap is needed
    assert np.array_equal(np.sort(raw)[::-1], counts)


def test_bpe_offsets_are_the_character_spans_of_its_tokens():
    text = "Before we proceed any further,\n  hear me speak.\n"
    ids, spans = BPE.encode(text), BPE.offsets(text)
    assert spans.shape == (len(ids), 2)
    assert [text[a:b] for a, b in spans] == [BPE.decode([i]) for i in ids]
    accented = BPE.offsets("é")  # two byte-level tokens of one character share its span
    assert accented.tolist() in ([[0, 1]], [[0, 1], [0, 1]])


def test_an_hf_tokenizer_file_loads_as_bpe_and_gets_the_training_texts_order(tmp_path):
    library = train_bpe(iter_pieces([TRAINING_TEXT]), 350)
    hf_file = tmp_path / "tokenizer.json"
    library.hf.save(str(hf_file))  # the library's own format, as GPT-2's tokenizer.json
    loaded = load_tokenizer(str(hf_file))
    assert isinstance(loaded, BPETokenizer) and loaded.kind == "bpe" and not loaded.ordered
    assert loaded.encode(TRAINING_TEXT).tolist() == library.encode(TRAINING_TEXT).tolist()
    fitted = build_tokenizer(str(hf_file), TRAINING_TEXT)
    assert fitted.ordered and np.all(np.diff(np.bincount(fitted.encode(TRAINING_TEXT), minlength=350)) <= 0)
    ours = tmp_path / "ours.json"
    fitted.save(str(ours))
    again = load_tokenizer(str(ours))  # our file keeps its order; building from it changes nothing
    assert again.to_dict() == fitted.to_dict()
    assert build_tokenizer(str(ours), "other text").to_dict() == fitted.to_dict()


def test_every_kind_of_saved_tokenizer_loads(tmp_path):
    text = "a b a\nc a\n"
    for tok in (ByteTokenizer(), CharTokenizer.build(text), WordTokenizer.build(text), BPE):
        tok.save(str(tmp_path / f"{tok.kind}.json"))
        again = load_tokenizer(str(tmp_path / f"{tok.kind}.json"))
        assert type(again) is type(tok) and again.to_dict() == tok.to_dict()


def test_bad_tokenizer_files_are_errors_naming_the_file(tmp_path):
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(TokenizerError, match="broken.json"):
        load_tokenizer(str(broken))
    wordpiece = tmp_path / "wordpiece.json"
    spec = json.loads(BPE.hf.to_str())
    spec["model"] = {"type": "WordPiece", "vocab": {"[UNK]": 0, "a": 1}, "unk_token": "[UNK]"}
    wordpiece.write_text(json.dumps(spec))
    with raises_naming(TokenizerError, "wordpiece.json", "BPE"):
        load_tokenizer(str(wordpiece))
    with pytest.raises(TokenizerError, match="permutation"):
        tokenizer_from_dict({**BPE.to_dict(), "order": [0] * BPE.vocab_size})
    with pytest.raises(TokenizerError, match="outside the 400-token"):
        BPE.decode([400])
    with pytest.raises(TokenizerError, match="256"):
        train_bpe(["abc"], 100)


def test_check_tokenizer_fits_names_the_file_and_both_sizes():
    check_tokenizer_fits(BPE, 400, "run/tokenizer.json")
    with raises_naming(TokenizerError, "run/tokenizer.json", "400", "8192"):
        check_tokenizer_fits(BPE, 8192, "run/tokenizer.json")


def test_char_tokenizer_error_names_the_character_and_its_line_and_column():
    with raises_naming(TokenizerError, "'z'", "U+007A", "line 2, column 3"):
        CharTokenizer.build("abc\n").encode("abc\nabz")


def test_data_config_takes_bpe_and_tokenizer_files():
    assert DataConfig(tokenizer="bpe", vocab_size=4096).vocab_size == 4096
    assert DataConfig(tokenizer="gpt2/tokenizer.json").tokenizer == "gpt2/tokenizer.json"
    with raises_naming(TokenizerError, "'bpee'", "byte, char, word, bpe"):  # named when the corpus is read
        load_corpus(None, DataConfig(tokenizer="bpee").tokenizer)
    with pytest.raises(ConfigError, match="vocab_size"):
        DataConfig(tokenizer="bpe", vocab_size=100)


def test_tokenizers_round_trip_through_json(tmp_path):
    text = "To be, or not to be:\nthat is the question.\n"
    for tok in (ByteTokenizer(), CharTokenizer.build(text), WordTokenizer.build(text)):
        path = tmp_path / f"{tok.kind}.json"
        tok.save(str(path))
        again = load_tokenizer(str(path))
        assert again.vocab_size == tok.vocab_size
        assert list(again.encode(text)) == list(tok.encode(text))
    assert ByteTokenizer().decode(ByteTokenizer().encode("héllo")) == "héllo"
    assert CharTokenizer.build(text).decode(CharTokenizer.build(text).encode(text)) == text


def test_word_vocabulary_is_frequency_ordered_with_eos_and_unk():
    tok = WordTokenizer.build("b a a\nc a b\n")
    assert tok.words == ["a", "b", "<eos>", "c", "<unk>"]  # by count; ties in order of first appearance
    ids = tok.encode("a zebra\n")
    assert tok.words[ids[1]] == "<unk>" and tok.words[ids[-1]] == "<eos>"


def test_a_prompt_ends_a_line_only_where_it_has_a_line_end():
    """``encode`` reads a corpus, every line ended by ``<eos>``, the last too; ``encode_prompt`` reads text the model
    continues (a prompt, a harness request), so a word text's unfinished last line gets no ``<eos>``; the other
    kinds have no line-end token of their own and give ``encode``'s ids."""
    tok = WordTokenizer.build("b a a\nc a b\n")
    eos = tok.index["<eos>"]
    assert tok.encode("a b").tolist() == [tok.index["a"], tok.index["b"], eos]
    assert tok.encode_prompt("a b").tolist() == [tok.index["a"], tok.index["b"]]
    assert tok.encode_prompt("a\nb").tolist() == [tok.index["a"], eos, tok.index["b"]]
    for text in ("a b\n", "a\n\n", "\n", ""):
        assert tok.encode_prompt(text).tolist() == tok.encode(text).tolist(), text
    for other in (build_tokenizer("byte", "ab\n"), build_tokenizer("char", "ab\n")):
        assert other.encode_prompt("ab\nb").tolist() == other.encode("ab\nb").tolist()


def test_the_newline_id_is_the_tokenizers_own():
    """The harness's prefix token (``prefix_token_id``) is the line end of the checkpoint's tokenizer: 10 for bytes
    only; a character vocabulary's place of the newline (none without it); a word vocabulary's ``<eos>``."""
    assert newline_id(ByteTokenizer()) == 10
    chars = CharTokenizer.build("123456789:\n")  # sorted: the newline, 1-9, then ":" at 10
    assert chars.chars[10] == ":" and newline_id(chars) == chars.chars.index("\n") == 0
    assert newline_id(CharTokenizer.build("abc")) is None
    words = WordTokenizer.build(" ".join(f"w{i}" for i in range(12)) + "\n")
    assert newline_id(words) == words.index["<eos>"] != 10
    bpe = build_tokenizer("bpe", "one two\nthree\n", vocab_size=300)
    assert bpe.decode([newline_id(bpe)]) == "\n"


def test_char_tokenizer_names_unknown_character():
    with pytest.raises(TokenizerError, match="'z'"):
        CharTokenizer.build("abc").encode("abz")


@pytest.mark.parametrize("kind", ["byte", "char", "bpe", "word"])
def test_the_ids_of_a_text_count_its_bytes(kind):
    text = UNICODE_TEXT if kind != "word" else canonical(UNICODE_TEXT.replace(",", " ,"))
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


def test_vocab_size_with_a_tokenizer_it_cannot_size_is_an_error(tmp_path, text_corpus, capsys):
    """``--vocab-size`` was ignored in silence for byte, char and word tokenizers (train and data prepare)."""
    corpus = str(text_corpus)
    out = str(tmp_path / "run")
    assert main(["train", "--data", corpus, "--tokenizer", "char", "--vocab-size", "512", "--out", out, *TINY_CLI]) == 2
    assert_names(capsys.readouterr().err, "--vocab-size", "BPE", "'char'")
    assert not (tmp_path / "run").exists()
    prepare = ["data", "prepare", "--data", corpus, "--out", str(tmp_path / "p"), "--quiet"]
    assert main([*prepare, "--tokenizer", "word", "--vocab-size", "512"]) == 2
    assert_names(capsys.readouterr().err, "--vocab-size", "'word'")
    assert not (tmp_path / "p").exists()
    assert main([*prepare, "--tokenizer", "char"]) == 0  # without it: as before
