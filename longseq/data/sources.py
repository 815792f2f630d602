"""What a corpus is and where its text lies: the layouts, the splits, and the rules that the in-RAM reader
(:mod:`longseq.data.corpus`) and the prepared-corpus writer (:mod:`longseq.data.prepared`) share.

``path`` may be:

* ``None``: the bundled tiny-shakespeare (public domain), split 90/5/5;
* a directory with ``ptb.{train,valid,test}.txt`` (Mikolov's PTB), ``wiki.{train,valid,test}.tokens``
  (WikiText), ``{train,valid,test}.txt`` or another reader's layout (:func:`longseq.data.readers.layouts`): a
  *layout*, every split its own file.  A directory holding
  some but not all three files of a layout is an error (read as documents, its test text would be trained on);
* a single file (enwik8/text8 style; a table's text column), split into the first 90% / next 5% / last 5% of its tokens,
  which is exactly 90M/5M/5M for the 100M-byte enwik8 and text8;
* a directory of documents: every regular file, in sorted order, joined by newlines, then split 90/5/5;
* a directory written by ``longseq data prepare`` (it holds ``index.json``).


Every file is read by the reader its name chooses (:func:`longseq.data.readers.reader_for`: UTF-8 text unless a
reader claims its ending, as the table reader claims ``.parquet``).  A subword tokenizer learns from the training
text: the train file of a layout, else the pieces of the text (:func:`~longseq.data.tokenizers.iter_pieces`) that
start in its first 90% of bytes.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import weakref
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from importlib import resources

import numpy as np

from longseq.data.readers import CorpusError, Reader, ReadOptions, Tap, layouts, not_utf8, reader_for
from longseq.data.tokenizers import Tokenizer, UnknownCharacterError, newline_id

SPLITS = ("train", "valid", "test")
TRAIN_FRACTION, VALID_FRACTION = 0.9, 0.05
PREPARED_INDEX = "index.json"


class CorpusChangedError(CorpusError):
    """A memory-mapped split whose file was truncated or written to while it was being read."""


class SplitFile:
    """The file behind a whole memory-mapped split, read with ``pread`` instead of through the map.

    Reading a map past the end of a file that was truncated under it (``cp new.bin train.bin`` truncates first)
    kills the process with SIGBUS, no message, no save; a read of the file returns short instead.  The file's size
    and modification time are those it had when opened, checked before and after every read: a file written to in
    place (new bytes of the same length) is refused too, never read as the old corpus.  A file replaced by a rename
    keeps being read as it was (the open descriptor holds the old one)."""

    def __init__(self, ids: np.memmap) -> None:
        self.path, self.dtype, self.offset = ids.filename, ids.dtype, ids.offset
        self.fd = os.open(self.path, os.O_RDONLY)
        weakref.finalize(self, os.close, self.fd)
        self.stamp = self._stamp()

    @classmethod
    def of(cls, ids) -> SplitFile | None:
        """The file of ``ids`` when it is a whole memory map of one (not a view of one, not an array in RAM)."""
        whole_map = isinstance(ids, np.memmap) and isinstance(ids.base, mmap.mmap) and ids.filename is not None
        return cls(ids) if whole_map else None

    def _stamp(self) -> tuple[int, int]:
        status = os.fstat(self.fd)
        return status.st_size, status.st_mtime_ns

    def _check(self) -> None:
        size, mtime = self._stamp()
        if (size, mtime) != self.stamp:
            how = "truncated" if size < self.stamp[0] else "written to"
            raise CorpusChangedError(
                f"{self.path} was {how} while it was being read ({self.stamp[0]:,} bytes when opened, {size:,} now): "
                "a prepared corpus must not change under a run; put it back as it was, or prepare the new one into "
                "another directory"
            )

    def read(self, start: int, length: int) -> np.ndarray:
        """Ids [start, start + length) of the split."""
        self._check()
        size = length * self.dtype.itemsize
        data = os.pread(self.fd, size, self.offset + start * self.dtype.itemsize)
        self._check()
        if len(data) != size:  # only if the size check raced with a truncation
            raise CorpusChangedError(f"{self.path} ended {size - len(data)} bytes early: it was truncated")
        return np.frombuffer(data, dtype=self.dtype)


@dataclass
class Corpus:
    """Token ids of each split and the tokenizer that produced them.

    The ids are arrays in memory, or read-only ``np.memmap`` views of a prepared corpus (nothing loaded).
    ``doc_ids`` gives, per split, the document of every token (directories of documents): an array, or for a
    prepared corpus a :class:`DocumentIds` that computes them for the slices asked for.
    """

    train: np.ndarray
    valid: np.ndarray
    test: np.ndarray
    tokenizer: Tokenizer
    source: str
    doc_ids: dict | None = None

    def split(self, name: str) -> np.ndarray:
        if name not in SPLITS:
            raise CorpusError(f"unknown split {name!r}; choose one of {SPLITS}")
        return getattr(self, name)


def with_line_documents(corpus: Corpus) -> Corpus:
    """``corpus`` with every line a document where its tokenizer reads lines as records (:class:`LineDocuments`;
    documents of files, joined by line ends, are then lines too)."""
    if not corpus.tokenizer.line_records:
        return corpus
    newline = newline_id(corpus.tokenizer)
    corpus.doc_ids = {split: LineDocuments(corpus.split(split), newline) for split in SPLITS}
    return corpus


class DocumentIds:
    """The document of every token of a split, computed from document start offsets for the slices read.

    ``starts`` are the token offsets (in the whole token stream) where each document begins, ascending;
    ``offset`` is where this split begins in that stream.  ``ids[a:b]`` equals the full array's slice.
    """

    def __init__(self, starts: np.ndarray, offset: int, length: int) -> None:
        self.starts, self.offset, self.length = np.asarray(starts, dtype=np.int64), int(offset), int(length)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: slice) -> np.ndarray:
        if not isinstance(index, slice) or index.step not in (None, 1):
            raise TypeError("DocumentIds supports contiguous slices only")
        start, stop, _ = index.indices(self.length)
        positions = np.arange(self.offset + start, self.offset + max(start, stop), dtype=np.int64)
        return np.searchsorted(self.starts, positions, side="right") - 1  # (n,) the document of each token


class LineDocuments:
    """The document of every token of a split whose every line is a record (a tokenizer's ``line_records``): a line
    end starts the next document, so a record is read after its start (the line end before it) and its own line end
    is predicted within it.  Computed for the slices asked for, from counts of line ends per block of ``BLOCK``
    tokens made in one pass, so a memory-mapped split costs no memory."""

    BLOCK = 1 << 16

    def __init__(self, ids, newline: int) -> None:
        self.ids, self.newline, self.length = ids, int(newline), len(ids)
        counts = [
            int(np.count_nonzero(np.asarray(ids[i : i + self.BLOCK]) == newline))
            for i in range(0, len(ids), self.BLOCK)
        ]
        self.before = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])  # line ends before each block

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: slice) -> np.ndarray:
        if not isinstance(index, slice) or index.step not in (None, 1):
            raise TypeError("LineDocuments supports contiguous slices only")
        start, stop, _ = index.indices(self.length)
        block = start // self.BLOCK
        base = self.before[block] + np.count_nonzero(np.asarray(self.ids[block * self.BLOCK : start]) == self.newline)
        return base + np.cumsum(np.asarray(self.ids[start : max(start, stop)]) == self.newline, dtype=np.int64)


@dataclass
class Source:
    """Where a corpus's text is: ``layout`` (``files`` maps each split to its file), ``documents`` (``files`` lists
    the documents in order) or ``file`` (one file); each file is read by the reader its name chooses, with the
    run's ``options`` (:meth:`reader`)."""

    kind: str
    path: str
    files: dict[str, str] | list[str]
    options: ReadOptions = field(default_factory=ReadOptions)

    def reader(self, path: str) -> Reader:
        return reader_for(path, self.options)

    def read(self, path: str, binary: bool = False) -> str | bytes:
        """The whole text of ``path`` (its bytes with ``binary``), in memory."""
        reader = self.reader(path)
        try:
            with open(path, "rb") as f:
                tap = Tap(f)
                return b"".join(reader.byte_blocks(path, tap)) if binary else "".join(reader.text_blocks(path, tap))
        except OSError as exc:
            raise CorpusError(f"cannot read {path}: {exc.strerror}") from None


def file_sha256(path: str, block_bytes: int = 1 << 22) -> str:
    """The sha256 of a file's bytes, read ``block_bytes`` at a time."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(block_bytes):
            digest.update(block)
    return digest.hexdigest()


def bundled_corpus_path() -> str:
    return str(resources.files("longseq.data") / "corpora" / "tinyshakespeare.txt")


def read_bytes(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise CorpusError(f"cannot read {path}: {exc.strerror}") from None


def decode_text(data: bytes, path: str, offset: int = 0) -> str:
    """``data`` (read from ``path`` at byte ``offset``) as UTF-8, or an error naming the file and byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise not_utf8(path, offset + exc.start, data[exc.start : exc.start + 4]) from None


GENERAL_ADVICE = "build the tokenizer from text that contains it, or use --tokenizer byte (every byte has an id)"


def unknown_character(
    source: Source, path: str, exc: UnknownCharacterError, line: int | None = None, column: int | None = None
) -> CorpusError:
    """A :class:`CorpusError` for a character the vocabulary lacks, at its line and column in the text of ``path``
    (those of ``exc`` unless given: the text encoded may have been a block of it), named as the file has it."""
    line, column = exc.line if line is None else line, exc.column if column is None else column
    return CorpusError(
        f"{path}, {source.reader(path).where(path, line, column)}: {exc.what} is not in the tokenizer's vocabulary; "
        f"{exc.advice or GENERAL_ADVICE}"
    )


def find_layout(directory: str) -> dict[str, str] | None:
    """The split files of the layout in ``directory`` (any reader's: :func:`longseq.data.readers.layouts`); None if
    it holds no file of any layout."""
    for name, pattern in layouts().items():
        files = {split: os.path.join(directory, pattern.format(split)) for split in SPLITS}
        present = [split for split, f in files.items() if os.path.isfile(f)]
        if len(present) == len(SPLITS):
            return files
        if present:
            missing = ", ".join(os.path.basename(files[s]) for s in SPLITS if s not in present)
            raise CorpusError(
                f"{directory} holds the {name} layout's {', '.join(os.path.basename(files[s]) for s in present)} but "
                f"not {missing}: add the missing split (read as documents instead, its test text would be trained on)"
            )
    return None


def document_files(directory: str) -> list[str]:
    names = sorted(
        n for n in os.listdir(directory) if not n.startswith(".") and os.path.isfile(os.path.join(directory, n))
    )
    if not names:
        known = ", ".join(template.format("*") for template in layouts().values())
        raise CorpusError(f"{directory} holds no documents and no known layout ({known})")
    return [os.path.join(directory, n) for n in names]


def resolve_source(path: str | None, text_column: str = "text", clip_seconds: float = 0.0) -> Source:
    """The :class:`Source` that ``path`` names (not a prepared directory: see :func:`is_prepared`); a table's text
    is its ``text_column``, audio is cut into clips of ``clip_seconds``."""
    source = bundled_corpus_path() if path is None else os.path.expanduser(path)
    options = ReadOptions(text_column, clip_seconds)
    if not os.path.exists(source):
        raise CorpusError(f"corpus path {source} does not exist")
    if not os.path.isdir(source):
        return Source("file", source, [source], options)
    layout = find_layout(source)
    if layout:
        return Source("layout", source, layout, options)
    return Source("documents", source, document_files(source), options)


def is_prepared(path: str | None) -> bool:
    return path is not None and os.path.isfile(os.path.join(os.path.expanduser(path), PREPARED_INDEX))


def split_cuts(n_tokens: int) -> tuple[int, int]:
    """Where a single token stream is cut into train / valid / test (90% / 5% / 5%)."""
    train = int(n_tokens * TRAIN_FRACTION)
    return train, train + int(n_tokens * VALID_FRACTION)


def training_pieces(pieces: Iterable[str], total_bytes: int) -> Iterator[str]:
    """The pieces of a single stream that a subword tokenizer learns from: those that start in its first 90% of
    bytes (``total_bytes`` in all)."""
    limit, offset = int(total_bytes * TRAIN_FRACTION), 0
    for piece in pieces:
        if offset >= limit:
            return
        yield piece
        offset += len(piece.encode("utf-8", errors="surrogatepass"))


def check_nonempty(ids: np.ndarray, what: str) -> np.ndarray:
    if len(ids) == 0:
        raise CorpusError(f"{what} is empty: no tokens to train or evaluate on")
    return ids


def token_counts(ids: np.ndarray, vocab_size: int, chunk: int = 1 << 24) -> np.ndarray:
    """How often every id occurs in ``ids``, read ``chunk`` ids at a time.  A memory-mapped split is read from its
    file, not through the map, so the pass leaves none of it resident in the process."""
    counts = np.zeros(vocab_size, dtype=np.int64)
    whole_map = isinstance(ids, np.memmap) and isinstance(ids.base, mmap.mmap)  # not a view of one
    for start in range(0, len(ids), chunk):
        if whole_map:
            count = min(chunk, len(ids) - start)
            part = np.fromfile(ids.filename, ids.dtype, count, offset=ids.offset + start * ids.itemsize)
        else:
            part = ids[start : start + chunk]
        counts += np.bincount(np.asarray(part, dtype=np.int64), minlength=vocab_size)
    return counts


def ids_sha256(ids: np.ndarray, vocab_size: int, chunk: int = 1 << 24) -> str:
    """The sha256 of token ids as a prepared corpus stores them (little-endian uint16 up to 65,536 tokens, else
    uint32), read ``chunk`` ids at a time: the same tokens give the same fingerprint whether they were read into
    RAM or by memory map, from any path."""
    dtype = np.dtype("<u2" if vocab_size <= 1 << 16 else "<u4")
    digest = hashlib.sha256()
    whole_map = isinstance(ids, np.memmap) and isinstance(ids.base, mmap.mmap)
    for start in range(0, len(ids), chunk):
        if whole_map:  # read from the file, leaving nothing of the map resident (as token_counts does)
            count = min(chunk, len(ids) - start)
            part = np.fromfile(ids.filename, ids.dtype, count, offset=ids.offset + start * ids.itemsize)
        else:
            part = np.asarray(ids[start : start + chunk])
        digest.update(part.astype(dtype, copy=False).tobytes())
    return digest.hexdigest()
