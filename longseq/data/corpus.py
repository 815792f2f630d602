"""Corpus readers: the standard language-modeling layouts read into memory, or a prepared corpus by memory map.

The layouts and split rules are those of :mod:`longseq.data.sources`.  Text is tokenized in Python, in RAM,
at every start: right for corpora of a few hundred megabytes at most.  Larger ones are tokenized once by
``longseq data prepare`` (:mod:`longseq.data.prepared`) and then read by memory map; :func:`load_corpus` reads
both, and the two give identical ids.
"""

from __future__ import annotations

import os

import numpy as np

from longseq.config.run import DataConfig
from longseq.data.prepared import load_prepared
from longseq.data.sources import (
    LAYOUTS,
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
)
from longseq.data.tokenizers import (
    DEFAULT_BPE_VOCAB,
    CharTokenizer,
    Tokenizer,
    UnknownCharacterError,
    WordTokenizer,
    build_tokenizer,
    iter_pieces,
)

__all__ = ["LAYOUTS", "SPLITS", "Corpus", "CorpusError", "bundled_corpus_path", "load_corpus", "load_data"]


def encode_bytes(tokenizer: Tokenizer, data: bytes, path: str) -> np.ndarray:
    """``data`` read from ``path`` as token ids; errors name the file."""
    if tokenizer.kind == "byte":
        return tokenizer.encode(data)
    try:
        return tokenizer.encode(decode_text(data, path))
    except UnknownCharacterError as exc:
        raise unknown_character(path, exc) from None


def load_corpus(
    path: str | None,
    tokenizer_kind: str,
    tokenizer: Tokenizer | None = None,
    lowercase: bool = False,
    vocab_size: int | None = None,
    text_column: str = "text",
) -> Corpus:
    """Read ``path`` into token ids; build the tokenizer that the spec ``tokenizer_kind`` names (byte, char, word,
    bpe or a tokenizer file) from the training text unless one is given.  ``vocab_size``: the size of a BPE to
    learn (default 8192).  A prepared directory is read by memory map and must match the spec (and
    ``vocab_size`` when given) or the given tokenizer.  A table file (parquet, arrow, JSON lines) is read by its
    ``text_column`` (:mod:`longseq.data.tables`)."""
    if is_prepared(path):
        return load_prepared(path, tokenizer_kind, tokenizer=tokenizer, lowercase=lowercase, vocab_size=vocab_size)
    source = resolve_source(path, text_column)
    if source.kind == "layout":
        corpus = _load_layout(source, tokenizer_kind, tokenizer, lowercase, vocab_size or DEFAULT_BPE_VOCAB)
    else:
        corpus = _load_stream(source, tokenizer_kind, tokenizer, lowercase, vocab_size or DEFAULT_BPE_VOCAB)
    if tokenizer is not None:
        check_known(corpus)
    return corpus


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
        config.path, config.tokenizer, tokenizer, config.lowercase, config.vocab_size, config.text_column
    )


def _load_layout(source: Source, spec: str, tokenizer, lowercase: bool, vocab_size: int) -> Corpus:
    files = source.files
    raw = {split: read_bytes(f) for split, f in files.items()}
    if tokenizer is None and spec == "char":
        # every character of the three files: which characters exist is all it reads of valid and test (no
        # counts), as for the byte tokenizer, whose 256 values all exist; else one rare character of the test
        # text would make the corpus unreadable
        tokenizer = CharTokenizer.build(decode_text(raw[s], files[s]) for s in SPLITS)
    elif tokenizer is None:
        train_text = "" if spec == "byte" else decode_text(raw["train"], files["train"])
        tokenizer = build_tokenizer(spec, train_text, lowercase, vocab_size)
    ids = {split: check_nonempty(encode_bytes(tokenizer, raw[split], files[split]), files[split]) for split in SPLITS}
    return Corpus(ids["train"], ids["valid"], ids["test"], tokenizer, source.path)


def _load_stream(source: Source, spec: str, tokenizer, lowercase: bool, vocab_size: int) -> Corpus:
    """A single file or a directory of documents (joined by newlines): one stream, split 90/5/5 by tokens."""
    paths = source.files
    docs = [_table_bytes(source) if source.kind == "table" else read_bytes(p) for p in paths]
    docs = [d + b"\n" for d in docs[:-1]] + docs[-1:]  # documents joined by newlines
    data = b"".join(docs)
    if not data.strip():
        raise CorpusError(f"corpus {source.path} is empty")
    if tokenizer is None:
        text = "" if spec == "byte" else "".join(decode_text(d, p) for d, p in zip(docs, paths))
        if spec not in ("byte", "char", "word"):  # a subword tokenizer learns from the training text only
            text = "".join(training_pieces(iter_pieces([text]), len(data)))
        tokenizer = build_tokenizer(spec, text, lowercase, vocab_size)
    pieces = [encode_bytes(tokenizer, doc, p) for doc, p in zip(docs, paths)]
    ids = np.concatenate(pieces)
    doc_of = np.concatenate([np.full(len(p), i, dtype=np.int64) for i, p in enumerate(pieces)])
    cuts = list(split_cuts(len(ids)))
    train, valid, test = np.split(ids, cuts)
    for name, part in zip(SPLITS, (train, valid, test)):
        check_nonempty(part, f"the {name} split of {source.path} ({len(ids)} tokens in all)")
    doc_ids = dict(zip(SPLITS, np.split(doc_of, cuts))) if len(docs) > 1 else None
    return Corpus(train, valid, test, tokenizer, source.path, doc_ids)


def _table_bytes(source: Source) -> bytes:
    """A table's text column, its rows joined by newlines, as UTF-8 (read into memory: a corpus in RAM)."""
    from longseq.data.tables import text_blocks

    return "".join(text_blocks(source.path, source.column)).encode("utf-8", errors="surrogatepass")


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
