"""A new kind is one class and one registry entry: a toy tokenizer and a toy reader, registered here and nowhere
else, go through a prepared corpus and the same corpus in RAM (equal ids), training, a checkpoint, evaluation and
generation, and an error that names the file's own line and column.

* ``Letters`` (a tokenizer): a fixed alphabet, learning nothing from the corpus, as a nucleotide tokenizer would;
* ``Mirrored`` (a reader): ``.mirrored`` files whose every line is written right to left, with its own layout
  (``{train,valid,test}.mirrored``): its text is every line turned round, and a place in its text is named at the
  file's own column."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np
import pytest
from support import TINY_CLI_8, cli_json, raises_naming

from longseq.data import load_corpus, load_prepared, prepare_corpus
from longseq.data.readers import READERS, Reader, Tap
from longseq.data.readers.base import utf8_blocks
from longseq.data.sources import CorpusError
from longseq.data.tokenizers import TOKENIZERS, Settings, Tokenizer, unknown_at, whole_lines
from longseq.train.checkpoint import load_checkpoint

ALPHABET = "abcdefgh \n"


class Letters(Tokenizer):
    kind = "letters"
    fit_on = "nothing"
    bits_metric = "bpc"

    @classmethod
    def fit(cls, blocks: Iterable[str], settings: Settings) -> Letters:
        return cls()

    @classmethod
    def from_dict(cls, data: dict) -> Letters:
        return cls()

    def to_dict(self) -> dict:
        return {"kind": self.kind}

    @property
    def vocab_size(self) -> int:
        return len(ALPHABET)

    def encode(self, text: str) -> np.ndarray:
        for i, ch in enumerate(text):
            if ch not in ALPHABET:
                raise unknown_at(text, i, self.vocab_size)
        return np.asarray([ALPHABET.index(ch) for ch in text], dtype=np.int64)

    def decode(self, ids) -> str:
        return "".join(ALPHABET[int(i)] for i in ids)

    def byte_lengths(self) -> np.ndarray:
        return np.ones(self.vocab_size, dtype=np.int64)


class Mirrored(Reader):
    name = "mirrored"
    suffixes = (".mirrored",)
    layouts = {"mirrored": "{}.mirrored"}

    def text_blocks(self, path: str, tap: Tap) -> Iterator[str]:
        for block in whole_lines(utf8_blocks(path, tap.blocks())):  # blocks of whole lines
            yield "\n".join(line[::-1] for line in block.split("\n"))

    def where(self, path: str, line: int, column: int) -> str:
        with open(path, encoding="utf-8") as f:
            width = len(f.read().split("\n")[line - 1])
        return f"line {line}, column {width - column + 1}"


@pytest.fixture
def registered(monkeypatch):
    monkeypatch.setitem(TOKENIZERS, Letters.kind, Letters)
    monkeypatch.setitem(READERS, Mirrored.name, Mirrored)


def mirrored_corpus(directory, seed: int = 0) -> dict[str, str]:
    """``{train,valid,test}.mirrored`` of made-up words; the text each split stands for."""
    rng = np.random.default_rng(seed)
    texts = {}
    for split, n in (("train", 400), ("valid", 60), ("test", 60)):
        lines = [" ".join(rng.choice(["abc", "defg", "hh", "gfe"], size=5)) for _ in range(n)]
        texts[split] = "".join(line + "\n" for line in lines)
        (directory / f"{split}.mirrored").write_text("".join(line[::-1] + "\n" for line in lines))
    return texts


def test_a_registered_reader_and_tokenizer_give_the_same_ids_in_ram_and_prepared(tmp_path, registered):
    (tmp_path / "src").mkdir()
    texts = mirrored_corpus(tmp_path / "src")
    in_ram = load_corpus(str(tmp_path / "src"), "letters")
    prepare_corpus(str(tmp_path / "src"), "letters", str(tmp_path / "prepared"), progress=False)
    prepared = load_prepared(str(tmp_path / "prepared"), "letters")
    for split, text in texts.items():
        expected = Letters().encode(text)
        assert np.array_equal(in_ram.split(split), expected), split
        assert np.array_equal(np.asarray(prepared.split(split)), expected), split
    assert prepared.tokenizer.to_dict() == {"kind": "letters"}


def test_a_registered_tokenizer_trains_saves_evaluates_and_generates(tmp_path, registered, capsys):
    (tmp_path / "src").mkdir()
    mirrored_corpus(tmp_path / "src")
    out = tmp_path / "run"
    cli_json(["train", "--data", str(tmp_path / "src"), "--out", str(out), "--json", *TINY_CLI_8, "tokenizer=letters"],
             capsys)  # fmt: skip
    model, tokenizer, run, _ = load_checkpoint(str(out / "last"))
    assert isinstance(tokenizer, Letters) and model.config.vocab_size == len(ALPHABET)
    scores = cli_json(["eval", "--checkpoint", str(out), "--data", str(tmp_path / "src"), "--split", "test", "--json"],
                      capsys)  # fmt: skip
    assert scores["bpc"] == pytest.approx(scores["loss"] / np.log(2))  # the kind's bits metric
    sample = cli_json(["generate", "--checkpoint", str(out), "--prompt", "abc ", "--max-new-tokens", "12", "--json"],
                      capsys)  # fmt: skip
    assert set(sample["text"]) <= set(ALPHABET) and len(sample["text"]) == sample["tokens"] == 12


def test_a_character_outside_the_alphabet_is_named_at_the_files_own_line_and_column(tmp_path, registered):
    (tmp_path / "src").mkdir()
    mirrored_corpus(tmp_path / "src")
    lines = (tmp_path / "src" / "train.mirrored").read_text().split("\n")
    lines[6] = "ba" + "z" + lines[6][3:]  # the file's line 7, column 3
    (tmp_path / "src" / "train.mirrored").write_text("\n".join(lines))
    for read in (
        lambda: load_corpus(str(tmp_path / "src"), "letters"),
        lambda: prepare_corpus(str(tmp_path / "src"), "letters", str(tmp_path / "prepared"), progress=False),
    ):
        with raises_naming(CorpusError, "train.mirrored", "line 7, column 3", "'z'"):
            read()
