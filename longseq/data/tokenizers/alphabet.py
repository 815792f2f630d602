"""Fixed alphabets of one-letter symbols for biological sequences (the base of ``nucleotide`` and ``protein``).

A vocabulary is the record separator ``\\n`` (id 0: one record a line, as the FASTA reader gives them), ``[MASK]``
(id 1: masked LM's mask, also read back from text as the five characters ``[MASK]``), then the letters.  It learns
nothing from a corpus (``fit_on = "nothing"``): the same letters have the same ids in every corpus, so models and
corpora of one kind fit each other.  ``folds`` maps other characters onto ids (lowercase onto uppercase where case
is folded).  Each id belongs to a *token class* (``classes``: a name -> its ids), which masked LM reads as the
token's type: a mask rate per class, accuracy per class.  A character outside the alphabet is an error naming it
and its line and column (:class:`~longseq.data.tokenizers.base.UnknownCharacterError`), with the alphabet in the
advice.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar

import numpy as np
from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from longseq.data.tokenizers.base import Settings, Tokenizer, TokenizerError, unknown_at

SEPARATOR = "\n"
MASK = "[MASK]"
MISSING = "<not in the alphabet>"  # the WordLevel unk_token, absent from its vocabulary: an error, as longseq's


class AlphabetTokenizer(Tokenizer):
    """A fixed alphabet (see the module docstring).  A subclass sets ``letters`` (after the separator and the mask),
    ``folds`` (another character -> the letter it reads as), ``classes`` (a class name -> its letters; the
    separator and the mask have classes of their own), ``complements`` (a letter -> its complement, for the
    reverse complement; empty: none) and ``advice`` (said after an unknown character)."""

    fit_on = "nothing"
    letters: ClassVar[str] = ""
    folds: ClassVar[dict[str, str]] = {}
    letter_classes: ClassVar[dict[str, str]] = {}
    complements: ClassVar[dict[str, str]] = {}
    advice: ClassVar[str] = ""

    def __init__(self) -> None:
        self.symbols = [SEPARATOR, MASK, *self.letters]
        index = {symbol: i for i, symbol in enumerate(self.symbols) if len(symbol) == 1}
        index.update({ch: index[to] for ch, to in self.folds.items()})
        self._table = np.full(max(map(ord, index)) + 2, -1, dtype=np.int64)  # code point -> id; -1: unknown
        for ch, i in index.items():
            self._table[ord(ch)] = i

    @classmethod
    def fit(cls, blocks: Iterable[str], settings: Settings) -> AlphabetTokenizer:
        return cls()

    @classmethod
    def from_dict(cls, data: dict) -> AlphabetTokenizer:
        tokenizer = cls()
        if data.get("symbols", tokenizer.symbols) != tokenizer.symbols:
            raise TokenizerError(
                f"the {cls.kind} tokenizer stored has the symbols {data['symbols']}, not this version's "
                f"{tokenizer.symbols}: its ids would be read as other letters"
            )
        return tokenizer

    def to_dict(self) -> dict:
        return {"kind": self.kind, "symbols": self.symbols}

    @property
    def vocab_size(self) -> int:
        return len(self.symbols)

    @property
    def mask_id(self) -> int:
        return 1

    @property
    def classes(self) -> dict[str, list[int]]:
        """Every token class and its ids: ``separator``, ``mask`` and the letters' classes, in order."""
        out: dict[str, list[int]] = {"separator": [0], "mask": [1]}
        for i, letter in enumerate(self.letters, 2):
            out.setdefault(self.letter_classes[letter], []).append(i)
        return out

    def complement_ids(self) -> np.ndarray | None:
        """The id of every id's complement (the separator and the mask are their own), or None: no complement."""
        if not self.complements:
            return None
        index = {symbol: i for i, symbol in enumerate(self.symbols)}
        return np.asarray([index[self.complements.get(s, s)] for s in self.symbols], dtype=np.int64)

    def encode(self, text: str) -> np.ndarray:
        if "[" not in text:
            return self._letters(text, text, 0)
        parts, start = [], 0
        for i, piece in enumerate(text.split(MASK)):
            if i:
                parts.append(np.asarray([self.mask_id], dtype=np.int64))
            parts.append(self._letters(piece, text, start))
            start += len(piece) + len(MASK)
        return np.concatenate(parts)

    def _letters(self, piece: str, text: str, start: int) -> np.ndarray:
        """The ids of ``piece``, which begins at ``start`` in ``text`` (where an error names its place)."""
        codes = np.frombuffer(piece.encode("utf-32-le", errors="surrogatepass"), dtype=np.uint32)
        ids = self._table[np.minimum(codes, len(self._table) - 1)]  # the table's last entry is -1
        unknown = np.flatnonzero(ids < 0)
        if unknown.size:
            error = unknown_at(text, start + int(unknown[0]), self.vocab_size)
            error.advice = self.advice
            error.args = (f"{error.args[0]} of the {self.kind} tokenizer; {self.advice}",)
            raise error
        return ids

    def decode(self, ids: Iterable[int]) -> str:
        return "".join(self.symbols[int(i)] for i in ids)

    def byte_lengths(self) -> np.ndarray:
        return np.asarray([len(s.encode("utf-8")) for s in self.symbols], dtype=np.int64)

    def offsets(self, text: str) -> np.ndarray:
        widths = self.byte_lengths()[self.encode(text)]  # every symbol's text is ASCII: bytes are characters
        ends = np.cumsum(widths)
        return np.stack([ends - widths, ends], axis=1).astype(np.int64).reshape(-1, 2)

    def to_hf(self) -> HFTokenizer:
        """A ``WordLevel`` model of the symbols, every character its own piece but ``[MASK]``, the folds as
        ``Replace`` normalizers, and no unknown token (a character outside the alphabet is an error)."""
        hf = HFTokenizer(models.WordLevel({s: i for i, s in enumerate(self.symbols)}, unk_token=MISSING))
        if self.folds:
            hf.normalizer = normalizers.Sequence([normalizers.Replace(a, b) for a, b in self.folds.items()])
        hf.pre_tokenizer = pre_tokenizers.Split(Regex(r"\[MASK\]|[\s\S]"), behavior="isolated")
        hf.decoder = decoders.Fuse()
        return hf

    def special_tokens(self) -> dict[str, str]:
        return {"mask_token": MASK}
