"""Tokenizers, one kind a module, each saved as JSON, named in one registry (:data:`TOKENIZERS`).

* ``byte``: the 256 UTF-8 byte values (enwik8 style); decodes invalid UTF-8 with replacement.
* ``char``: the characters of the corpus, sorted by code point.
* ``word``: whitespace tokens ordered by frequency, ``<eos>`` at every line end, ``<unk>`` for unseen words.
* ``bpe``: byte-level BPE on the HF ``tokenizers`` library, trained on the training text or read from any BPE
  ``tokenizer.json`` (GPT-2's); ids ordered by frequency in the training text.
* ``pretrained``: an imported model's own tokenizer (``longseq convert --from-hf``), its ids as they are, its special
  tokens and chat template; never learnt from text (docs/pretrained.md).

A tokenizer is named by a *spec*: a kind of :data:`TOKENIZERS`, or the path of a tokenizer file (ours, or an HF
``tokenizer.json``); see :func:`build_tokenizer`.  A new kind is one module with one :class:`Tokenizer` subclass
(:mod:`longseq.data.tokenizers.base` says what it gives) and one entry here.

Bytes of a text, for bits per byte (:meth:`Tokenizer.text_bytes`): the UTF-8 bytes of the text the ids stand for.
A byte is one byte, a character its UTF-8 length, a byte-level BPE token the bytes it decodes to, so the ids of a
file count its bytes exactly.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

import numpy as np

from longseq.data.tokenizers.base import (
    DEFAULT_BPE_VOCAB,
    EOS,
    PIECE_CHARS,
    UNK,
    Settings,
    Tokenizer,
    TokenizerError,
    UnknownCharacterError,
    iter_pieces,
    unknown_at,
    whole_lines,
)
from longseq.data.tokenizers.bpe import BPETokenizer, train_bpe
from longseq.data.tokenizers.byte import ByteTokenizer
from longseq.data.tokenizers.char import CharTokenizer
from longseq.data.tokenizers.pretrained import PretrainedTokenizer
from longseq.data.tokenizers.word import WordTokenizer

TOKENIZERS: dict[str, type[Tokenizer]] = {
    cls.kind: cls for cls in (ByteTokenizer, CharTokenizer, WordTokenizer, BPETokenizer, PretrainedTokenizer)
}
KINDS = tuple(TOKENIZERS)

__all__ = [
    "DEFAULT_BPE_VOCAB",
    "EOS",
    "KINDS",
    "PIECE_CHARS",
    "PretrainedTokenizer",
    "TOKENIZERS",
    "UNK",
    "BPETokenizer",
    "ByteTokenizer",
    "CharTokenizer",
    "Settings",
    "Tokenizer",
    "TokenizerError",
    "UnknownCharacterError",
    "WordTokenizer",
    "build_tokenizer",
    "check_tokenizer_fits",
    "fit_order",
    "is_tokenizer_path",
    "iter_pieces",
    "load_tokenizer",
    "newline_id",
    "prefix_id",
    "tokenizer_class",
    "tokenizer_from_dict",
    "train_bpe",
    "unknown_at",
    "whole_lines",
]


def is_tokenizer_path(spec: str) -> bool:
    """Whether a tokenizer spec names a file (a ``.json``) rather than a kind."""
    return spec not in TOKENIZERS and spec.lower().endswith(".json")


def tokenizer_class(spec: str) -> type[Tokenizer]:
    """The kind ``spec`` names, or an error that lists the kinds."""
    if spec not in TOKENIZERS:
        raise TokenizerError(
            f"unknown tokenizer {spec!r}: choose one of {', '.join(TOKENIZERS)}, or a tokenizer .json file"
        )
    return TOKENIZERS[spec]


def newline_id(tokenizer: Tokenizer) -> int | None:
    """The one id of a line end (a word tokenizer's ``<eos>``; the newline byte or character; a BPE's newline token),
    or None where the tokenizer has no single token for it (a character vocabulary without the newline).  What
    longseq's corpora put between documents: the prefix token a document is read after by the LM evaluation
    harness (``prefix_token_id``)."""
    try:
        ids = tokenizer.encode_prompt("\n")
    except TokenizerError:  # a character vocabulary without the newline
        return None
    return int(ids[0]) if len(ids) == 1 else None


def prefix_id(tokenizer: Tokenizer) -> int | None:
    """The token a document is read after (the LM evaluation harness's ``prefix_token_id``): a pretrained model's own
    beginning of text (:attr:`Tokenizer.document_start_id`), else the line end longseq's corpora put between
    documents (:func:`newline_id`)."""
    own = tokenizer.document_start_id
    return own if own is not None else newline_id(tokenizer)


def build_tokenizer(spec: str, text: str, lowercase: bool = False, vocab_size: int = DEFAULT_BPE_VOCAB) -> Tokenizer:
    """The tokenizer that ``spec`` names, fitted to training ``text``: a kind of :data:`TOKENIZERS` (``byte``;
    ``char`` and ``word`` their vocabularies; ``bpe`` a BPE of ``vocab_size`` tokens learnt from ``text``), or the
    path of a tokenizer file, used as it is, except that an HF BPE file without our id order gets ids ordered by
    frequency in ``text``."""
    if is_tokenizer_path(spec):
        tokenizer = load_tokenizer(spec)
    else:
        tokenizer = tokenizer_class(spec).fit([text], Settings(lowercase, vocab_size))
    return fit_order(tokenizer, [text])


def fit_order(tokenizer: Tokenizer, texts: Iterable[str]) -> Tokenizer:
    """``tokenizer`` with frequency-ordered ids where its ids are still to be ordered (``texts``: the training text
    in blocks)."""
    if tokenizer.ordered:
        return tokenizer
    counts = np.zeros(tokenizer.vocab_size, dtype=np.int64)
    for text in texts:
        counts += np.bincount(tokenizer.encode(text), minlength=tokenizer.vocab_size)
    return tokenizer.frequency_ordered(counts)


def tokenizer_from_dict(data: dict, vocab_size: int | None = None, path: str = "tokenizer.json") -> Tokenizer:
    """The tokenizer that ``data`` (ours, or an HF tokenizers file's contents) describes; with ``vocab_size``, it
    must have that many tokens (:func:`check_tokenizer_fits`; ``path`` names the file in the error)."""
    tokenizer = _from_dict(data)
    if vocab_size is not None:
        check_tokenizer_fits(tokenizer, vocab_size, path)
    return tokenizer


def _from_dict(data: dict) -> Tokenizer:
    kind = data.get("kind") if isinstance(data, dict) else None
    if kind is None and isinstance(data, dict) and "model" in data:  # an HF tokenizers file
        return BPETokenizer.from_dict(data)
    if kind not in TOKENIZERS:
        raise TokenizerError(f"unknown tokenizer kind {kind!r}")
    return TOKENIZERS[kind].from_dict(data)


def load_tokenizer(path: str, vocab_size: int | None = None) -> Tokenizer:
    """Any saved tokenizer: ours (a ``kind`` of :data:`TOKENIZERS`) or an HF ``tokenizer.json`` with a BPE model;
    with ``vocab_size``, it must have that many tokens.  The one reader of tokenizer files."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError) as exc:
        raise TokenizerError(f"cannot read tokenizer {path}: {exc}") from None
    try:
        tokenizer = _from_dict(data)
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
