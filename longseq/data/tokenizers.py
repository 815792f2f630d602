"""Byte, character, word and subword (BPE) tokenizers, each saved as JSON.

* ``byte``: the 256 UTF-8 byte values (enwik8 style); decodes invalid UTF-8 with replacement.
* ``char``: the characters of the training text, sorted by code point.
* ``word``: whitespace tokens ordered by frequency (most frequent first, ties in order of first
  appearance), ``<eos>`` at every line end and ``<unk>`` for unseen words, as the paper's code does
  for PTB and WikiText.  Frequency order is what the adaptive softmax cutoffs rely on.
* ``bpe``: byte-level BPE on the HF ``tokenizers`` library, trained on the training text
  (:func:`train_bpe`) or read from any BPE ``tokenizer.json`` (GPT-2's).  Decoding gives the text back
  exactly.  Ids are ordered by frequency in the training text, like the word vocabulary's.

A tokenizer is named by a *spec*: ``byte``, ``char``, ``word``, ``bpe``, or the path of a tokenizer file
(ours, or an HF ``tokenizer.json``); see :func:`build_tokenizer`.

Bytes of a text, for bits per byte (:meth:`Tokenizer.text_bytes`): the UTF-8 bytes of the text the ids stand
for.  A byte is one byte, a character its UTF-8 length, a byte-level BPE token the bytes it decodes to, so the
ids of a file count its bytes exactly.  A word tokenizer keeps words and line ends but not the spacing between
them: its text is each line's words joined by one space, ended by a newline (``<eos>``), which is the file's
bytes when the file is written so (and a few bytes a line fewer than PTB's and WikiText's files, which pad each
line with spaces: bits per byte come out a little higher, never flattered).  Each word counts its bytes and the
space before it when a word precedes it; ``<eos>`` counts 1.
"""

from __future__ import annotations

import collections
import itertools
import json
import re
from collections.abc import Iterable, Iterator

import numpy as np
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

EOS = "<eos>"
UNK = "<unk>"
KINDS = ("byte", "char", "word", "bpe")
DEFAULT_BPE_VOCAB = 8192
PIECE_CHARS = 1 << 16  # subword tokenizers encode lines, and lines longer than this in pieces of this length


class TokenizerError(ValueError):
    """Text that a tokenizer cannot encode, or a tokenizer file that cannot be read."""


class Tokenizer:
    kind: str = ""

    @property
    def vocab_size(self) -> int:
        raise NotImplementedError

    def encode(self, text: str) -> np.ndarray:
        raise NotImplementedError

    def encode_prefix(self, text: str) -> np.ndarray:
        """The ids of a text that goes on after it (a prompt): :meth:`encode`'s, unless a kind says otherwise (a
        pretrained tokenizer puts its beginning-of-text token first)."""
        return self.encode(text)

    def decode(self, ids: Iterable[int]) -> str:
        raise NotImplementedError

    def offsets(self, text: str) -> np.ndarray:
        """The character span [start, end) in ``text`` of every token ``encode(text)`` gives: (n, 2)."""
        raise NotImplementedError

    def byte_lengths(self) -> np.ndarray:
        """The UTF-8 bytes of the text every id stands for, (vocab_size,) int64 (see the module docstring)."""
        raise NotImplementedError

    def text_bytes(self, ids, previous=None) -> int:
        """The UTF-8 bytes of the text ``ids`` stand for: any shape with ``previous`` (the same shape: the id before
        each one, which a word tokenizer reads for the space between two words), else one sequence."""
        table = getattr(self, "_byte_table", None)
        if table is None:
            table = self._byte_table = self.byte_lengths()
        return int(table[np.asarray(ids, dtype=np.int64)].sum())

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

    def byte_lengths(self) -> np.ndarray:
        return np.ones(256, dtype=np.int64)

    def to_dict(self) -> dict:
        return {"kind": self.kind}


class UnknownCharacterError(TokenizerError):
    """A character that a character vocabulary lacks, with where it is: ``index`` into the text, 1-based
    ``line`` and ``column``."""

    def __init__(self, char: str, index: int, line: int, column: int, vocab_size: int) -> None:
        self.char, self.index, self.line, self.column = char, index, line, column
        super().__init__(
            f"character {char!r} (U+{ord(char):04X}) at line {line}, column {column} is not in the "
            f"{vocab_size}-character vocabulary"
        )


class CharTokenizer(Tokenizer):
    kind = "char"

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

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> np.ndarray:
        codes = np.frombuffer(text.encode("utf-32-le", errors="surrogatepass"), dtype=np.uint32)  # (n,) code points
        ids = self._table[np.minimum(codes, len(self._table) - 1)]  # the table's last entry is -1
        unknown = np.flatnonzero(ids < 0)
        if unknown.size:
            i = int(unknown[0])
            line = text.count("\n", 0, i) + 1
            raise UnknownCharacterError(text[i], i, line, i - text.rfind("\n", 0, i), self.vocab_size)
        return ids

    def decode(self, ids: Iterable[int]) -> str:
        return "".join(self.chars[int(i)] for i in ids)

    def byte_lengths(self) -> np.ndarray:
        return np.asarray([len(ch.encode("utf-8", errors="surrogatepass")) for ch in self.chars], dtype=np.int64)

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

    def to_dict(self) -> dict:
        return {"kind": self.kind, "words": self.words, "lowercase": self.lowercase}


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


class BPETokenizer(Tokenizer):
    """Byte-level BPE on the HF ``tokenizers`` library.

    ``hf_json`` is the library's ``tokenizer.json`` text (a BPE model).  Text is encoded in the pieces of
    :func:`iter_pieces` (all cores, in the library's ``encode_batch``), so reading a file in blocks encodes it
    exactly as the whole text; no token spans a line end.  ``order[i]`` is the library id of our id ``i``:
    :meth:`frequency_ordered` sorts ids by frequency in the training text (ties by library id), as the
    adaptive softmax cutoffs need.  ``order=None`` keeps the library's ids (``ordered`` is then False).
    Decoding is exact for byte-level files (no normalizer, a ByteLevel decoder), which is what :func:`train_bpe`
    writes and what GPT-2's file is.
    """

    kind = "bpe"

    def __init__(self, hf_json: str, order: Iterable[int] | None = None) -> None:
        try:
            model_type = (json.loads(hf_json).get("model") or {}).get("type")
        except (json.JSONDecodeError, AttributeError) as exc:
            raise TokenizerError(f"not a tokenizers file: {exc}") from None
        if model_type != "BPE":
            raise TokenizerError(f"only BPE tokenizers are supported, this file's model is {model_type!r}")
        try:
            self.hf = HFTokenizer.from_str(hf_json)
        except Exception as exc:  # the library raises its own exception type for a bad file
            raise TokenizerError(f"not a tokenizers file: {exc}") from None
        size = max(self.hf.get_vocab(with_added_tokens=True).values(), default=-1) + 1
        self.ordered = order is not None
        self.order = np.arange(size, dtype=np.int64) if order is None else np.asarray(list(order), dtype=np.int64)
        if not np.array_equal(np.sort(self.order), np.arange(size)):
            raise TokenizerError(f"the id order of a {size}-token BPE tokenizer must be a permutation of 0..{size - 1}")
        self.rank = np.empty_like(self.order)  # library id -> our id
        self.rank[self.order] = np.arange(size)
        self.hf_json = hf_json

    @property
    def vocab_size(self) -> int:
        return len(self.order)

    def frequency_ordered(self, counts: np.ndarray) -> BPETokenizer:
        """This tokenizer with ids sorted by ``counts`` (one per library id, counted in the training text by
        an unordered tokenizer), most frequent first, ties by library id."""
        return BPETokenizer(self.hf_json, np.argsort(-np.asarray(counts), kind="stable"))

    def encode_pieces(self, pieces: list[str], batch: int = 4096) -> np.ndarray:
        """The ids of ``pieces``, ``batch`` pieces per call of the library (which spreads a call over every core)."""
        encode = getattr(self.hf, "encode_batch_fast", self.hf.encode_batch)  # _fast (no offsets) since 0.20
        parts = [np.zeros(0, dtype=np.int64)]
        for start in range(0, len(pieces), batch):
            encodings = encode(pieces[start : start + batch], add_special_tokens=False)
            parts.append(np.fromiter(itertools.chain.from_iterable(e.ids for e in encodings), dtype=np.int64))
        return self.rank[np.concatenate(parts)]

    def encode(self, text: str) -> np.ndarray:
        return self.encode_pieces(list(iter_pieces([text])))

    def offsets(self, text: str) -> np.ndarray:
        pieces = list(iter_pieces([text]))
        starts = np.cumsum([0] + [len(p) for p in pieces[:-1]])
        encodings = self.hf.encode_batch(pieces, add_special_tokens=False)
        spans = [np.asarray(e.offsets, dtype=np.int64).reshape(-1, 2) + start for e, start in zip(encodings, starts)]
        return np.concatenate(spans) if spans else np.zeros((0, 2), dtype=np.int64)

    def decode(self, ids: Iterable[int]) -> str:
        ids = np.asarray(ids if hasattr(ids, "__len__") else list(ids), dtype=np.int64).reshape(-1)
        bad = ids[(ids < 0) | (ids >= self.vocab_size)]
        if bad.size:
            raise TokenizerError(f"id {int(bad[0])} is outside the {self.vocab_size}-token vocabulary")
        return self.hf.decode(self.order[ids].tolist(), skip_special_tokens=False)

    def byte_lengths(self) -> np.ndarray:
        """The bytes each token decodes to: a byte-level token's symbols are one byte each (the library's ByteLevel
        alphabet); an added token, or a token of a file without a ByteLevel decoder, counts the UTF-8 bytes of
        its own decoding."""
        byte_level = (json.loads(self.hf_json).get("decoder") or {}).get("type") == "ByteLevel"
        alphabet = set(pre_tokenizers.ByteLevel.alphabet())
        added = self.hf.get_added_tokens_decoder()
        lengths = np.zeros(len(self.order), dtype=np.int64)
        for ours, library in enumerate(self.order.tolist()):
            token = self.hf.id_to_token(library)
            if token is None:
                continue  # an id the file leaves unused
            if byte_level and library not in added and set(token) <= alphabet:
                lengths[ours] = len(token)
            else:
                lengths[ours] = len(self.hf.decode([library], skip_special_tokens=False).encode("utf-8"))
        return lengths

    def to_dict(self) -> dict:
        data = {"kind": self.kind, "tokenizer": json.loads(self.hf_json)}
        return {**data, "order": self.order.tolist()} if self.ordered else data


def train_bpe(pieces: Iterable[str], vocab_size: int = DEFAULT_BPE_VOCAB) -> BPETokenizer:
    """A byte-level BPE of ``vocab_size`` tokens (the 256 byte symbols and merges) learnt from ``pieces`` of the
    training text, streamed (:func:`iter_pieces`); unordered: see :meth:`BPETokenizer.frequency_ordered`."""
    if not 256 <= vocab_size <= 1 << 24:
        raise TokenizerError(
            f"a byte-level BPE needs vocab_size in [256, 2**24] (the 256 byte symbols), got {vocab_size}"
        )
    hf = HFTokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
        show_progress=False,
    )
    hf.train_from_iterator(pieces, trainer)
    return BPETokenizer(hf.to_str())


def is_tokenizer_path(spec: str) -> bool:
    """Whether a tokenizer spec names a file rather than a kind."""
    return spec not in KINDS and spec not in REGISTERED


def build_tokenizer(spec: str, text: str, lowercase: bool = False, vocab_size: int = DEFAULT_BPE_VOCAB) -> Tokenizer:
    """The tokenizer that ``spec`` names, fitted to training ``text``: ``byte``; ``char`` and ``word`` (their
    vocabularies); ``bpe`` (a BPE of ``vocab_size`` tokens learnt from ``text``); or the path of a tokenizer
    file, used as it is, except that an HF BPE file without our id order gets ids ordered by frequency in ``text``."""
    if spec in REGISTERED:
        return REGISTERED[spec].fit([text], None)
    if spec == "byte":
        return ByteTokenizer()
    if spec == "char":
        return CharTokenizer.build(text)
    if spec == "word":
        return WordTokenizer.build(text, lowercase)
    tokenizer = train_bpe(iter_pieces([text]), vocab_size) if spec == "bpe" else load_tokenizer(spec)
    return fit_order(tokenizer, [text])


def fit_order(tokenizer: Tokenizer, texts: Iterable[str]) -> Tokenizer:
    """``tokenizer`` with frequency-ordered ids if it is an unordered BPE (``texts``: the training text in blocks)."""
    if not isinstance(tokenizer, BPETokenizer) or tokenizer.ordered:
        return tokenizer
    counts = np.zeros(tokenizer.vocab_size, dtype=np.int64)
    for text in texts:
        counts += np.bincount(tokenizer.encode(text), minlength=tokenizer.vocab_size)
    return tokenizer.frequency_ordered(counts)


def tokenizer_from_dict(data: dict, vocab_size: int | None = None, path: str = "tokenizer.json") -> Tokenizer:
    """The tokenizer that ``data`` (ours, or an HF tokenizers file's contents) describes; with ``vocab_size``, it
    must have that many tokens (:func:`check_tokenizer_fits`; ``path`` names the file in the error)."""
    tokenizer = _tokenizer_from_dict(data)
    if vocab_size is not None:
        check_tokenizer_fits(tokenizer, vocab_size, path)
    return tokenizer


REGISTERED: dict[str, type[Tokenizer]] = {}  # kinds in modules of their own (longseq.data.pretrained_tokenizer)


def register_kind(cls: type[Tokenizer]) -> type[Tokenizer]:
    """Make the kind ``cls.kind`` readable from its saved dict (``cls.from_dict``); its module calls this when
    imported (``longseq.data`` imports it)."""
    REGISTERED[cls.kind] = cls
    return cls


def _tokenizer_from_dict(data: dict) -> Tokenizer:
    kind = data.get("kind") if isinstance(data, dict) else None
    if kind in REGISTERED:
        return REGISTERED[kind].from_dict(data)
    if kind == "byte":
        return ByteTokenizer()
    if kind == "char":
        return CharTokenizer(data["chars"])
    if kind == "word":
        return WordTokenizer(data["words"], bool(data.get("lowercase", False)))
    if kind == "bpe":
        return BPETokenizer(json.dumps(data["tokenizer"]), data.get("order"))
    if isinstance(data, dict) and kind is None and "model" in data:  # an HF tokenizers file
        return BPETokenizer(json.dumps(data))
    raise TokenizerError(f"unknown tokenizer kind {kind!r}")


def load_tokenizer(path: str, vocab_size: int | None = None) -> Tokenizer:
    """Any saved tokenizer: ours (``kind`` byte, char, word or bpe) or an HF ``tokenizer.json`` with a BPE model;
    with ``vocab_size``, it must have that many tokens.  The one reader of tokenizer files."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError) as exc:
        raise TokenizerError(f"cannot read tokenizer {path}: {exc}") from None
    try:
        tokenizer = _tokenizer_from_dict(data)
    except (TokenizerError, KeyError, TypeError) as exc:
        raise TokenizerError(f"tokenizer {path}: {exc}") from None
    if vocab_size is not None:
        check_tokenizer_fits(tokenizer, vocab_size, path)
    return tokenizer


def check_tokenizer_fits(tokenizer: Tokenizer, vocab_size: int, path: str) -> None:
    """The tokenizer read from ``path`` must have exactly the model's ``vocab_size`` tokens."""
    if tokenizer.vocab_size != vocab_size:
        raise TokenizerError(
            f"tokenizer {path} has {tokenizer.vocab_size} tokens but the model's vocabulary has {vocab_size}: "
            "the tokenizer belongs to another model"
        )
