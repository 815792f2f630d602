"""``mixture``: a list of files of several kinds of data (``.mix``), each read by its own reader and opened by its
modality's token, for one model across modalities (``--tokenizer mixture``, :mod:`longseq.data.tokenizers.mixture`).

A line is ``MODALITY PATH`` (``text``, ``dna``, ``audio`` or ``smiles``; the path relative to the list; ``#`` lines
are comments); the layout ``{train,valid,test}.mix`` gives each split its list.  A file's text is what its own reader
gives (audio in clips of ``data.clip_seconds``), after its modality's token; the files are joined by line ends.  An
unknown modality or a missing file is refused at its line.  The list's sha256 is what a prepared corpus records."""

from __future__ import annotations

import os
from collections.abc import Iterator

from longseq.data.readers.base import CorpusError, Reader, ReadOptions, Tap, utf8_blocks
from longseq.data.tokenizers.base import TokenizerError
from longseq.data.tokenizers.mixture import marker


class Mixture(Reader):
    name = "mixture"
    suffixes = (".mix",)
    layouts = {"mixture": "{}.mix"}
    readers: dict = {}  # the reader registry, by name (set where it is built)

    def __init__(self, options: ReadOptions | None = None) -> None:
        self.options = options or ReadOptions()

    @classmethod
    def from_options(cls, options: ReadOptions) -> Mixture:
        return cls(options)

    def settings(self) -> dict:
        return {"clip_seconds": self.options.clip_seconds}

    def reader_of(self, path: str) -> Reader:
        name = path.lower()
        for cls in self.readers.values():
            if cls is not Mixture and any(name.endswith(suffix) for suffix in cls.suffixes):
                return cls.from_options(self.options)
        return self.readers["plain"].from_options(self.options)

    def entries(self, path: str, text: str | None = None) -> list[tuple[str, str]]:
        """(modality, file) of every line of the list ``path``."""
        if text is None:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        base, entries = os.path.dirname(os.path.abspath(path)), []
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            modality, _, name = line.strip().partition(" ")
            try:
                marker(modality)
            except TokenizerError as exc:
                raise CorpusError(f"{path}, line {number}: {exc}") from None
            entry = os.path.join(base, name.strip())
            if not os.path.isfile(entry):
                raise CorpusError(f"{path}, line {number}: {name.strip()!r} is not a file")
            entries.append((modality, entry))
        if not entries:
            raise CorpusError(f"{path} lists no file")
        return entries

    def text_blocks(self, path: str, tap: Tap) -> Iterator[str]:
        entries = self.entries(path, "".join(utf8_blocks(path, tap.blocks())))
        for i, (modality, entry) in enumerate(entries):
            yield ("\n" if i else "") + marker(modality)
            with open(entry, "rb") as f:
                yield from self.reader_of(entry).text_blocks(entry, Tap(f))

    def text_bytes(self, path: str) -> int:
        entries = self.entries(path)
        return sum(self.reader_of(e).text_bytes(e) for _, e in entries) + 4 * len(entries) - 1

    def where(self, path: str, line: int, column: int) -> str:
        return f"line {line}, column {column} of the text of the files it lists"
