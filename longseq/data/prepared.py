"""Prepared corpora: a corpus tokenized once into flat token files that training and evaluation memory-map.

:func:`prepare_corpus` (``longseq data prepare``) reads the text in blocks, so its memory does not grow with the
corpus, and writes::

    DIR/train.bin, valid.bin, test.bin   the token ids, flat, little-endian uint16 (vocabulary <= 65,536) or uint32
    DIR/tokenizer.json                   the tokenizer
    DIR/index.json                       format, dtype, token counts, document starts, source files with their
                                         sha256, and the sha256 of every file above

The ids are exactly those that :func:`~longseq.data.corpus.load_corpus` computes in RAM for the same source,
tokenizer spec and options (tests hold the two equal).  Passes over the text:

1. fit the tokenizer on the text its kind learns from (char and word vocabularies, a BPE learnt from the streamed
   training text; a loaded tokenizer file and a fixed alphabet such as byte need no pass);
2. encode and write, in the pieces the tokenizer encodes independently; a BPE encodes in the library's
   ``encode_batch`` on every core;
3. a BPE without our id order counts its ids on the training text during pass 2 and then renumbers the files
   in place, in chunks, so that ids are ordered by frequency (the adaptive softmax relies on it);
4. a single stream (one file, or a directory of documents) is cut 90/5/5 by tokens into the three files.

Everything is written under a temporary name and renamed into place at the end: a killed run leaves no
half-written directory.  :func:`load_prepared` checks ``index.json`` against every file (sizes, sha256, the
tokenizer) and reports a truncated, corrupted or mismatched file by name.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import time
from collections.abc import Iterator

import numpy as np

from longseq.data.readers import BLOCK_BYTES, Tap
from longseq.data.sources import (
    PREPARED_INDEX,
    SPLITS,
    TRAIN_FRACTION,
    Corpus,
    CorpusError,
    DocumentIds,
    Source,
    file_sha256,
    is_prepared,
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
    TokenizerError,
    UnknownCharacterError,
    is_tokenizer_path,
    iter_pieces,
    load_tokenizer,
    tokenizer_class,
)
from longseq.progress import Meter

FORMAT = "longseq-prepared-v1"
BATCH_CHARS = 1 << 22  # characters per encode_batch call
CHUNK_TOKENS = 1 << 23  # token ids per chunk when ids are counted or renumbered
DTYPES = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}  # little-endian on every machine


class _Reader:
    """Reads the source's files through their readers (:meth:`Source.reader`), hashing each file, behind one
    progress meter (a bar on a terminal, plain lines on stderr elsewhere: :class:`~longseq.progress.Meter`) over
    their text's bytes, files and the tokens written."""

    def __init__(self, source: Source, desc: str, progress: bool, splits: tuple[str, ...] = SPLITS) -> None:
        """``splits``: the files of a layout this pass reads (the meter's total; a single stream reads all)."""
        self.source = source
        self.paths = [source.files[s] for s in splits] if isinstance(source.files, dict) else list(source.files)
        self.total = sum(source.reader(p).text_bytes(p) for p in self.paths)
        self.stream_bytes = self.total + (len(self.paths) - 1 if source.kind == "documents" else 0)  # with the joins
        self.meter = Meter(self.total, desc, unit="B", enabled=progress, totals={"files": len(self.paths)})
        self.digests: dict[str, str] = {}

    def blocks(self, path: str, binary: bool = False) -> Iterator[str | bytes]:
        """The text of ``path`` in blocks (its UTF-8 bytes with ``binary``), metered; its sha256 is kept."""
        reader = self.source.reader(path)
        try:
            with open(path, "rb") as f:
                tap = Tap(f)
                for block in reader.byte_blocks(path, tap) if binary else reader.text_blocks(path, tap):
                    self.meter.update(len(block) if binary else len(block.encode("utf-8", errors="surrogatepass")))
                    yield block
                self.digests[path] = tap.drain()
        except OSError as exc:
            raise CorpusError(f"cannot read {path}: {exc.strerror}") from None
        self.meter.count("files", 1)

    def stream_blocks(self, paths: list[str], binary: bool = False) -> Iterator[str | bytes]:
        """The blocks of ``paths`` read as one stream: documents joined by a newline."""
        for i, path in enumerate(paths):
            yield from self.blocks(path, binary)
            if i < len(paths) - 1:
                yield b"\n" if binary else "\n"

    def close(self) -> None:
        self.meter.close()


def fit_tokenizer(source: Source, spec: str, vocab_size: int, lowercase: bool, progress: bool) -> Tokenizer:
    """Pass 1: the tokenizer of ``spec`` fitted to ``source`` as :func:`~longseq.data.corpus.load_corpus` fits it:
    on the text its kind learns from (``fit_on``: every split, the training text, or nothing; a single stream's
    training text is the pieces that start in its first 90% of bytes).  A BPE's id order is fitted in pass 2."""
    if is_tokenizer_path(spec):
        return load_tokenizer(spec)
    kind, settings = tokenizer_class(spec), Settings(lowercase, vocab_size)
    if kind.fit_on == "nothing":
        return kind.fit([], settings)
    splits = SPLITS if kind.fit_on == "all" else ("train",)
    reader = _Reader(source, f"fit {spec}", progress, splits)
    try:
        if source.kind == "layout":
            blocks = (block for s in splits for block in reader.blocks(source.files[s]))
        else:
            blocks = reader.stream_blocks(source.files)
            if kind.fit_on == "train":
                blocks = training_pieces(iter_pieces(blocks), reader.stream_bytes)
        return kind.fit(blocks, settings)
    finally:
        reader.close()


class _TrainingMark:
    """Finds, while a single stream is encoded, how many of its tokens come from the training text: the pieces that
    start in its first 90% of ``total_bytes`` (:func:`~longseq.data.sources.training_pieces`)."""

    def __init__(self, total_bytes: int) -> None:
        self.limit, self.offset, self.tokens = int(total_bytes * TRAIN_FRACTION), 0, None

    def passed(self, piece: str | bytes) -> bool:
        """Whether ``piece`` starts past the training text (counting its bytes if not)."""
        if self.offset >= self.limit:
            return True
        self.offset += len(piece) if isinstance(piece, bytes) else len(piece.encode("utf-8", errors="surrogatepass"))
        return False


class _Position:
    """The line and column (1-based) where the next piece of a file's text starts, for errors."""

    def __init__(self) -> None:
        self.lines, self.column = 0, 0  # newlines before the piece, and characters of its first line before it

    def of(self, exc: UnknownCharacterError) -> tuple[int, int]:
        return self.lines + exc.line, exc.column + (self.column if exc.line == 1 else 0)

    def advance(self, piece: str) -> None:
        newlines = piece.count("\n")
        self.column = len(piece) - piece.rfind("\n") - 1 if newlines else self.column + len(piece)
        self.lines += newlines


def write_stream(tokenizer: Tokenizer, reader: _Reader, paths: list[str], out: _TokenFile, mark=None) -> list[int]:
    """Pass 2 for one stream: encode ``paths`` (documents joined by a newline) into ``out``, in the pieces the
    tokenizer encodes independently (:meth:`~longseq.data.tokenizers.Tokenizer.pieces`), equal to encoding each
    document at once; with ``mark``, the tokens of the training text are counted.  Returns each document's tokens."""
    per_doc, binary = [], tokenizer.reads_bytes
    for i, path in enumerate(paths):
        before = out.tokens
        blocks = itertools.chain(reader.blocks(path, binary), [b"\n" if binary else "\n"] if i < len(paths) - 1 else [])
        batch, size, position = [], 0, _Position()
        for piece in tokenizer.pieces(blocks):
            if mark is not None and mark.tokens is None and mark.passed(piece):
                _encode(tokenizer, batch, out, reader.source, path, position)  # the training text ends here
                batch, size, mark.tokens = [], 0, out.tokens
            batch.append(piece)
            size += len(piece)
            if size >= BATCH_CHARS:
                _encode(tokenizer, batch, out, reader.source, path, position)
                batch, size = [], 0
        _encode(tokenizer, batch, out, reader.source, path, position)
        per_doc.append(out.tokens - before)
    return per_doc


def _encode(tokenizer: Tokenizer, batch: list, out: _TokenFile, source: Source, path: str, position: _Position):
    """``batch`` of pieces encoded into ``out``; a character the vocabulary lacks is named at its place in ``path``."""
    try:
        out.write(tokenizer.encode_pieces(batch))
    except UnknownCharacterError:
        for piece in batch:  # find the piece, and the place in it
            try:
                tokenizer.encode(piece)
            except UnknownCharacterError as exc:
                raise unknown_character(source, path, exc, *position.of(exc)) from None
            position.advance(piece)
        raise
    if not tokenizer.reads_bytes:
        position.advance("".join(batch))


class _TokenFile:
    """A .bin file written incrementally; every id is checked against the vocabulary; ``meter`` counts the
    tokens written."""

    def __init__(self, path: str, dtype: np.dtype, vocab_size: int, meter: Meter | None = None) -> None:
        self.path, self.dtype, self.vocab_size, self.tokens, self.meter = path, dtype, vocab_size, 0, meter
        self.file = open(path, "wb")

    def write(self, ids: np.ndarray) -> None:
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
            raise TokenizerError(f"the tokenizer produced an id outside its {self.vocab_size}-token vocabulary")
        self.file.write(ids.astype(self.dtype).tobytes())
        self.tokens += len(ids)
        if self.meter is not None:
            self.meter.count("tokens", len(ids))

    def close(self) -> None:
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()


def _renumber(path: str, dtype: np.dtype, rank: np.ndarray) -> None:
    """Map every id of ``path`` through ``rank``, in place, a chunk at a time."""
    if os.path.getsize(path) == 0:
        return
    ids = np.memmap(path, dtype=dtype, mode="r+")
    table = rank.astype(dtype)
    for start in range(0, len(ids), CHUNK_TOKENS):
        ids[start : start + CHUNK_TOKENS] = table[ids[start : start + CHUNK_TOKENS]]
    ids.flush()
    del ids


def _split_stream(directory: str, dtype: np.dtype, n_tokens: int) -> dict[str, tuple[int, int]]:
    """Cut ``directory/all.bin`` into train/valid/test.bin at 90/5/5 of its tokens: (offset, tokens) of each."""
    cuts = (0, *split_cuts(n_tokens), n_tokens)
    size = np.dtype(dtype).itemsize
    with open(os.path.join(directory, "all.bin"), "rb") as src:
        for split, (start, stop) in zip(SPLITS[1:], zip(cuts[1:3], cuts[2:4])):
            src.seek(start * size)
            with open(os.path.join(directory, f"{split}.bin"), "wb") as dst:
                remaining = (stop - start) * size
                while remaining:
                    block = src.read(min(remaining, BLOCK_BYTES))
                    dst.write(block)
                    remaining -= len(block)
    os.truncate(os.path.join(directory, "all.bin"), cuts[1] * size)
    os.replace(os.path.join(directory, "all.bin"), os.path.join(directory, "train.bin"))
    return {split: (cuts[i], cuts[i + 1] - cuts[i]) for i, split in enumerate(SPLITS)}


def _encode_source(source: Source, tokenizer: Tokenizer, tmp: str, dtype, progress: bool):
    """Pass 2: every split's ids into ``tmp``; returns (offset, tokens) per split, the document starts (or None),
    the source files' sha256, and for an unordered BPE the count of every id in the training text."""
    reader = _Reader(source, "encode", progress)
    unordered = not tokenizer.ordered
    try:
        if source.kind == "layout":
            spans, offset = {}, 0
            for split in SPLITS:
                out = _TokenFile(os.path.join(tmp, f"{split}.bin"), dtype, tokenizer.vocab_size, reader.meter)
                write_stream(tokenizer, reader, [source.files[split]], out)
                out.close()
                spans[split], offset = (offset, out.tokens), offset + out.tokens
            counts = _counts(os.path.join(tmp, "train.bin"), dtype, spans["train"][1], tokenizer) if unordered else None
            return spans, None, reader.digests, counts
        out = _TokenFile(os.path.join(tmp, "all.bin"), dtype, tokenizer.vocab_size, reader.meter)
        mark = _TrainingMark(reader.stream_bytes)
        per_doc = write_stream(tokenizer, reader, list(source.files), out, mark)
        out.close()
        counts = (
            _counts(out.path, dtype, out.tokens if mark.tokens is None else mark.tokens, tokenizer)
            if unordered
            else None
        )
        starts = np.concatenate([[0], np.cumsum(per_doc)[:-1]]).tolist() if len(per_doc) > 1 else None
        return _split_stream(tmp, dtype, out.tokens), starts, reader.digests, counts
    finally:
        reader.close()


def _counts(path: str, dtype: np.dtype, n_tokens: int, tokenizer: Tokenizer) -> np.ndarray:
    """How often every id occurs in the first ``n_tokens`` of ``path`` (the training text)."""
    if n_tokens == 0:
        return np.zeros(tokenizer.vocab_size, dtype=np.int64)
    return token_counts(np.memmap(path, dtype=dtype, mode="r", shape=(n_tokens,)), tokenizer.vocab_size, CHUNK_TOKENS)


def prepare_corpus(
    path: str | None,
    tokenizer_spec: str,
    out_dir: str,
    *,
    vocab_size: int = DEFAULT_BPE_VOCAB,
    lowercase: bool = False,
    progress: bool = True,
    text_column: str = "text",
    clip_seconds: float = 0.0,
) -> dict:
    """Tokenize the corpus at ``path`` once into ``out_dir`` (see the module docstring); returns a summary.  A table
    (parquet, arrow, JSON lines: :mod:`longseq.data.tables`) is read by its ``text_column``, streamed; audio is cut into clips of ``clip_seconds``."""
    if is_prepared(path):
        raise CorpusError(f"{path} is already a prepared corpus")
    source = resolve_source(path, text_column, clip_seconds)
    out_dir = os.path.abspath(os.path.expanduser(out_dir))
    if os.path.exists(out_dir) and (not os.path.isdir(out_dir) or os.listdir(out_dir)):
        raise CorpusError(f"{out_dir} already exists and is not empty; remove it or choose another --out")
    tmp = f"{out_dir}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    try:
        start = time.perf_counter()
        tokenizer = fit_tokenizer(source, tokenizer_spec, vocab_size, lowercase, progress)
        fitted = time.perf_counter()
        dtype = DTYPES["uint16" if tokenizer.vocab_size <= 1 << 16 else "uint32"]
        spans, starts, hashes, counts = _encode_source(source, tokenizer, tmp, dtype, progress)
        encoded = time.perf_counter()
        for split, (_, n) in spans.items():
            if n == 0:
                what = source.files[split] if source.kind == "layout" else f"the {split} split of {source.path}"
                raise CorpusError(f"{what} is empty: no tokens to train or evaluate on")
        if counts is not None:  # pass 3: ids ordered by frequency in the training text
            tokenizer = tokenizer.frequency_ordered(counts)
            for split in SPLITS:
                _renumber(os.path.join(tmp, f"{split}.bin"), dtype, tokenizer.rank)
        index = _write_index(
            tmp, source, tokenizer, tokenizer_spec, vocab_size, lowercase, dtype, spans, starts, hashes
        )
        if os.path.isdir(out_dir):
            os.rmdir(out_dir)  # empty (checked above)
        os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    tokens = sum(n for _, n in spans.values())
    return {
        "out": out_dir,
        "tokenizer": tokenizer.kind,
        "vocab_size": tokenizer.vocab_size,
        "dtype": _dtype_name(dtype),
        **{f"{split}_tokens": index["splits"][split]["tokens"] for split in SPLITS},
        "fit_s": fitted - start,
        "encode_s": encoded - fitted,
        "encode_tokens_per_s": tokens / max(encoded - fitted, 1e-9),
        "total_s": time.perf_counter() - start,
    }


def _write_index(tmp, source, tokenizer, spec, vocab_size, lowercase, dtype, spans, starts, hashes) -> dict:
    tokenizer.save(os.path.join(tmp, "tokenizer.json"))
    index = {
        "format": FORMAT,
        "dtype": _dtype_name(dtype),
        "vocab_size": tokenizer.vocab_size,
        "tokenizer": {
            "file": "tokenizer.json",
            "sha256": file_sha256(os.path.join(tmp, "tokenizer.json")),
            "spec": spec if not is_tokenizer_path(spec) else os.path.abspath(spec),
            "kind": tokenizer.kind,
            "lowercase": lowercase,
            "bpe_vocab_size": vocab_size if spec == "bpe" else None,
        },
        "source": {
            "path": os.path.abspath(source.path),
            "kind": source.kind,
            "readers": sorted({source.reader(path).name for path in hashes}),
            **{key: value for path in hashes for key, value in source.reader(path).settings().items()},
            "files": [{"path": os.path.abspath(p), "sha256": h} for p, h in hashes.items()],
        },
        "splits": {
            split: {
                "file": f"{split}.bin",
                "tokens": n,
                "offset": offset,
                "sha256": file_sha256(os.path.join(tmp, f"{split}.bin")),
            }
            for split, (offset, n) in spans.items()
        },
        "documents": starts,
    }
    with open(os.path.join(tmp, PREPARED_INDEX), "w", encoding="utf-8") as f:
        json.dump(index, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    return index


def _dtype_name(dtype: np.dtype) -> str:
    return next(name for name, d in DTYPES.items() if d == dtype)


def load_prepared(
    directory: str,
    tokenizer_spec: str | None = None,
    *,
    tokenizer: Tokenizer | None = None,
    lowercase: bool = False,
    vocab_size: int | None = None,
    verify: bool = True,
) -> Corpus:
    """The prepared corpus in ``directory``, its splits memory-mapped (nothing is loaded).

    ``index.json`` is checked against every file: sizes always, the sha256 of every ``.bin`` with ``verify``
    (one read of each file, chunk by chunk; about a second per GB).  With ``tokenizer`` (a checkpoint's), the
    prepared tokenizer must equal it; else ``tokenizer_spec``, ``lowercase`` and ``vocab_size`` (when given) must
    be those it was prepared with.  Any mismatch is a :class:`CorpusError` naming the file.
    """
    directory = os.path.abspath(os.path.expanduser(directory))
    index = _read_index(directory)
    dtype = DTYPES[index["dtype"]]
    prepared = _read_tokenizer(directory, index)
    if tokenizer is not None:
        if tokenizer.to_dict() != prepared.to_dict():
            raise CorpusError(
                f"{directory}/tokenizer.json is not the model's tokenizer ({prepared.kind}, {prepared.vocab_size} "
                f"tokens, against {tokenizer.kind}, {tokenizer.vocab_size}): prepare the corpus with the model's tokenizer"
            )
    elif tokenizer_spec is not None:
        _check_spec(directory, index["tokenizer"], prepared, tokenizer_spec, lowercase, vocab_size)
    splits = {}
    for split in SPLITS:
        entry = index["splits"][split]
        path = os.path.join(directory, entry["file"])
        _check_file(path, entry, dtype, verify)
        splits[split] = np.memmap(path, dtype=dtype, mode="r", shape=(entry["tokens"],))
    doc_ids = None
    if index.get("documents") is not None:
        starts = np.asarray(index["documents"], dtype=np.int64)
        doc_ids = {s: DocumentIds(starts, index["splits"][s]["offset"], index["splits"][s]["tokens"]) for s in SPLITS}
    return with_line_documents(Corpus(splits["train"], splits["valid"], splits["test"], prepared, directory, doc_ids))


def _read_index(directory: str) -> dict:
    path = os.path.join(directory, PREPARED_INDEX)
    try:
        with open(path, encoding="utf-8") as f:
            index = json.load(f)
        if index.get("format") != FORMAT:
            raise CorpusError(f"{path} has format {index.get('format')!r}, expected {FORMAT!r}")
        if index["dtype"] not in DTYPES:
            raise CorpusError(f"{path}: unknown dtype {index['dtype']!r}; expected one of {', '.join(DTYPES)}")
        offsets = [index["splits"][s]["offset"] for s in SPLITS]
        counts = [int(index["splits"][s]["tokens"]) for s in SPLITS]
        if offsets != [0, counts[0], counts[0] + counts[1]] or min(counts) < 1:
            raise CorpusError(f"{path}: the split offsets {offsets} and token counts {counts} do not fit together")
        starts = index.get("documents")
        if starts is not None and (starts[:1] != [0] or np.any(np.diff(starts) < 0) or starts[-1] > sum(counts)):
            raise CorpusError(f"{path}: the document starts are not ascending offsets into the {sum(counts)} tokens")
        return index
    except (OSError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
        raise CorpusError(f"{path} is not a valid prepared-corpus index ({type(exc).__name__}: {exc})") from None


def _read_tokenizer(directory: str, index: dict) -> Tokenizer:
    entry = index["tokenizer"]
    path = os.path.join(directory, entry.get("file", "tokenizer.json"))
    if not os.path.isfile(path):
        raise CorpusError(f"{path} is missing: the prepared corpus has no tokenizer")
    if file_sha256(path) != entry.get("sha256"):
        raise CorpusError(
            f"{path} does not match {directory}/{PREPARED_INDEX} (sha256 differs): prepare the corpus again"
        )
    try:
        tokenizer = load_tokenizer(path)
    except TokenizerError as exc:
        raise CorpusError(str(exc)) from None
    if tokenizer.vocab_size != index["vocab_size"]:
        raise CorpusError(
            f"{path} has {tokenizer.vocab_size} tokens, {directory}/{PREPARED_INDEX} says {index['vocab_size']}"
        )
    return tokenizer


def _check_file(path: str, entry: dict, dtype: np.dtype, verify: bool) -> None:
    if not os.path.isfile(path):
        raise CorpusError(f"{path} is missing from the prepared corpus")
    size, expected = os.path.getsize(path), int(entry["tokens"]) * dtype.itemsize
    if size != expected:
        raise CorpusError(
            f"{path} is truncated or altered: {size} bytes, index.json says {entry['tokens']} tokens ({expected} bytes)"
        )
    if verify and file_sha256(path) != entry["sha256"]:
        raise CorpusError(f"{path} is corrupt: its sha256 does not match index.json; prepare the corpus again")


def _check_spec(directory: str, entry: dict, prepared: Tokenizer, spec: str, lowercase: bool, vocab_size) -> None:
    """The run's tokenizer settings must be those the corpus was prepared with."""
    if is_tokenizer_path(spec):
        wanted = load_tokenizer(spec)
        made = prepared.to_dict()
        if not wanted.ordered:  # a file whose ids were ordered when the corpus was prepared: its vocabulary alone
            made = {key: value for key, value in made.items() if key != "order"}
        same = wanted.to_dict() == made
    else:
        same = spec == entry["spec"] and (
            (spec != "word" or lowercase == entry["lowercase"])
            and (spec != "bpe" or vocab_size is None or vocab_size == entry["bpe_vocab_size"])
        )
    if not same:
        given = f"tokenizer={spec}" + (f", vocab_size={vocab_size}" if spec == "bpe" and vocab_size else "")
        if spec == "word":
            given += f", lowercase={lowercase}"
        made = f"tokenizer={entry['spec']}" + (
            f", vocab_size={entry['bpe_vocab_size']}" if entry["bpe_vocab_size"] else ""
        )
        if entry["kind"] == "word":
            made += f", lowercase={entry['lowercase']}"
        raise CorpusError(
            f"{directory} was prepared with {made}, the run asks for {given}: set the run's data config to match "
            f"({directory}/{PREPARED_INDEX}), or prepare the corpus again"
        )


def data_settings(path: str | None) -> dict:
    """The data-config values that reading ``path`` fixes: a directory from ``longseq data prepare`` is read with
    the tokenizer it was made with (``tokenizer``, ``lowercase`` and a BPE's ``vocab_size``, as written in its
    index); any other path fixes none ({}).  ``longseq train --data DIR`` lays them under its own settings, so a
    prepared corpus alone gives the run its tokenizer."""
    if not is_prepared(path):
        return {}
    index = _read_index(os.path.abspath(os.path.expanduser(path)))
    entry = index["tokenizer"]
    settings = {"tokenizer": entry["spec"], "lowercase": entry["lowercase"]}
    if "clip_seconds" in index["source"]:  # audio was cut into clips of this length when it was prepared
        settings["clip_seconds"] = index["source"]["clip_seconds"]
    return settings if entry["bpe_vocab_size"] is None else {**settings, "vocab_size": entry["bpe_vocab_size"]}
