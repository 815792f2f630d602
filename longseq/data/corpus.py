"""Corpus readers: the standard language-modeling layouts read into memory, or a prepared corpus by memory map.

The layouts and split rules are those of :mod:`longseq.data.sources`.  Text is tokenized in Python, in RAM,
at every start: right for corpora of a few hundred megabytes at most.  Larger ones are tokenized once by
``longseq data prepare`` (:mod:`longseq.data.prepared`) and then read by memory map; :func:`load_corpus` reads
both, and the two give identical ids.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable

import numpy as np

from longseq.config.run import DataConfig
from longseq.data.prepared import load_prepared
from longseq.data.sources import (
    SPLITS,
    Corpus,
    CorpusError,
    Source,
    bundled_corpus_path,
    check_nonempty,
    decode_text,
    is_prepared,
    read_bytes,
    resolve_source,
    split_cuts,
    token_counts,
    training_pieces,
    unknown_character,
    with_line_documents,
)
from longseq.data.tokenizers import (
    DEFAULT_BPE_VOCAB,
    Settings,
    Tokenizer,
    UnknownCharacterError,
    WordTokenizer,
    fit_order,
    is_tokenizer_path,
    iter_pieces,
    load_tokenizer,
    tokenizer_class,
)

__all__ = ["SPLITS", "Corpus", "CorpusError", "bundled_corpus_path", "load_corpus", "load_data"]


def encode_text(source: Source, tokenizer: Tokenizer, text: str | bytes, path: str) -> np.ndarray:
    """``text`` read from ``path`` as token ids; a character the vocabulary lacks is named where the file has it."""
    try:
        return tokenizer.encode(text)
    except UnknownCharacterError as exc:
        raise unknown_character(source, path, exc) from None


def _kind(spec: str, tokenizer: Tokenizer | None) -> Tokenizer | type[Tokenizer]:
    """The tokenizer given, the one a tokenizer file holds, or the kind ``spec`` names (to be fitted)."""
    if tokenizer is not None:
        return tokenizer
    return load_tokenizer(spec) if is_tokenizer_path(spec) else tokenizer_class(spec)


def _fitted(kind, settings: Settings, text: Callable[[str], Iterable[str]]) -> Tokenizer:
    """``kind`` fitted on ``text(fit_on)`` (the blocks of the text it learns from) and its ids ordered on the
    training text where they are still to be."""
    if isinstance(kind, type):
        kind = kind.fit(text(kind.fit_on) if kind.fit_on != "nothing" else [], settings)
    return fit_order(kind, text("train"))


def load_corpus(
    path: str | None,
    tokenizer_kind: str,
    tokenizer: Tokenizer | None = None,
    lowercase: bool = False,
    vocab_size: int | None = None,
    text_column: str = "text",
    clip_seconds: float = 0.0,
) -> Corpus:
    """Read ``path`` into token ids; build the tokenizer that the spec ``tokenizer_kind`` names (a kind of
    :data:`~longseq.data.tokenizers.TOKENIZERS`, or a tokenizer file) from the text it learns from, unless one is
    given.  ``vocab_size``: the size of a BPE to
    learn (default 8192).  A prepared directory is read by memory map and must match the spec (and
    ``vocab_size`` when given) or the given tokenizer.  Every file is read by its reader
    (:mod:`longseq.data.readers`): a table file (parquet, arrow, JSON lines) by its ``text_column``, audio in clips of ``clip_seconds`` (0: whole files)."""
    if is_prepared(path):
        return load_prepared(path, tokenizer_kind, tokenizer=tokenizer, lowercase=lowercase, vocab_size=vocab_size)
    source = resolve_source(path, text_column, clip_seconds)
    load = _load_layout if source.kind == "layout" else _load_stream
    corpus = load(source, tokenizer_kind, tokenizer, Settings(lowercase, vocab_size or DEFAULT_BPE_VOCAB))
    if tokenizer is not None:
        check_known(corpus)
    return with_line_documents(corpus)


MAX_UNKNOWN_SHARE = 0.5  # word-level PTB has 5% <unk>; a text read with another corpus's vocabulary has far more


def check_known(corpus: Corpus) -> None:
    """Refuse a corpus read with a given word vocabulary (a checkpoint's) that does not know most of its tokens:
    the vocabulary was built from another corpus, and every score on it would be a score of ``<unk>``."""
    unk = getattr(corpus.tokenizer, "unk_id", None)
    if unk is None:
        return
    parts = (corpus.train, corpus.valid, corpus.test)
    share = sum(int(np.count_nonzero(p == unk)) for p in parts) / sum(len(p) for p in parts)
    if share > MAX_UNKNOWN_SHARE:
        raise CorpusError(
            f"{share:.0%} of the tokens of {corpus.source} are unknown to the tokenizer given "
            f"({corpus.tokenizer.vocab_size:,} words): it was built from another corpus"
        )


def load_data(config: DataConfig, tokenizer: Tokenizer | None = None) -> Corpus:
    """The corpus that a :class:`~longseq.config.run.DataConfig` names (its path, tokenizer, lowercase and
    BPE vocabulary size)."""
    return load_corpus(
        config.path,
        config.tokenizer,
        tokenizer,
        config.lowercase,
        config.vocab_size,
        config.text_column,
        config.clip_seconds,
    )


def _load_layout(source: Source, spec: str, tokenizer, settings: Settings) -> Corpus:
    files, kind = source.files, _kind(spec, tokenizer)
    texts = {split: source.read(f, kind.reads_bytes) for split, f in files.items()}
    tokenizer = _fitted(kind, settings, lambda on: [texts[s] for s in (SPLITS if on == "all" else ("train",))])
    ids = {s: check_nonempty(encode_text(source, tokenizer, texts[s], files[s]), files[s]) for s in SPLITS}
    return Corpus(ids["train"], ids["valid"], ids["test"], tokenizer, source.path)


def _load_stream(source: Source, spec: str, tokenizer, settings: Settings) -> Corpus:
    """A single file or a directory of documents (joined by newlines): one stream, split 90/5/5 by tokens."""
    paths, kind = source.files, _kind(spec, tokenizer)
    join = b"\n" if kind.reads_bytes else "\n"
    docs = [source.read(p, kind.reads_bytes) for p in paths]
    docs = [d + join for d in docs[:-1]] + docs[-1:]  # documents joined by newlines
    text = join[:0].join(docs)
    if not text.strip():
        raise CorpusError(f"corpus {source.path} is empty")
    total = len(text) if kind.reads_bytes else len(text.encode("utf-8", errors="surrogatepass"))
    tokenizer = _fitted(
        kind, settings, lambda on: [text] if on == "all" else training_pieces(iter_pieces([text]), total)
    )
    pieces = [encode_text(source, tokenizer, doc, p) for doc, p in zip(docs, paths)]
    ids = np.concatenate(pieces)
    doc_of = np.concatenate([np.full(len(p), i, dtype=np.int64) for i, p in enumerate(pieces)])
    cuts = list(split_cuts(len(ids)))
    train, valid, test = np.split(ids, cuts)
    for name, part in zip(SPLITS, (train, valid, test)):
        check_nonempty(part, f"the {name} split of {source.path} ({len(ids)} tokens in all)")
    doc_ids = dict(zip(SPLITS, np.split(doc_of, cuts))) if len(docs) > 1 else None
    return Corpus(train, valid, test, tokenizer, source.path, doc_ids)


def unigram_bits_per_token(train: np.ndarray, target: np.ndarray, vocab_size: int) -> float:
    """Cross-entropy in bits of ``target`` under add-one-smoothed unigram frequencies of ``train`` (both read in
    chunks, so a prepared corpus costs one pass over its ids and no memory)."""
    counts = token_counts(train, vocab_size).astype(np.float64) + 1.0
    log_probs = np.log2(counts / counts.sum())
    return float(-(token_counts(target, vocab_size) @ log_probs) / len(target))


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
    texts = {
        s: ptb_to_char(decode_text(read_bytes(os.path.join(directory, f"ptb.{s}.txt")), directory)) for s in SPLITS
    }
    tokenizer = WordTokenizer.build(texts["train"])
    ids = {s: check_nonempty(tokenizer.encode(t), f"ptb.{s}.txt") for s, t in texts.items()}
    return Corpus(ids["train"], ids["valid"], ids["test"], tokenizer, os.path.join(directory, "ptb (characters)"))
