"""``mulaw``: 8-bit mu-law audio samples, 256 ids (id = code) and one more, ``\\n``, that starts a clip.

It reads the text the audio readers give (:mod:`longseq.data.audio`: code ``c`` is the character U+E000 + c, a clip a
line), 1:1; any other character is refused at its line (clip) and column (sample).  The clip start is the prompt of
unprompted generation, and its id is the one that is not a sample: the evaluation's ``bits_per_sample`` counts the
samples only (SaShiMi's and WaveNet's number: the negative log-likelihood of every sample, in bits, over the samples),
and ``bpb`` counts a sample as its byte (8-bit mu-law), a clip start as none.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from longseq.data.audio import CODE_BASE, CODES, codes_text, mulaw_decode, write_wav
from longseq.data.tokenizers.base import Settings, Tokenizer, TokenizerError, unknown_at

CLIP_START = CODES  # the id of "\n"


class MulawTokenizer(Tokenizer):
    kind = "mulaw"
    fit_on = "nothing"
    bits_metric = "bits_per_sample"
    line_records = True  # a clip is a line: with doc_reset, every clip is read alone (SaShiMi's clips)
    start_text = "\n"  # what an unprompted generation starts from

    @classmethod
    def fit(cls, blocks: Iterable[str], settings: Settings) -> MulawTokenizer:
        return cls()

    @classmethod
    def from_dict(cls, data: dict) -> MulawTokenizer:
        return cls()

    def to_dict(self) -> dict:
        return {"kind": self.kind}

    @property
    def vocab_size(self) -> int:
        return CODES + 1

    def encode(self, text: str) -> np.ndarray:
        codes = np.frombuffer(text.encode("utf-32-le", errors="surrogatepass"), dtype=np.uint32).astype(np.int64)
        ids = codes - CODE_BASE
        ids[codes == ord("\n")] = CLIP_START
        bad = np.flatnonzero((ids < 0) | (ids > CLIP_START))
        if bad.size:
            raise unknown_at(text, int(bad[0]), self.vocab_size)
        return ids

    def decode(self, ids: Iterable[int]) -> str:
        ids = np.asarray(list(ids) if not isinstance(ids, np.ndarray) else ids, dtype=np.int64)
        parts = np.split(ids, np.flatnonzero(ids == CLIP_START))
        return "\n".join(codes_text(p[p != CLIP_START]) for p in parts)

    def offsets(self, text: str) -> np.ndarray:
        return np.stack([np.arange(len(text)), np.arange(1, len(text) + 1)], axis=1).astype(np.int64).reshape(-1, 2)

    def byte_lengths(self) -> np.ndarray:
        return np.concatenate([np.ones(CODES, dtype=np.int64), [0]])  # a sample is its byte; a clip start none

    def scored(self, labels: np.ndarray) -> np.ndarray:
        """The labels the bits metric counts: the samples, not the clip starts."""
        return np.asarray(labels) != CLIP_START

    def encode_prompt(self, text: str) -> np.ndarray:
        """A clip to continue, read as the corpus's clips are: after a clip start."""
        return self.encode(text if text.startswith("\n") else "\n" + text)

    def write_output(self, ids, path: str) -> None:
        """The samples of ``ids`` as a 16-bit WAV (or FLAC, by the ending) at 16 kHz, clip starts left out."""
        if not path.lower().endswith((".wav", ".flac")):
            raise TokenizerError(f"{path}: audio is written as .wav or .flac")
        write_wav(path, self.waveform(ids))

    def waveform(self, ids: Iterable[int]) -> np.ndarray:
        """The samples (float64 in [-1, 1], 16 kHz) of ``ids``; clip starts are left out."""
        ids = np.asarray(list(ids) if not isinstance(ids, np.ndarray) else ids, dtype=np.int64)
        return mulaw_decode(ids[ids != CLIP_START])
