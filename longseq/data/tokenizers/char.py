"""``char``: the characters of the corpus, sorted by code point.  It learns from every split (which characters
exist is all it reads of the valid and test text, as the byte tokenizer's 256 values all exist: else one rare
character of the test text would make the corpus unreadable)."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
from tokenizers import Regex, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from longseq.data.tokenizers.base import Settings, Tokenizer, TokenizerError, unknown_at

MISSING = "<not in the character vocabulary>"  # the WordLevel unk_token, absent from its vocabulary: an error


class CharTokenizer(Tokenizer):
    kind = "char"
    fit_on = "all"
    bits_metric = "bpc"

    def __init__(self, chars: list[str]) -> None:
        if not chars:
            raise TokenizerError("a character vocabulary needs at least one character")
        self.chars = list(chars)
        self.index = {ch: i for i, ch in enumerate(self.chars)}
        if len(self.index) != len(self.chars):
            raise TokenizerError("character vocabulary has duplicates")
        if any(len(ch) != 1 for ch in self.chars):
            raise TokenizerError("every entry of a character vocabulary must be one character")
        codes = np.asarray([ord(ch) for ch in self.chars], dtype=np.int64)
        self._table = np.full(int(codes.max()) + 2, -1, dtype=np.int64)  # code point -> id; -1: not in the vocabulary
        self._table[codes] = np.arange(len(codes))

    @classmethod
    def build(cls, text: str | Iterable[str]) -> CharTokenizer:
        """The characters of ``text`` (a string, or an iterable of blocks of it), sorted by code point."""
        chars: set[str] = set()
        for block in [text] if isinstance(text, str) else text:
            chars.update(block)
        return cls(sorted(chars))

    @classmethod
    def fit(cls, blocks: Iterable[str], settings: Settings) -> CharTokenizer:
        return cls.build(blocks)

    @classmethod
    def from_dict(cls, data: dict) -> CharTokenizer:
        return cls(data["chars"])

    def to_dict(self) -> dict:
        return {"kind": self.kind, "chars": self.chars}

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> np.ndarray:
        codes = np.frombuffer(text.encode("utf-32-le", errors="surrogatepass"), dtype=np.uint32)  # (n,) code points
        ids = self._table[np.minimum(codes, len(self._table) - 1)]  # the table's last entry is -1
        unknown = np.flatnonzero(ids < 0)
        if unknown.size:
            raise unknown_at(text, int(unknown[0]), self.vocab_size)
        return ids

    def decode(self, ids: Iterable[int]) -> str:
        return "".join(self.chars[int(i)] for i in ids)

    def byte_lengths(self) -> np.ndarray:
        return np.asarray([len(ch.encode("utf-8", errors="surrogatepass")) for ch in self.chars], dtype=np.int64)

    def offsets(self, text: str) -> np.ndarray:
        return np.stack([np.arange(len(text)), np.arange(1, len(text) + 1)], axis=1).astype(np.int64).reshape(-1, 2)

    def to_hf(self) -> HFTokenizer:
        """Every character its own piece (a ``Split`` pre-tokenizer), a ``WordLevel`` model of the characters and no
        unknown token: a character outside the vocabulary is an error at encoding, as longseq's (the library says
        ``Missing [UNK] token from the vocabulary``), never a dropped character."""
        hf = HFTokenizer(models.WordLevel({ch: i for i, ch in enumerate(self.chars)}, unk_token=MISSING))
        hf.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
        hf.decoder = decoders.Fuse()
        return hf
