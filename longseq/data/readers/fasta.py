"""``fasta``: DNA, RNA and protein FASTA files (``.fa``, ``.fasta``, ``.fna``, ``.faa``, and gzipped or bgzipped
``.gz`` of each), parsed by Biopython's ``SimpleFastaParser`` (the ``genomes`` extra: ``pip install
'longseq[genomes]'``).

Its text is one record a line: the record's sequence, without its header and line breaks, the records joined by
``\\n``, so that a record is to a nucleotide or protein tokenizer what a line is to a word tokenizer (the separator
has its own id).  The letters are kept as the file has them, soft-masked lowercase and runs of ``N`` included: the
tokenizer decides what case means.  A place in the text (line = record, column = residue) is named at the file's own
line and column (:meth:`Fasta.where`).

Refused by name, with the file and the line: a file with no record, text before the first header, and a record
with an empty sequence.  Layouts: a directory holding ``{train,valid,test}.fa`` (or ``.fasta``, ``.fna``,
``.faa``, each also ``.gz``).
"""

from __future__ import annotations

import gzip
import io
import itertools
import os
import zlib
from collections.abc import Iterator
from functools import lru_cache

from longseq.data.readers.base import CorpusError, Reader, Tap

ENDINGS = (".fa", ".fasta", ".fna", ".faa")
EXTRA = "pip install 'longseq[genomes]'"


def simple_fasta_parser():
    """Biopython's FASTA parser, or an error that names the extra to install."""
    try:
        from Bio.SeqIO.FastaIO import SimpleFastaParser
    except ImportError:
        raise CorpusError(f"reading FASTA needs Biopython, the genomes extra: {EXTRA}") from None
    return SimpleFastaParser


class _Reads(io.RawIOBase):
    """A file object over anything with ``read(size)`` (a :class:`Tap`), for ``gzip`` and ``io`` to read from."""

    def __init__(self, source) -> None:
        super().__init__()
        self.source = source

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        data = self.source.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


def _text_lines(path: str, raw) -> Iterator[str]:
    """The lines of ``path`` (its bytes read from ``raw``, anything with ``read(size)``; gunzipped when the name ends
    in ``.gz``), decoded as UTF-8."""
    binary = io.BufferedReader(_Reads(raw))
    if path.lower().endswith(".gz"):
        binary = gzip.GzipFile(fileobj=binary, mode="rb")
    text = io.TextIOWrapper(binary, encoding="utf-8", newline=None)
    lines = 0
    try:
        for line in text:
            lines += 1
            yield line
    except UnicodeDecodeError as exc:
        raise CorpusError(f"{path}, line {lines + 1} or near it: not valid UTF-8 ({exc.reason})") from None
    except (OSError, EOFError, zlib.error) as exc:
        raise CorpusError(f"{path}: cannot be read as gzip ({exc})") from None


def _from_first_header(path: str, lines: Iterator[str]) -> Iterator[str]:
    """``lines`` from the first header on; blank lines before it are skipped, any other text is an error (the
    parser would drop it silently)."""
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if not line.startswith(">"):
            raise CorpusError(
                f"{path}, line {number}: text before the first FASTA header (a line starting with '>'): "
                f"{line.strip()[:40]!r}; is it a FASTA file?"
            )
        return itertools.chain([line], lines)
    raise CorpusError(f"{path}: no FASTA records (no line starts with '>')")


def records(path: str, raw) -> Iterator[tuple[str, str]]:
    """(title, sequence) of every record of ``path``, its bytes read from ``raw``; a file without records or with
    an empty sequence is an error naming the file and the line."""
    parser = simple_fasta_parser()
    for number, (title, sequence) in enumerate(parser(_from_first_header(path, _text_lines(path, raw))), 1):
        if not sequence:
            line = header_lines(path)[number - 1]
            raise CorpusError(f"{path}, line {line}: record {number} ({title.split()[0] if title else ''!r}) has an "
                              "empty sequence")  # fmt: skip
        yield title, sequence


def header_lines(path: str) -> list[int]:
    """The line number of every record's header in ``path`` (an error's place)."""
    with open(path, "rb") as f:
        return [n for n, line in enumerate(_text_lines(path, f), 1) if line.startswith(">")]


class Fasta(Reader):
    name = "fasta"
    suffixes = tuple(ending + gz for ending in ENDINGS for gz in ("", ".gz"))
    layouts = {f"fasta{suffix}": "{}" + suffix for suffix in suffixes}

    def text_blocks(self, path: str, tap: Tap) -> Iterator[str]:
        for number, (_, sequence) in enumerate(records(path, tap), 1):
            if number > 1:
                yield "\n"
            yield sequence

    def text_bytes(self, path: str) -> int:
        stat = os.stat(path)
        return _text_bytes(os.path.abspath(path), stat.st_size, stat.st_mtime_ns)

    def where(self, path: str, line: int, column: int) -> str:
        """Text line ``line`` is record ``line``; its ``column``-th residue lies on the file line that holds it."""
        with open(path, "rb") as f:
            lines = enumerate(_text_lines(path, f), 1)
            record = 0
            for number, text in lines:
                record += text.startswith(">")
                if record == line:
                    title = text[1:].split()[0] if text[1:].split() else ""
                    return f"line {_residue_line(lines, column, number)} (record {line}, {title!r}, residue {column})"
        return f"record {line}, residue {column}"


def _residue_line(lines, column: int, header: int) -> str:
    """'N, column C': the file line (and column in it) of residue ``column`` of the record whose header is line
    ``header``, reading on from ``lines`` (numbered lines after the header)."""
    seen, number = 0, header
    for number, text in lines:
        if text.startswith(">"):
            break
        width = len(text.rstrip().replace(" ", "").replace("\r", ""))
        if seen + width >= column:
            return f"{number}, column {column - seen}"
        seen += width
    return f"{number}, column {column - seen}"


@lru_cache(maxsize=8)
def _text_bytes(path: str, size: int, mtime_ns: int) -> int:
    """The UTF-8 bytes of the text of ``path`` (one pass, remembered while the file keeps its size and time)."""
    with open(path, "rb") as f:
        total = sum(len(seq.encode("utf-8")) + 1 for _, seq in records(path, f))
    return total - 1
