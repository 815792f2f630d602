"""``mixture``: one vocabulary over several kinds of data, each section of the text opened by its modality's token.

A modality is a name and the tokenizer kind that reads it (:data:`MODALITIES`): ``text`` bytes (``byte``), ``dna``
(``nucleotide`` where that kind is registered, else the characters of the training DNA), ``audio`` (``mulaw``) and
``smiles`` (``smiles``).  Its token is the private-use character U+E100 + its index (:func:`marker`), which the
``mixture`` reader (:mod:`longseq.data.readers.mixture`) writes before every file it lists; everything up to the next
marker is read by that modality's tokenizer.  The ids are the markers (0..3), then every modality's own ids in this
order, shifted (:meth:`MixtureTokenizer.ranges`), so a token of a modality is the same token as in a model of that
modality alone.  The modalities that learn a vocabulary (SMILES, characters) learn it from their sections of the
training text, as they would alone.  ``bits_per_token`` leaves out the markers and what a modality leaves out of
its own metric (audio's clip starts).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import ClassVar

import numpy as np

from longseq.data.tokenizers.base import Settings, Tokenizer, TokenizerError, UnknownCharacterError

MARKER_BASE = 0xE100
MODALITIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("text", ("byte",)),
    ("dna", ("nucleotide", "char")),  # the first kind registered reads it
    ("audio", ("mulaw",)),
    ("smiles", ("smiles",)),
)
NAMES = tuple(name for name, _ in MODALITIES)


def marker(modality: str) -> str:
    """The character that opens a section of ``modality``."""
    if modality not in NAMES:
        raise TokenizerError(f"unknown modality {modality!r}: choose one of {', '.join(NAMES)}")
    return chr(MARKER_BASE + NAMES.index(modality))


def sections(text: str) -> Iterator[tuple[int, int, str]]:
    """(modality index, start, content) of every section of ``text``; text before the first marker is an error."""
    codes = np.frombuffer(text.encode("utf-32-le", errors="surrogatepass"), dtype=np.uint32)
    starts = np.flatnonzero((codes >= MARKER_BASE) & (codes < MARKER_BASE + len(NAMES)))
    if len(text) and (not starts.size or starts[0] != 0):
        line = text.count("\n", 0, int(starts[0]) if starts.size else len(text)) + 1
        raise UnknownCharacterError(
            text[0], 0, 1, 1, 0, None, f"opens no section: the text before line {line} has no modality token"
        )
    for i, start in enumerate(starts):
        stop = int(starts[i + 1]) if i + 1 < len(starts) else len(text)
        yield int(codes[start]) - MARKER_BASE, int(start), text[start + 1 : stop]


def section_pieces(blocks: Iterable[str]) -> Iterator[str]:
    """``blocks`` regrouped into whole sections, each with its marker (a section is read by its modality's tokenizer
    at once)."""
    carry = ""
    for block in blocks:
        carry += block
        codes = np.frombuffer(carry.encode("utf-32-le", errors="surrogatepass"), dtype=np.uint32)
        starts = np.flatnonzero((codes >= MARKER_BASE) & (codes < MARKER_BASE + len(NAMES)))
        if starts.size > 1:
            yield carry[: int(starts[-1])]
            carry = carry[int(starts[-1]) :]
    if carry:
        yield carry


class MixtureTokenizer(Tokenizer):
    kind = "mixture"
    fit_on = "train"
    bits_metric = "bits_per_token"
    kinds: ClassVar[dict[str, type[Tokenizer]]] = {}  # the tokenizer registry (set where it is built)

    def __init__(self, parts: list[Tokenizer]) -> None:
        if len(parts) != len(NAMES):
            raise TokenizerError(f"a mixture holds {len(NAMES)} modalities ({', '.join(NAMES)}), got {len(parts)}")
        self.parts = list(parts)
        sizes = [len(NAMES), *(p.vocab_size for p in parts)]
        self.offsets_of = np.cumsum(sizes)[:-1]  # where each modality's ids begin
        self.size = int(sum(sizes))

    @classmethod
    def kind_of(cls, modality: int) -> type[Tokenizer]:
        choices = MODALITIES[modality][1]
        return next((cls.kinds[k] for k in choices if k in cls.kinds), cls.kinds[choices[-1]])

    @classmethod
    def fit(cls, blocks: Iterable[str], settings: Settings) -> MixtureTokenizer:
        learnt: list[list[str]] = [[] for _ in NAMES]
        for piece in section_pieces(blocks):
            for modality, _, content in sections(piece):
                if cls.kind_of(modality).fit_on != "nothing":
                    learnt[modality].append(content)
        # the line end that joins files is in every vocabulary, also of a modality the training text lacks
        return cls([cls.kind_of(m).fit([*learnt[m], "\n"], settings) for m in range(len(NAMES))])

    @classmethod
    def from_dict(cls, data: dict) -> MixtureTokenizer:
        return cls([cls.kinds[part["kind"]].from_dict(part) for part in data["parts"]])

    def to_dict(self) -> dict:
        return {"kind": self.kind, "modalities": list(NAMES), "parts": [p.to_dict() for p in self.parts]}

    @property
    def vocab_size(self) -> int:
        return self.size

    def ranges(self) -> dict[str, tuple[int, int]]:
        """Each modality's ids: [start, stop)."""
        return {n: (int(o), int(o) + p.vocab_size) for n, o, p in zip(NAMES, self.offsets_of, self.parts)}

    def pieces(self, blocks: Iterable[str]) -> Iterator[str]:
        return section_pieces(blocks)

    def encode(self, text: str) -> np.ndarray:
        parts = []
        for modality, start, content in sections(text):
            try:
                ids = self.parts[modality].encode(content)
            except UnknownCharacterError as exc:
                index = start + 1 + exc.index
                line = text.count("\n", 0, index) + 1
                raise UnknownCharacterError(
                    exc.char, index, line, index - text.rfind("\n", 0, index), self.size, exc.token,
                    f"is not in the {NAMES[modality]} vocabulary",
                ) from None  # fmt: skip
            parts += [np.array([modality]), ids + self.offsets_of[modality]]
        return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, dtype=np.int64)

    def _runs(self, ids: np.ndarray) -> Iterator[tuple[int, np.ndarray]]:
        """(modality or -1 for a marker, ids) of runs of ``ids`` of one modality."""
        which = np.searchsorted(self.offsets_of, ids, side="right") - 1  # -1: a marker
        cuts = np.flatnonzero(np.diff(which)) + 1
        for run, part in zip(np.split(which, cuts), np.split(ids, cuts)):
            if len(part):
                yield int(run[0]), part

    def decode(self, ids: Iterable[int]) -> str:
        ids = np.asarray(list(ids) if not isinstance(ids, np.ndarray) else ids, dtype=np.int64)
        out = []
        for modality, part in self._runs(ids):
            if modality < 0:
                out.append("".join(chr(MARKER_BASE + int(i)) for i in part))
            else:
                out.append(self.parts[modality].decode(part - self.offsets_of[modality]))
        return "".join(out)

    def offsets(self, text: str) -> np.ndarray:
        spans = []
        for modality, start, content in sections(text):
            spans += [[start, start + 1], *(self.parts[modality].offsets(content) + start + 1).tolist()]
        return np.asarray(spans, dtype=np.int64).reshape(-1, 2)

    def byte_lengths(self) -> np.ndarray:
        return np.concatenate([np.zeros(len(NAMES), dtype=np.int64), *(p.byte_lengths() for p in self.parts)])

    def scored(self, labels: np.ndarray) -> np.ndarray:
        labels = np.asarray(labels)
        keep = labels >= len(NAMES)
        for modality, (start, stop) in enumerate(self.ranges().values()):
            inside = (labels >= start) & (labels < stop)
            own = self.parts[modality].scored(np.where(inside, labels - start, 0))
            if own is not None:
                keep &= ~inside | own
        return keep
