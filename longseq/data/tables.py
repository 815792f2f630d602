"""Table files (parquet, arrow, JSON lines) read through the ``datasets`` library, streamed.

A table corpus is one column of text: its rows, in order, joined by newlines, are read as one stream, exactly as
a plain text file holding those lines (``longseq data prepare`` and :func:`~longseq.data.corpus.load_corpus` give
the same ids for both; a prepared corpus's tests hold them equal).  The rows are read ``BATCH_ROWS`` at a time
from a streaming dataset (``load_dataset(..., streaming=True)``; parquet through pyarrow's own reader, a row group
at a time), so preparing a table larger than memory holds one batch of rows and one block of text at a time.

``datasets`` is an optional extra (``pip install "longseq[datasets]"``), imported when a table is read.
"""

from __future__ import annotations

import lzma
import os
import zlib
from collections.abc import Iterator
from functools import lru_cache

from longseq.data.readers.base import CorpusError

TABLE_BUILDERS = {".parquet": "parquet", ".arrow": "arrow", ".jsonl": "json", ".json": "json"}  # suffix -> builder


def table_suffix(path: str) -> str:
    """The suffix that names a table's format (``.jsonl`` for ``x.jsonl.gz``)."""
    return os.path.splitext(path.lower().removesuffix(".gz"))[1]


BATCH_ROWS = 1024  # rows per batch read from the table
BLOCK_CHARS = 1 << 22  # characters per text block handed to the tokenizer
# what a damaged file raises while it is read: a truncated .gz or .xz stops with EOFError, a corrupt one with zlib's
# or lzma's own error, bad UTF-8 with a ValueError
READ_ERRORS = (ValueError, OSError, EOFError, zlib.error, lzma.LZMAError)


def open_table(path: str, columns: list[str] | None):
    """The streaming dataset of ``path`` with only ``columns`` (None: all); a missing column is an error naming
    those the file has."""
    try:
        import datasets
    except ImportError:
        raise CorpusError(
            f"{path} is a table ({table_suffix(path)}): reading it needs the datasets library "
            '(pip install "longseq[datasets]")'
        ) from None
    datasets.disable_progress_bars()
    try:
        table = datasets.load_dataset(
            TABLE_BUILDERS[table_suffix(path)], data_files=os.path.abspath(path), split="train", streaming=True
        )
        names = table.column_names
        if names is None:  # JSON lines: the columns are known once a row is read
            names = list(next(iter(table), {}))
    except (*READ_ERRORS, datasets.exceptions.DatasetGenerationError) as exc:
        where = undecodable_line(path, exc)
        raise CorpusError(
            where or f"cannot read {path} as a {TABLE_BUILDERS[table_suffix(path)]} table: {exc}"
        ) from None
    if columns is None:
        return table
    missing = [c for c in columns if c not in names]
    if missing:
        raise CorpusError(
            f"{path} has no column {', '.join(repr(c) for c in missing)}; its columns are {', '.join(names) or 'none'}"
        )
    return table.select_columns(columns)


def datasets_error() -> type[Exception]:
    """``datasets``' own error for a file its builder cannot read (imported once a table has been opened)."""
    import datasets

    return datasets.exceptions.DatasetGenerationError


def table_batches(path: str, columns: list[str] | None, batch_rows: int | None = None) -> Iterator[dict[str, list]]:
    """The rows of ``path`` as batches ``{column: values}``, ``batch_rows`` (default :data:`BATCH_ROWS`) at a
    time."""
    if path.lower().endswith(".parquet"):
        yield from parquet_batches(path, columns, batch_rows or BATCH_ROWS)
        return
    table = open_table(path, columns)
    try:
        yield from table.iter(batch_size=batch_rows or BATCH_ROWS)
    except (*READ_ERRORS, datasets_error()) as exc:
        raise CorpusError(undecodable_line(path, exc) or f"cannot read {path}: {exc}") from None


def undecodable_line(path: str, error: BaseException) -> str | None:
    """For a JSON-lines (or JSON) file that ``error`` says is not UTF-8 (the reader names a position in a block it
    read, not the row), the message that names the line and the byte: the file is read again, a line at a time."""
    import gzip

    while error is not None and not isinstance(error, UnicodeDecodeError):
        error = error.__cause__ or error.__context__
    if error is None or table_suffix(path) not in (".jsonl", ".json"):
        return None
    opener = gzip.open if path.lower().endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            for number, line in enumerate(f, 1):
                try:
                    line.decode("utf-8")
                except UnicodeDecodeError as bad:
                    row = f"row {number} (line {number})" if table_suffix(path) == ".jsonl" else f"line {number}"
                    return (
                        f"{path}, {row}: byte {line[bad.start]:#04x} at "
                        f"column {bad.start + 1} is not UTF-8 ({bad.reason}); a table's text must be UTF-8: re-encode "
                        "the file (e.g. iconv -f latin1 -t utf-8) or remove the row"
                    )
    except READ_ERRORS:
        return None
    return None


def parquet_batches(path: str, columns: list[str] | None, batch_rows: int) -> Iterator[dict[str, list]]:
    """A parquet file's rows through pyarrow (installed with ``datasets``), one row group at a time and without
    pre-buffering: the streaming ``datasets`` reader keeps what it read (apache/arrow#39808), so its memory grew
    with the file."""
    open_table(path, columns)  # the same errors as every table: no datasets, not parquet, a missing column
    import pyarrow.parquet as pq

    try:
        with pq.ParquetFile(path, pre_buffer=False, memory_map=False) as table:
            for batch in table.iter_batches(batch_size=batch_rows, columns=columns, use_threads=False):
                yield batch.to_pydict()
    except READ_ERRORS as exc:
        raise CorpusError(f"cannot read {path}: {exc}") from None


def text_rows(path: str, column: str, batch_rows: int | None = None) -> Iterator[str]:
    """The text of every row of ``column``, in order; a value that is not a string is an error naming its row."""
    row = 0
    for batch in table_batches(path, [column], batch_rows):
        for value in batch[column]:
            row += 1
            if not isinstance(value, str):
                raise CorpusError(
                    f"{path}, row {row}: column {column!r} holds {type(value).__name__} ({value!r}), not text"
                )
            yield value


def text_blocks(path: str, column: str, block_chars: int | None = None) -> Iterator[str]:
    """The rows of ``column`` joined by newlines, in blocks of about ``block_chars`` (default :data:`BLOCK_CHARS`)
    characters: a block ends after the row that fills it (the readers that need whole lines regroup them)."""
    block_chars = block_chars or BLOCK_CHARS
    parts, size, first = [], 0, True
    for text in text_rows(path, column):
        if not first:
            parts.append("\n")
        parts.append(text)
        size, first = size + len(text) + 1, False
        if size >= block_chars:
            yield "".join(parts)
            parts, size = [], 0
    if parts:
        yield "".join(parts)
    elif first:
        raise CorpusError(f"{path} has no rows")


def text_bytes(path: str, column: str) -> int:
    """The UTF-8 bytes of the stream that :func:`text_blocks` gives (one streamed pass, remembered while the file
    keeps its size and modification time)."""
    stat = os.stat(path)
    return _text_bytes(os.path.abspath(path), column, stat.st_size, stat.st_mtime_ns)


@lru_cache(maxsize=8)
def _text_bytes(path: str, column: str, size: int, mtime_ns: int) -> int:
    return sum(len(block.encode("utf-8", errors="surrogatepass")) for block in text_blocks(path, column))
