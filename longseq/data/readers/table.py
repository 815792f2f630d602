"""``table``: one column of a parquet, arrow or JSON-lines file (``.gz`` too) through the ``datasets`` library, its
rows joined by newlines (:mod:`longseq.data.tables`)."""

from __future__ import annotations

from collections.abc import Iterator

from longseq.data.readers.base import Reader, ReadOptions, Tap
from longseq.data.tables import TABLE_BUILDERS, text_blocks, text_bytes


class Table(Reader):
    name = "table"
    suffixes = tuple(s + gz for s in TABLE_BUILDERS for gz in ("", ".gz"))

    def __init__(self, column: str = "text") -> None:
        self.column = column

    @classmethod
    def from_options(cls, options: ReadOptions) -> Table:
        return cls(options.text_column)

    def settings(self) -> dict:
        return {"column": self.column}

    def text_bytes(self, path: str) -> int:
        return text_bytes(path, self.column)

    def text_blocks(self, path: str, tap: Tap) -> Iterator[str]:
        return text_blocks(path, self.column)  # read by its path: the tap hashes the file when it is drained

    def where(self, path: str, line: int, column: int) -> str:
        return f"line {line} of column {self.column!r} (its rows joined by newlines), character {column}"
