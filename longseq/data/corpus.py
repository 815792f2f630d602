"""Corpus readers for the standard language-modeling layouts.

``path`` may be:

* ``None``: the bundled tiny-shakespeare (public domain), split 90/5/5;
* a directory with ``ptb.{train,valid,test}.txt`` (Mikolov's PTB), ``wiki.{train,valid,test}.tokens``
  (WikiText) or ``{train,valid,test}.txt``;
* a single file (enwik8/text8 style), split into the first 90% / next 5% / last 5% of its tokens,
  which is exactly 90M/5M/5M for the 100M-byte enwik8 and text8;
* a directory of documents: every regular file, in sorted order, joined by newlines, then split 90/5/5.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from importlib import resources

import numpy as np

from longseq.data.tokenizers import Tokenizer, build_tokenizer

SPLITS = ("train", "valid", "test")
LAYOUTS = {
    "ptb": "ptb.{}.txt",
    "wikitext": "wiki.{}.tokens",
    "plain": "{}.txt",
}


class CorpusError(ValueError):
    """A corpus that cannot be read: missing, empty, or not valid text."""


@dataclass
class Corpus:
    """Token ids of each split and the tokenizer that produced them."""

    train: np.ndarray
    valid: np.ndarray
    test: np.ndarray
    tokenizer: Tokenizer
    source: str
    doc_ids: dict[str, np.ndarray] | None = None  # per split, the document of every token (directories of documents)

    def split(self, name: str) -> np.ndarray:
        if name not in SPLITS:
            raise CorpusError(f"unknown split {name!r}; choose one of {SPLITS}")
        return getattr(self, name)


def bundled_corpus_path() -> str:
    return str(resources.files("longseq.data") / "corpora" / "tinyshakespeare.txt")


def read_bytes(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise CorpusError(f"cannot read {path}: {exc.strerror}") from None


def decode_text(data: bytes, path: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CorpusError(
            f"{path} is not valid UTF-8 (byte {exc.start}: {data[exc.start : exc.start + 4]!r}); "
            "use --tokenizer byte for binary or non-UTF-8 data"
        ) from None


def _find_layout(directory: str) -> dict[str, str] | None:
    for pattern in LAYOUTS.values():
        files = {split: os.path.join(directory, pattern.format(split)) for split in SPLITS}
        if all(os.path.isfile(f) for f in files.values()):
            return files
    return None


def _read_documents(directory: str) -> list[bytes]:
    names = sorted(
        n for n in os.listdir(directory) if not n.startswith(".") and os.path.isfile(os.path.join(directory, n))
    )
    if not names:
        raise CorpusError(f"{directory} holds no documents and no known layout (ptb.*.txt, wiki.*.tokens, train.txt)")
    docs = [read_bytes(os.path.join(directory, n)) for n in names]
    return [d + b"\n" for d in docs[:-1]] + docs[-1:]  # documents joined by newlines


def _encode(tokenizer: Tokenizer, data: bytes, path: str) -> np.ndarray:
    if tokenizer.kind == "byte":
        return tokenizer.encode(data)
    return tokenizer.encode(decode_text(data, path))


def _check_nonempty(ids: np.ndarray, what: str) -> np.ndarray:
    if ids.size == 0:
        raise CorpusError(f"{what} is empty: no tokens to train or evaluate on")
    return ids


def load_corpus(
    path: str | None, tokenizer_kind: str, tokenizer: Tokenizer | None = None, lowercase: bool = False
) -> Corpus:
    """Read ``path`` into token ids; build the tokenizer from the training text unless one is given."""
    source = bundled_corpus_path() if path is None else os.path.expanduser(path)
    if not os.path.exists(source):
        raise CorpusError(f"corpus path {source} does not exist")
    if os.path.isdir(source) and (files := _find_layout(source)):
        raw = {split: read_bytes(f) for split, f in files.items()}
        if tokenizer is None:
            train_text = raw["train"] if tokenizer_kind == "byte" else decode_text(raw["train"], files["train"])
            tokenizer = build_tokenizer(tokenizer_kind, train_text if isinstance(train_text, str) else "", lowercase)
        ids = {split: _check_nonempty(_encode(tokenizer, raw[split], files[split]), files[split]) for split in SPLITS}
        return Corpus(ids["train"], ids["valid"], ids["test"], tokenizer, source)

    docs = _read_documents(source) if os.path.isdir(source) else [read_bytes(source)]
    data = b"".join(docs)
    if not data.strip():
        raise CorpusError(f"corpus {source} is empty")
    if tokenizer is None:
        text = "" if tokenizer_kind == "byte" else decode_text(data, source)
        tokenizer = build_tokenizer(tokenizer_kind, text, lowercase)
    pieces = [_encode(tokenizer, doc, source) for doc in docs]
    ids = np.concatenate(pieces)
    doc_of = np.concatenate([np.full(len(p), i, dtype=np.int64) for i, p in enumerate(pieces)])
    cuts = [int(len(ids) * 0.9), int(len(ids) * 0.9) + int(len(ids) * 0.05)]
    train, valid, test = np.split(ids, cuts)
    for name, part in zip(SPLITS, (train, valid, test)):
        _check_nonempty(part, f"the {name} split of {source} ({len(ids)} tokens in all)")
    doc_ids = dict(zip(SPLITS, np.split(doc_of, cuts))) if len(docs) > 1 else None
    return Corpus(train, valid, test, tokenizer, source, doc_ids)


def unigram_bits_per_token(train: np.ndarray, target: np.ndarray, vocab_size: int) -> float:
    """Cross-entropy in bits of ``target`` under add-one-smoothed unigram frequencies of ``train``."""
    counts = np.bincount(train, minlength=vocab_size).astype(np.float64) + 1.0
    log_probs = np.log2(counts / counts.sum())
    return float(-log_probs[target].mean())


def ptb_to_char(text: str) -> str:
    """Mikolov's character-level PTB from the word-level files: characters separated by spaces, words by
    `` _ ``, ``<unk>`` kept whole, every line ending in `` \\n``.  Read the result with the ``word``
    tokenizer: each character is then one token and ``<eos>`` marks line ends."""
    lines = []
    for line in text.split("\n"):
        words = line.split()
        if not words and not line:
            continue
        chars = [w if w == "<unk>" else " ".join(w) for w in words]
        lines.append(" _ ".join(chars) + " \n")
    return "".join(lines)


def load_ptb_char(directory: str) -> Corpus:
    """Character-level PTB built from ``ptb.{train,valid,test}.txt`` (see :func:`ptb_to_char`)."""
    from longseq.data.tokenizers import WordTokenizer

    texts = {
        s: ptb_to_char(decode_text(read_bytes(os.path.join(directory, f"ptb.{s}.txt")), directory)) for s in SPLITS
    }
    tokenizer = WordTokenizer.build(texts["train"])
    ids = {s: _check_nonempty(tokenizer.encode(t), f"ptb.{s}.txt") for s, t in texts.items()}
    return Corpus(ids["train"], ids["valid"], ids["test"], tokenizer, os.path.join(directory, "ptb (characters)"))
