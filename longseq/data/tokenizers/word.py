"""``word``: whitespace tokens ordered by frequency (most frequent first, ties in order of first appearance),
``<eos>`` at every line end and ``<unk>`` for unseen words, as the paper's code does for PTB and WikiText.
Frequency order is what the adaptive softmax cutoffs rely on.

A word tokenizer keeps words and line ends but not the spacing between them: its text is each line's words joined
by one space, ended by a newline (``<eos>``), which is the file's bytes when the file is written so (and a few
bytes a line fewer than PTB's and WikiText's files, which pad each line with spaces: bits per byte come out a
little higher, never flattered).  Each word counts its bytes and the space before it when a word precedes it;
``<eos>`` counts 1."""

from __future__ import annotations

import collections
import functools
import re
import sys
from collections.abc import Iterable, Iterator

import numpy as np
from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from longseq.data.tokenizers.base import EOS, UNK, Settings, Tokenizer, TokenizerError, whole_lines

# str.lower()'s final sigma, but for a case-ignorable character between the letter and the sigma ("A'Σ")
FINAL_SIGMA = r"(?<=\p{Cased})Σ(?!\p{Case_Ignorable}*\p{Cased})"


@functools.cache
def whitespace() -> str:
    """The characters ``str.split()`` splits on."""
    return "".join(chr(c) for c in range(sys.maxunicode + 1) if chr(c).isspace())


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
    def build(cls, text: str | Iterable[str], lowercase: bool = False) -> WordTokenizer:
        """The vocabulary of ``text``: a string, or an iterable of blocks of it that each end at a line end
        (the last one may not)."""
        counts: collections.Counter[str] = collections.Counter()
        probe = cls.__new__(cls)
        probe.lowercase = lowercase
        for block in [text] if isinstance(text, str) else text:
            for symbols in probe._lines(block):
                counts.update(symbols)
        words = [w for w, _ in counts.most_common()]  # ties keep first-appearance order
        if UNK not in counts:
            words.append(UNK)
        return cls(words, lowercase)

    @classmethod
    def fit(cls, blocks: Iterable[str], settings: Settings) -> WordTokenizer:
        return cls.build(whole_lines(blocks), settings.lowercase)

    @classmethod
    def from_dict(cls, data: dict) -> WordTokenizer:
        return cls(data["words"], bool(data.get("lowercase", False)))

    def to_dict(self) -> dict:
        return {"kind": self.kind, "words": self.words, "lowercase": self.lowercase}

    @property
    def vocab_size(self) -> int:
        return len(self.words)

    def pieces(self, blocks: Iterable[str]) -> Iterator[str]:
        return whole_lines(blocks)

    def encode(self, text: str) -> np.ndarray:
        index, unk = self.index, self.unk_id
        ids = [index.get(w, unk) for symbols in self._lines(text) for w in symbols]
        return np.asarray(ids, dtype=np.int64)

    def encode_prompt(self, text: str) -> np.ndarray:
        ids = self.encode(text)
        return ids if text.endswith("\n") else ids[:-1]  # a last line that does not end: no <eos> (empty: none)

    def decode(self, ids: Iterable[int]) -> str:
        out = []
        for i in ids:
            word = self.words[int(i)]
            out.append("\n" if word == EOS else word + " ")
        return "".join(out)

    @property
    def mask_id(self) -> int:
        return self.unk_id

    def byte_lengths(self) -> np.ndarray:
        """A word's UTF-8 bytes, ``<eos>`` 1 (the newline); :meth:`text_bytes` adds the spaces between words."""
        return np.asarray(
            [1 if w == EOS else len(w.encode("utf-8", errors="surrogatepass")) for w in self.words], dtype=np.int64
        )

    def text_bytes(self, ids, previous=None) -> int:
        """The bytes of the words and line ends, and one space before every word that follows a word.  Without
        ``previous``, ``ids`` is one sequence whose first word has no word before it."""
        ids, eos = np.asarray(ids, dtype=np.int64), self.index[EOS]
        if previous is None:
            ids = ids.reshape(-1)
            previous = np.concatenate([[eos], ids[:-1]])
        spaces = np.count_nonzero((ids != eos) & (np.asarray(previous, dtype=np.int64) != eos))
        return super().text_bytes(ids) + int(spaces)

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

    def to_hf(self) -> HFTokenizer:
        """Normalizers write every line end as `` <eos> `` (after ``Lowercase`` with ``lowercase``), and a text whose
        last line does not end gets no ``<eos>`` after it, as :meth:`encode_prompt` (before 2026-12-07 it got one: a
        request of the harness scored one ``<eos>`` more than the text); a ``Split`` on Python's whitespace characters
        (``str.split``'s) and a ``WordLevel`` model with ``<unk>``; decoders write every word followed by a space
        and ``<eos>`` as a newline."""
        hf = HFTokenizer(models.WordLevel(dict(self.index), unk_token=UNK))
        steps = [normalizers.Replace(Regex(FINAL_SIGMA), "ς"), normalizers.Lowercase()] if self.lowercase else []
        steps += [normalizers.Replace("\n", f" {EOS} ")]  # a line end where the text has one (encode_prompt)
        hf.normalizer = normalizers.Sequence(steps)
        spaces = "".join(f"\\x{{{ord(ch):x}}}" for ch in whitespace())
        hf.pre_tokenizer = pre_tokenizers.Split(Regex(f"[{spaces}]+"), behavior="removed")
        hf.decoder = decoders.Sequence(
            [decoders.Replace(Regex(r"\z"), " "), decoders.Replace(Regex(f"\\A{EOS} \\z"), "\n"), decoders.Fuse()]
        )
        return hf

    def special_tokens(self) -> dict[str, str]:
        return {"eos_token": EOS, "unk_token": UNK}
