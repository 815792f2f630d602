"""Byte, character and word tokenizers, each saved as JSON.

* ``byte``: the 256 UTF-8 byte values (enwik8 style); decodes invalid UTF-8 with replacement.
* ``char``: the characters of the training text, sorted by code point.
* ``word``: whitespace tokens ordered by frequency (most frequent first, ties in order of first
  appearance), ``<eos>`` at every line end and ``<unk>`` for unseen words, as the paper's code does
  for PTB and WikiText.  Frequency order is what the adaptive softmax cutoffs rely on.
"""

from __future__ import annotations

import collections
import json
import re
from collections.abc import Iterable

import numpy as np

EOS = "<eos>"
UNK = "<unk>"


class TokenizerError(ValueError):
    """Text that a tokenizer cannot encode, or a tokenizer file that cannot be read."""


class Tokenizer:
    kind: str = ""

    @property
    def vocab_size(self) -> int:
        raise NotImplementedError

    def encode(self, text: str) -> np.ndarray:
        raise NotImplementedError

    def decode(self, ids: Iterable[int]) -> str:
        raise NotImplementedError

    def offsets(self, text: str) -> np.ndarray:
        """The character span [start, end) in ``text`` of every token ``encode(text)`` gives: (n, 2)."""
        raise NotImplementedError

    def to_dict(self) -> dict:
        raise NotImplementedError

    def save(self, path: str) -> None:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.to_dict(), f, ensure_ascii=False)


class ByteTokenizer(Tokenizer):
    kind = "byte"

    @property
    def vocab_size(self) -> int:
        return 256

    def encode(self, text: str | bytes) -> np.ndarray:
        data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        return np.frombuffer(data, dtype=np.uint8).astype(np.int64)

    def offsets(self, text: str) -> np.ndarray:
        chars = [i for i, ch in enumerate(text) for _ in range(len(ch.encode("utf-8")))]  # a byte -> its character
        return np.asarray([(i, i + 1) for i in chars], dtype=np.int64).reshape(-1, 2)

    def decode(self, ids: Iterable[int]) -> str:
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")

    def to_dict(self) -> dict:
        return {"kind": self.kind}


class CharTokenizer(Tokenizer):
    kind = "char"

    def __init__(self, chars: list[str]) -> None:
        if not chars:
            raise TokenizerError("a character vocabulary needs at least one character")
        self.chars = list(chars)
        self.index = {ch: i for i, ch in enumerate(self.chars)}
        if len(self.index) != len(self.chars):
            raise TokenizerError("character vocabulary has duplicates")

    @classmethod
    def build(cls, text: str) -> CharTokenizer:
        return cls(sorted(set(text)))

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> np.ndarray:
        try:
            return np.fromiter((self.index[ch] for ch in text), dtype=np.int64, count=len(text))
        except KeyError as exc:
            raise TokenizerError(
                f"character {exc.args[0]!r} is not in the {self.vocab_size}-character vocabulary"
            ) from None

    def decode(self, ids: Iterable[int]) -> str:
        return "".join(self.chars[int(i)] for i in ids)

    def offsets(self, text: str) -> np.ndarray:
        return np.stack([np.arange(len(text)), np.arange(1, len(text) + 1)], axis=1).astype(np.int64).reshape(-1, 2)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "chars": self.chars}


class WordTokenizer(Tokenizer):
    kind = "word"

    def __init__(self, words: list[str], lowercase: bool = False) -> None:
        self.words = list(words)
        self.lowercase = lowercase
        self.index = {w: i for i, w in enumerate(self.words)}
        if len(self.index) != len(self.words):
            raise TokenizerError("word vocabulary has duplicates")
        for special in (EOS, UNK):
            if special not in self.index:
                raise TokenizerError(f"word vocabulary lacks {special}")
        self.unk_id = self.index[UNK]

    def _lines(self, text: str) -> Iterable[list[str]]:
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()  # a final newline ends the last line; it does not start a new one
        for line in lines:
            line = line.lower() if self.lowercase else line
            yield line.split() + [EOS]

    @classmethod
    def build(cls, text: str, lowercase: bool = False) -> WordTokenizer:
        counts: collections.Counter[str] = collections.Counter()
        probe = cls.__new__(cls)
        probe.lowercase = lowercase
        for symbols in probe._lines(text):
            counts.update(symbols)
        words = [w for w, _ in counts.most_common()]  # ties keep first-appearance order
        if UNK not in counts:
            words.append(UNK)
        return cls(words, lowercase)

    @property
    def vocab_size(self) -> int:
        return len(self.words)

    def encode(self, text: str) -> np.ndarray:
        index, unk = self.index, self.unk_id
        ids = [index.get(w, unk) for symbols in self._lines(text) for w in symbols]
        return np.asarray(ids, dtype=np.int64)

    def decode(self, ids: Iterable[int]) -> str:
        out = []
        for i in ids:
            word = self.words[int(i)]
            out.append("\n" if word == EOS else word + " ")
        return "".join(out)

    def offsets(self, text: str) -> np.ndarray:
        spans, start = [], 0
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()  # as in encode: a final newline ends the last line
        for line in lines:
            spans += [(start + m.start(), start + m.end()) for m in re.finditer(r"\S+", line)]
            end = start + len(line)
            spans.append((end, min(end + 1, len(text))))  # <eos>: the newline (empty at the end of the text)
            start = end + 1
        return np.asarray(spans, dtype=np.int64).reshape(-1, 2)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "words": self.words, "lowercase": self.lowercase}


def build_tokenizer(kind: str, text: str, lowercase: bool = False) -> Tokenizer:
    """Build a tokenizer of ``kind`` from training text."""
    if kind == "byte":
        return ByteTokenizer()
    if kind == "char":
        return CharTokenizer.build(text)
    if kind == "word":
        return WordTokenizer.build(text, lowercase)
    raise TokenizerError(f"unknown tokenizer {kind!r}; choose byte, char or word")


def tokenizer_from_dict(data: dict) -> Tokenizer:
    kind = data.get("kind") if isinstance(data, dict) else None
    if kind == "byte":
        return ByteTokenizer()
    if kind == "char":
        return CharTokenizer(data["chars"])
    if kind == "word":
        return WordTokenizer(data["words"], bool(data.get("lowercase", False)))
    raise TokenizerError(f"unknown tokenizer kind {kind!r}")


def load_tokenizer(path: str) -> Tokenizer:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError) as exc:
        raise TokenizerError(f"cannot read tokenizer {path}: {exc}") from None
    return tokenizer_from_dict(data)
