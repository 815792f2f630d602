"""What every tokenizer is: the :class:`Tokenizer` interface that corpora, prepared corpora, tasks, evaluation and
the transformers export use, with no switch on a tokenizer's kind anywhere else.

A kind is one class in its own module, named in :data:`longseq.data.tokenizers.TOKENIZERS`.  It says:

* how it learns from a corpus: :meth:`Tokenizer.fit` on blocks of the training text (``fit_on``: the ``train``
  text, ``all`` of it, or ``nothing``), with the run's :class:`Settings`;
* how a stream is cut into pieces that encode independently (:meth:`Tokenizer.pieces`: lines for words,
  :func:`iter_pieces` for subwords, any block for characters), so that a file read in blocks encodes exactly as
  the whole text, and :meth:`Tokenizer.encode_pieces`, which encodes many at once;
* how it is saved (:meth:`Tokenizer.to_dict`, :meth:`Tokenizer.from_dict`) and how transformers reads it
  (:meth:`Tokenizer.to_hf`, :meth:`Tokenizer.special_tokens`);
* what its evaluation reports (``bits_metric``: ``bpc`` where a token is a character or a byte) and how a text
  that goes on after it is encoded (:meth:`Tokenizer.encode_prompt`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

EOS = "<eos>"
UNK = "<unk>"
DEFAULT_BPE_VOCAB = 8192
PIECE_CHARS = 1 << 16  # subword tokenizers encode lines, and lines longer than this in pieces of this length


class TokenizerError(ValueError):
    """Text that a tokenizer cannot encode, or a tokenizer file that cannot be read."""


class UnknownCharacterError(TokenizerError):
    """A character that a character vocabulary lacks, with where it is: ``index`` into the text, 1-based
    ``line`` and ``column``."""

    def __init__(self, char: str, index: int, line: int, column: int, vocab_size: int) -> None:
        self.char, self.index, self.line, self.column = char, index, line, column
        super().__init__(
            f"character {char!r} (U+{ord(char):04X}) at line {line}, column {column} is not in the "
            f"{vocab_size}-character vocabulary"
        )


def unknown_at(text: str, index: int, vocab_size: int) -> UnknownCharacterError:
    """The error for the character at ``index`` of ``text``, with its line and column."""
    line = text.count("\n", 0, index) + 1
    return UnknownCharacterError(text[index], index, line, index - text.rfind("\n", 0, index), vocab_size)


@dataclass(frozen=True)
class Settings:
    """What a run's data config tells a tokenizer that learns from text: ``lowercase`` (words) and ``vocab_size``
    (the size of a subword vocabulary to learn).  A kind reads what it needs and ignores the rest."""

    lowercase: bool = False
    vocab_size: int = DEFAULT_BPE_VOCAB


class Tokenizer:
    """The interface of every kind (see the module docstring).  ``ordered`` is False only for a tokenizer whose ids
    are still to be ordered by frequency in the training text (:meth:`frequency_ordered`)."""

    kind: ClassVar[str] = ""
    fit_on: ClassVar[str] = "train"  # the text fit reads: "train", "all" (every split), or "nothing"
    reads_bytes: ClassVar[bool] = False  # encodes a file's bytes, not its text
    bits_metric: ClassVar[str | None] = None  # the bits-per-token metric's name where a token is a unit of text
    split_special_tokens: ClassVar[bool] = True  # transformers reads special tokens' text as plain text
    ordered: bool = True

    @classmethod
    def fit(cls, blocks: Iterable[str], settings: Settings) -> Tokenizer:
        """This kind learnt from ``blocks`` of text (the ``fit_on`` text; a block may end anywhere)."""
        raise NotImplementedError

    @classmethod
    def from_dict(cls, data: dict) -> Tokenizer:
        raise NotImplementedError

    def to_dict(self) -> dict:
        raise NotImplementedError

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

    def byte_lengths(self) -> np.ndarray:
        """The UTF-8 bytes of the text every id stands for, (vocab_size,) int64 (see :meth:`text_bytes`)."""
        raise NotImplementedError

    def pieces(self, blocks: Iterable[str | bytes]) -> Iterator[str | bytes]:
        """``blocks`` of a stream regrouped into pieces that encode independently: encoding the pieces one by one
        gives the ids of the whole stream.  Default: every block is such a piece."""
        return iter(blocks)

    def encode_pieces(self, pieces: list) -> np.ndarray:
        """The ids of ``pieces`` (from :meth:`pieces`), one after the other."""
        parts = [self.encode(piece) for piece in pieces]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    def encode_prompt(self, text: str) -> np.ndarray:
        """The ids of ``text`` as the model continues it (a prompt, an evaluation request): a line ends only where
        the text has a line end.  :meth:`encode` reads text as a corpus, whose every line ends; the two differ only
        for kinds that end every line with a token (a word tokenizer's ``<eos>``)."""
        return self.encode(text)

    def start_ids(self) -> list[int]:
        """The ids a prompt of ``longseq generate`` starts with before its own (a pretrained tokenizer's BOS); none."""
        return []

    @property
    def document_start_id(self) -> int | None:
        """The token a model's documents start after where the model has its own (a pretrained model's BOS); None:
        the line end between documents (:func:`longseq.data.tokenizers.prefix_id`)."""
        return None

    @property
    def mask_id(self) -> int | None:
        """An id that may stand for [MASK] in masked LM (None: the vocabulary has no spare symbol)."""
        return None

    def text_bytes(self, ids, previous=None) -> int:
        """The UTF-8 bytes of the text ``ids`` stand for: any shape with ``previous`` (the same shape: the id before
        each one, which a word tokenizer reads for the space between two words), else one sequence."""
        table = getattr(self, "_byte_table", None)
        if table is None:
            table = self._byte_table = self.byte_lengths()
        return int(table[np.asarray(ids, dtype=np.int64)].sum())

    def frequency_ordered(self, counts: np.ndarray) -> Tokenizer:
        """This tokenizer with ids sorted by ``counts`` (only where ``ordered`` is False; see the BPE)."""
        return self

    @property
    def rank(self) -> np.ndarray:
        """Where each id of the unordered tokenizer goes in this one (identity for every ordered kind)."""
        return np.arange(self.vocab_size, dtype=np.int64)

    def to_hf(self):
        """The ``tokenizers`` library's tokenizer that encodes and decodes as this one (the transformers export)."""
        raise TokenizerError(f"a {self.kind} tokenizer has no transformers form")

    def special_tokens(self) -> dict[str, str]:
        """The special tokens transformers names (``eos_token``, ``unk_token``, ...) that this vocabulary has."""
        return {}

    def save(self, path: str) -> None:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.to_dict(), f, ensure_ascii=False)


def iter_pieces(chunks: Iterable[str], limit: int = PIECE_CHARS) -> Iterator[str]:
    """The pieces a subword tokenizer encodes one by one: every line with its ``\\n``, a line longer than
    ``limit`` characters cut into pieces of ``limit`` from its start.  The pieces depend on the text only,
    not on how it is cut into ``chunks``: a file read in blocks gives the pieces of its whole text."""
    carry = ""
    for chunk in chunks:
        *lines, carry = (carry + chunk).split("\n")
        for line in lines:
            line += "\n"
            for start in range(0, len(line), limit):
                yield line[start : start + limit]
        while len(carry) >= limit:  # a long line: its first pieces are known before it ends
            yield carry[:limit]
            carry = carry[limit:]
    if carry:
        yield carry


def whole_lines(blocks: Iterable[str]) -> Iterator[str]:
    """``blocks`` regrouped so that every one but the last ends at a line end."""
    carry = ""
    for block in blocks:
        block = carry + block
        cut = block.rfind("\n") + 1
        if cut:
            yield block[:cut]
        carry = block[cut:]
    if carry:
        yield carry
