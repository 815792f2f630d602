"""What every reader is: how the files of one format become the text a tokenizer reads (:class:`Reader`), and the
errors that name a file.

A reader gives a file's text in blocks (:meth:`Reader.text_blocks`), reading the file's bytes through a
:class:`Tap`, which hashes them (the sha256 a prepared corpus records), and the size of that text in UTF-8 bytes
(:meth:`Reader.text_bytes`: a progress meter's total, and where a single stream's training text ends); it
names the files it reads by their endings (``suffixes``) and the directory layouts whose split files it reads
(``layouts``: ``{}`` stands for train, valid and test); and it says where a place in its text lies in the file
(:meth:`Reader.where`), so that an error names the file's own line.
"""

from __future__ import annotations

import codecs
import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO, ClassVar

BLOCK_BYTES = 1 << 22  # a file is read 4 MiB at a time


class CorpusError(ValueError):
    """A corpus that cannot be read: missing, empty, or not valid text."""


def not_utf8(path: str, position: int, sample: bytes) -> CorpusError:
    return CorpusError(
        f"{path} is not valid UTF-8 (byte {position}: {sample!r}); use --tokenizer byte for binary or non-UTF-8 data"
    )


@dataclass(frozen=True)
class ReadOptions:
    """What a run's data config tells a reader: ``text_column``, the column of a table that holds its text;
    ``clip_seconds``, the length of the clips audio is cut into (0: whole files)."""

    text_column: str = "text"
    clip_seconds: float = 0.0


class Tap:
    """A file read for a reader: every byte read updates the file's sha256, and :meth:`drain` reads what the reader
    left, so that the sha256 is always the whole file's."""

    def __init__(self, file: BinaryIO) -> None:
        self.file, self.digest = file, hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        data = self.file.read(size)
        self.digest.update(data)
        return data

    def blocks(self, size: int | None = None) -> Iterator[bytes]:
        while block := self.read(size or BLOCK_BYTES):
            yield block

    def drain(self) -> str:
        """The sha256 of the whole file, reading what was not read."""
        while block := self.file.read(BLOCK_BYTES):
            self.digest.update(block)
        return self.digest.hexdigest()


class Reader:
    """How the files of one format become text (see the module docstring).  Instances are built from the run's
    :class:`ReadOptions` (:meth:`from_options`)."""

    name: ClassVar[str] = ""
    suffixes: ClassVar[tuple[str, ...]] = ()  # endings of the file names it reads, lower case (".fa", ".fa.gz")
    layouts: ClassVar[dict[str, str]] = {}  # a layout's name -> its split files' template ("ptb.{}.txt")
    raw_bytes: ClassVar[bool] = (
        False  # its files' bytes are its text's UTF-8 (the byte tokenizer reads them as they are)
    )

    @classmethod
    def from_options(cls, options: ReadOptions) -> Reader:
        return cls()

    def settings(self) -> dict:
        """The options it reads, as a prepared corpus's index records them (a table's column)."""
        return {}

    def text_bytes(self, path: str) -> int:
        """The UTF-8 bytes of the text of ``path`` (its size where its bytes are its text)."""
        return os.path.getsize(path)

    def text_blocks(self, path: str, tap: Tap) -> Iterator[str]:
        """The text of ``path`` in blocks (a block may end anywhere), its bytes read through ``tap``."""
        raise NotImplementedError

    def byte_blocks(self, path: str, tap: Tap) -> Iterator[bytes]:
        """The UTF-8 bytes of the text of ``path`` (a plain file's own bytes, valid UTF-8 or not)."""
        if self.raw_bytes:
            return tap.blocks()
        return (block.encode("utf-8", errors="surrogatepass") for block in self.text_blocks(path, tap))

    def where(self, path: str, line: int, column: int) -> str:
        """Where the text's ``line`` and ``column`` (1-based) lie in ``path``, for an error message."""
        return f"line {line}, column {column}"


def utf8_blocks(path: str, blocks: Iterator[bytes]) -> Iterator[str]:
    """``blocks`` of ``path`` decoded as UTF-8, or an error naming the file and the byte."""
    decoder, offset = codecs.getincrementaldecoder("utf-8")(), 0
    for block in blocks:
        try:
            yield decoder.decode(block)
        except UnicodeDecodeError as exc:  # exc.object: the bytes the decoder kept from the block before, then this one
            where = offset - (len(exc.object) - len(block)) + exc.start
            raise not_utf8(path, where, exc.object[exc.start : exc.start + 4]) from None
        offset += len(block)
    try:
        decoder.decode(b"", final=True)
    except UnicodeDecodeError as exc:
        raise not_utf8(path, offset - len(exc.object) + exc.start, exc.object[exc.start :]) from None
