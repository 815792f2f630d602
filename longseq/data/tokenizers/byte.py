"""``byte``: the 256 byte values, id = byte (enwik8 style); encodes a file's bytes as they are, text as its UTF-8
bytes, and decodes invalid UTF-8 with replacement characters."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers

from longseq.data.tokenizers.base import Settings, Tokenizer


class ByteTokenizer(Tokenizer):
    kind = "byte"
    fit_on = "nothing"
    reads_bytes = True
    bits_metric = "bpc"  # a byte model's bits per character are its bits per byte (enwik8's convention)

    @classmethod
    def fit(cls, blocks: Iterable[str], settings: Settings) -> ByteTokenizer:
        return cls()

    @classmethod
    def from_dict(cls, data: dict) -> ByteTokenizer:
        return cls()

    def to_dict(self) -> dict:
        return {"kind": self.kind}

    @property
    def vocab_size(self) -> int:
        return 256

    def encode(self, text: str | bytes) -> np.ndarray:
        data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        return np.frombuffer(data, dtype=np.uint8).astype(np.int64)

    def offsets(self, text: str) -> np.ndarray:
        chars = [i for i, ch in enumerate(text) for _ in range(len(ch.encode("utf-8")))]  # a byte -> its character
        return np.asarray([(i, i + 1) for i in chars], dtype=np.int64).reshape(-1, 2)

    def decode(self, ids: Iterable[int]) -> str:
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")

    def byte_lengths(self) -> np.ndarray:
        return np.ones(256, dtype=np.int64)

    @property
    def mask_id(self) -> int:
        return 0  # byte 0: no text holds it

    def to_hf(self) -> HFTokenizer:
        """The ``ByteLevel`` pre-tokenizer (no regex split) over a BPE model of the 256 byte symbols and no merges,
        id = byte value; the ``ByteLevel`` decoder (invalid UTF-8 decodes with replacement characters)."""
        hf = HFTokenizer(models.BPE(byte_symbols(), [], fuse_unk=False))
        hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
        hf.decoder = decoders.ByteLevel()
        return hf


def byte_symbols() -> dict[str, int]:
    """The ByteLevel symbol of every byte -> the byte (GPT-2's map: printable bytes are themselves, the others
    256, 257, ... in order)."""
    printable = {*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)}
    shifted = iter(range(256, 512))
    return {chr(b) if b in printable else chr(next(shifted)): b for b in range(256)}
