"""``ucr``: the UCR/UEA time-series archive's files, univariate: ``.ts`` (sktime's format: ``@`` header lines, then a
series a line, its values separated by commas and its class after a colon) and ``.tsv`` (the 2018 archive: the class,
then the values, separated by tabs).  A file's text is its series, one a line, the values separated by spaces as
the file writes them (read it with ``--tokenizer chronos``); the classes are left out, and read by the classify
task (:func:`ucr_records`).  A missing value (``?``, ``NaN``), a series of another length than the header's
``@seriesLength``, a multivariate file and a value that is not a number are refused with the file and the line.

The fields are cut by the ``csv`` module; the header is ``@key value`` lines (``#`` lines are comments)."""

from __future__ import annotations

import csv
import math
from collections.abc import Iterator

from longseq.data.readers.base import CorpusError, Reader, Tap, utf8_blocks
from longseq.data.tokenizers.base import whole_lines


def _number(text: str, path: str, number: int, index: int) -> str:
    """``text`` if it is a finite number, else an error naming the file, the line and the value's place."""
    try:
        value = float(text)
    except ValueError:
        raise CorpusError(f"{path}, line {number}: value {index + 1} ({text!r}) is not a number") from None
    if not math.isfinite(value):
        raise CorpusError(
            f"{path}, line {number}: value {index + 1} is {text.strip()!r} (a missing value): fill or drop the series"
        )
    return text.strip()


class _Header:
    """What a ``.ts`` header says: whether the series are univariate and their length (None: any)."""

    def __init__(self) -> None:
        self.length, self.data = None, False

    def read(self, line: str, path: str, number: int) -> None:
        key, _, value = line[1:].partition(" ")
        key, value = key.lower(), value.strip().lower()
        if key == "univariate" and value == "false" or key == "dimensions" and value not in ("", "1"):
            raise CorpusError(f"{path}, line {number}: a multivariate file; longseq reads univariate series only")
        if key == "serieslength":
            self.length = int(value)
        if key == "data":
            self.data = True


def ucr_series(path: str, lines: Iterator[str]) -> Iterator[tuple[int, list[str], str]]:
    """(line number, values, class) of every series of the UCR file ``path`` whose text is ``lines``."""
    tsv, header = path.lower().endswith(".tsv"), _Header()
    for number, line in enumerate(lines, 1):
        line = line.rstrip("\r\n")
        if not line.strip() or line.startswith("#"):
            continue
        if not tsv and not header.data:
            if not line.startswith("@"):
                raise CorpusError(f"{path}, line {number}: expected an @ header line or @data before the series")
            header.read(line, path, number)
            continue
        if tsv:
            label, *fields = next(csv.reader([line], delimiter="\t"))
        else:
            *dims, label = line.split(":")
            if len(dims) != 1:
                raise CorpusError(
                    f"{path}, line {number}: {len(dims)} dimensions; longseq reads univariate series only"
                )
            fields = next(csv.reader([dims[0]]))
        values = [_number(field, path, number, i) for i, field in enumerate(fields)]
        if not values or header.length is not None and len(values) != header.length:
            raise CorpusError(
                f"{path}, line {number}: a series of {len(values)} values, the header says @seriesLength {header.length}"
                if values
                else f"{path}, line {number}: a series with no values"
            )
        yield number, values, label.strip()


def ucr_records(path: str) -> list[tuple[int, dict]]:
    """(line number, {"text": the series' values, "label": its class}) of every series of ``path``, for the classify
    task."""
    with open(path, encoding="utf-8") as f:
        return [(n, {"text": " ".join(values), "label": label}) for n, values, label in ucr_series(path, f)]


class UCR(Reader):
    name = "ucr"
    suffixes = (".ts", ".tsv")

    def text_blocks(self, path: str, tap: Tap) -> Iterator[str]:
        lines = (line for block in whole_lines(utf8_blocks(path, tap.blocks())) for line in block.splitlines(True))
        first = True
        for _, values, _ in ucr_series(path, lines):
            yield ("" if first else "\n") + " ".join(values)
            first = False
        if first:
            raise CorpusError(f"{path} holds no series")

    def text_bytes(self, path: str) -> int:
        with open(path, "rb") as f:
            return sum(len(block.encode("utf-8")) for block in self.text_blocks(path, Tap(f)))

    def where(self, path: str, line: int, column: int) -> str:
        return f"series {line}, character {column} of its values"
