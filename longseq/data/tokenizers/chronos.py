"""``chronos``: real-valued series as tokens by mean scaling and uniform bins, as Chronos does (Ansari et al., 2024).

A series is a line of numbers (the UCR reader's text: :mod:`longseq.data.readers.ucr`).  Its values are divided by
their scale, the mean of their absolute values (1 where that is 0), and each scaled value becomes the bin whose
centre is nearest among ``n_tokens - 3`` centres spread evenly over [``low``, ``high``] (Chronos: 4,096 tokens,
[-15, 15]); values beyond are the end bins.  Ids 0 and 1 are Chronos's PAD and EOS: EOS is the line end, so a series
is a record (``line_records``) and ends with it; id 2 is the bin below -1e20 (never drawn from finite data).

Decoding gives the bin centres of the scaled series (the scale is the series', not the tokens': :func:`scale_encode`
and :func:`unscale` carry it, as Chronos's ``context_input_transform`` and ``output_transform`` do).  A tokenizer
file (``{"kind": "chronos", "n_tokens": 1024, "low": -15, "high": 15}``) chooses other bins.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

import numpy as np

from longseq.data.tokenizers.base import Settings, Tokenizer, TokenizerError, UnknownCharacterError, whole_lines

PAD, EOS, SPECIAL = 0, 1, 2


class ChronosTokenizer(Tokenizer):
    kind = "chronos"
    fit_on = "nothing"
    line_records = True

    def __init__(self, n_tokens: int = 4096, low: float = -15.0, high: float = 15.0) -> None:
        if n_tokens < SPECIAL + 3 or n_tokens > 1 << 16 or not low < high:
            raise TokenizerError(
                f"chronos bins need 5 <= n_tokens <= 65536 and low < high, got {n_tokens}, {low}, {high}"
            )
        self.n_tokens, self.low, self.high = int(n_tokens), float(low), float(high)
        self.centers = np.linspace(self.low, self.high, self.n_tokens - SPECIAL - 1)
        self.boundaries = np.concatenate([[-1e20], (self.centers[1:] + self.centers[:-1]) / 2, [1e20]])

    @classmethod
    def fit(cls, blocks: Iterable[str], settings: Settings) -> ChronosTokenizer:
        return cls()

    @classmethod
    def from_dict(cls, data: dict) -> ChronosTokenizer:
        return cls(data.get("n_tokens", 4096), data.get("low", -15.0), data.get("high", 15.0))

    def to_dict(self) -> dict:
        return {"kind": self.kind, "n_tokens": self.n_tokens, "low": self.low, "high": self.high}

    @property
    def vocab_size(self) -> int:
        return self.n_tokens

    def pieces(self, blocks: Iterable[str]) -> Iterator[str]:
        return whole_lines(blocks)  # a series is scaled by all of its values

    def quantize(self, scaled: np.ndarray) -> np.ndarray:
        """The ids of already scaled values (Chronos: ``bucketize(right=True) + n_special``)."""
        ids = np.searchsorted(self.boundaries, np.asarray(scaled, dtype=np.float64), side="right") + SPECIAL
        return np.clip(ids, 0, self.n_tokens - 1)

    def values(self, ids: np.ndarray) -> np.ndarray:
        """The bin centres of value ids (Chronos's ``output_transform`` before the scale)."""
        return self.centers[np.clip(np.asarray(ids, dtype=np.int64) - SPECIAL - 1, 0, len(self.centers) - 1)]

    def encode(self, text: str) -> np.ndarray:
        parts = []
        for number, line in enumerate(text.split("\n"), 1):
            if number > 1:
                parts.append(np.array([EOS]))
            if line.strip():
                parts.append(scale_encode(self, _numbers(text, line, number))[0])
        return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, dtype=np.int64)

    def decode(self, ids: Iterable[int]) -> str:
        ids = np.asarray(list(ids) if not isinstance(ids, np.ndarray) else ids, dtype=np.int64)
        words = ["\n" if i == EOS else "" if i == PAD else f"{v:.6g} " for i, v in zip(ids, self.values(ids))]
        return "".join(words).replace(" \n", "\n")

    def offsets(self, text: str) -> np.ndarray:
        spans = [match.span() for match in re.finditer(r"[^\s]+|\n", text)]  # a value or a line end each
        return np.asarray(spans, dtype=np.int64).reshape(-1, 2)

    def byte_lengths(self) -> np.ndarray:
        words = [1, 1, 1] + [len(f"{v:.6g} ") for v in self.centers]  # PAD, EOS and the bin below all
        return np.asarray(words, dtype=np.int64)


def _numbers(text: str, line: str, number: int) -> np.ndarray:
    try:
        values = np.asarray([float(word) for word in line.split()], dtype=np.float64)
    except ValueError:
        word = next(w for w in line.split() if not _is_number(w))
        raise UnknownCharacterError(word[0], 0, number, line.index(word) + 1, 0, word, "is not a number") from None
    bad = np.flatnonzero(~np.isfinite(values))
    if bad.size:
        word = line.split()[int(bad[0])]
        raise UnknownCharacterError(word[0], 0, number, line.index(word) + 1, 0, word, "is not a finite number")
    return values


def _is_number(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True


def series_scale(values: np.ndarray) -> float:
    """Chronos's mean scale: the mean absolute value, 1 where that is 0."""
    scale = float(np.mean(np.abs(values))) if len(values) else 0.0
    return scale if scale > 0 else 1.0


def scale_encode(tokenizer: ChronosTokenizer, values: np.ndarray) -> tuple[np.ndarray, float]:
    """The ids of a series (no EOS) and its scale (Chronos's ``context_input_transform``)."""
    scale = series_scale(values)
    return tokenizer.quantize(np.asarray(values, dtype=np.float64) / scale), scale


def unscale(tokenizer: ChronosTokenizer, ids: np.ndarray, scale: float) -> np.ndarray:
    """The values of ``ids`` at ``scale`` (Chronos's ``output_transform``)."""
    return tokenizer.values(ids) * scale
