"""``bpe``: byte-level BPE on the HF ``tokenizers`` library, trained on the training text (:func:`train_bpe`) or read
from any BPE ``tokenizer.json`` (GPT-2's).  Decoding gives the text back exactly.  Ids are ordered by frequency in
the training text, like the word vocabulary's (the adaptive softmax's cutoffs rely on it)."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Iterator

import numpy as np
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from longseq.data.tokenizers.base import (
    DEFAULT_BPE_VOCAB,
    PIECE_CHARS,
    Settings,
    Tokenizer,
    TokenizerError,
    iter_pieces,
)

BPE_EOS = "<|endoftext|>"


class BPETokenizer(Tokenizer):
    """Byte-level BPE on the HF ``tokenizers`` library.

    ``hf_json`` is the library's ``tokenizer.json`` text (a BPE model).  Text is encoded in the pieces of
    :func:`iter_pieces` (all cores, in the library's ``encode_batch``), so reading a file in blocks encodes it
    exactly as the whole text; no token spans a line end.  ``order[i]`` is the library id of our id ``i``:
    :meth:`frequency_ordered` sorts ids by frequency in the training text (ties by library id), as the
    adaptive softmax cutoffs need.  ``order=None`` keeps the library's ids (``ordered`` is then False).
    Decoding is exact for byte-level files (no normalizer, a ByteLevel decoder), which is what :func:`train_bpe`
    writes and what GPT-2's file is.
    """

    kind = "bpe"
    split_special_tokens = False  # its added tokens are matched in the text, as longseq matches them

    def __init__(self, hf_json: str, order: Iterable[int] | None = None) -> None:
        try:
            model_type = (json.loads(hf_json).get("model") or {}).get("type")
        except (json.JSONDecodeError, AttributeError) as exc:
            raise TokenizerError(f"not a tokenizers file: {exc}") from None
        if model_type != "BPE":
            raise TokenizerError(f"only BPE tokenizers are supported, this file's model is {model_type!r}")
        try:
            self.hf = HFTokenizer.from_str(hf_json)
        except Exception as exc:  # the library raises its own exception type for a bad file
            raise TokenizerError(f"not a tokenizers file: {exc}") from None
        size = max(self.hf.get_vocab(with_added_tokens=True).values(), default=-1) + 1
        self.ordered = order is not None
        self.order = np.arange(size, dtype=np.int64) if order is None else np.asarray(list(order), dtype=np.int64)
        if not np.array_equal(np.sort(self.order), np.arange(size)):
            raise TokenizerError(f"the id order of a {size}-token BPE tokenizer must be a permutation of 0..{size - 1}")
        self._rank = np.empty_like(self.order)  # library id -> our id
        self._rank[self.order] = np.arange(size)
        self.hf_json = hf_json

    @classmethod
    def fit(cls, blocks: Iterable[str], settings: Settings) -> BPETokenizer:
        """A BPE of ``settings.vocab_size`` tokens learnt from the training text, its ids not yet ordered."""
        return train_bpe(iter_pieces(blocks), settings.vocab_size)

    @classmethod
    def from_dict(cls, data: dict) -> BPETokenizer:
        if "kind" not in data:  # an HF tokenizers file
            return cls(json.dumps(data))
        return cls(json.dumps(data["tokenizer"]), data.get("order"))

    def to_dict(self) -> dict:
        data = {"kind": self.kind, "tokenizer": json.loads(self.hf_json)}
        return {**data, "order": self.order.tolist()} if self.ordered else data

    @property
    def vocab_size(self) -> int:
        return len(self.order)

    @property
    def rank(self) -> np.ndarray:
        return self._rank

    def frequency_ordered(self, counts: np.ndarray) -> BPETokenizer:
        """This tokenizer with ids sorted by ``counts`` (one per library id, counted in the training text by
        an unordered tokenizer), most frequent first, ties by library id."""
        return BPETokenizer(self.hf_json, np.argsort(-np.asarray(counts), kind="stable"))

    def pieces(self, blocks: Iterable[str]) -> Iterator[str]:
        return iter_pieces(blocks)

    def encode_pieces(self, pieces: list[str], batch: int = 4096) -> np.ndarray:
        """The ids of ``pieces``, ``batch`` pieces per call of the library (which spreads a call over every core)."""
        encode = getattr(self.hf, "encode_batch_fast", self.hf.encode_batch)  # _fast (no offsets) since 0.20
        parts = [np.zeros(0, dtype=np.int64)]
        for start in range(0, len(pieces), batch):
            encodings = encode(pieces[start : start + batch], add_special_tokens=False)
            parts.append(np.fromiter(itertools.chain.from_iterable(e.ids for e in encodings), dtype=np.int64))
        return self._rank[np.concatenate(parts)]

    def encode(self, text: str) -> np.ndarray:
        return self.encode_pieces(list(iter_pieces([text])))

    def offsets(self, text: str) -> np.ndarray:
        pieces = list(iter_pieces([text]))
        starts = np.cumsum([0] + [len(p) for p in pieces[:-1]])
        encodings = self.hf.encode_batch(pieces, add_special_tokens=False)
        spans = [np.asarray(e.offsets, dtype=np.int64).reshape(-1, 2) + start for e, start in zip(encodings, starts)]
        return np.concatenate(spans) if spans else np.zeros((0, 2), dtype=np.int64)

    def decode(self, ids: Iterable[int]) -> str:
        ids = np.asarray(ids if hasattr(ids, "__len__") else list(ids), dtype=np.int64).reshape(-1)
        bad = ids[(ids < 0) | (ids >= self.vocab_size)]
        if bad.size:
            raise TokenizerError(f"id {int(bad[0])} is outside the {self.vocab_size}-token vocabulary")
        return self.hf.decode(self.order[ids].tolist(), skip_special_tokens=False)

    def byte_lengths(self) -> np.ndarray:
        """The bytes each token decodes to: a byte-level token's symbols are one byte each (the library's ByteLevel
        alphabet); an added token, or a token of a file without a ByteLevel decoder, counts the UTF-8 bytes of
        its own decoding."""
        byte_level = (json.loads(self.hf_json).get("decoder") or {}).get("type") == "ByteLevel"
        alphabet = set(pre_tokenizers.ByteLevel.alphabet())
        added = self.hf.get_added_tokens_decoder()
        lengths = np.zeros(len(self.order), dtype=np.int64)
        for ours, library in enumerate(self.order.tolist()):
            token = self.hf.id_to_token(library)
            if token is None:
                continue  # an id the file leaves unused
            if byte_level and library not in added and set(token) <= alphabet:
                lengths[ours] = len(token)
            else:
                lengths[ours] = len(self.hf.decode([library], skip_special_tokens=False).encode("utf-8"))
        return lengths

    def to_hf(self) -> HFTokenizer:
        """The tokenizer's own file, with ids renumbered to longseq's (frequency) order and the text cut at every
        line end and into pieces of at most :data:`PIECE_CHARS` characters before its own pre-tokenizer (longseq
        encodes those pieces one by one), and no post-processor (longseq adds no tokens)."""
        data = json.loads(self.hf_json)
        rank = [int(r) for r in self._rank]
        data["model"]["vocab"] = {token: rank[i] for token, i in data["model"]["vocab"].items()}
        data["added_tokens"] = [{**t, "id": rank[t["id"]]} for t in data.get("added_tokens") or []]
        pieces = [
            {"type": "Split", "pattern": {"Regex": "\n"}, "behavior": "MergedWithPrevious", "invert": False},
            {
                "type": "Split",
                "pattern": {"Regex": f"[\\s\\S]{{{PIECE_CHARS}}}"},
                "behavior": "Isolated",
                "invert": False,
            },
        ]
        own = data.get("pre_tokenizer")
        data["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": pieces + ([own] if own else [])}
        data["post_processor"] = None
        return HFTokenizer.from_str(json.dumps(data))

    def special_tokens(self) -> dict[str, str]:
        """``<|endoftext|>`` (GPT-2's) as ``eos_token`` where the file has it, the model's unknown token as
        ``unk_token``."""
        data = json.loads(self.hf_json)
        named = {}
        if any(t.get("content") == BPE_EOS and t.get("special") for t in data.get("added_tokens") or []):
            named["eos_token"] = BPE_EOS
        unk = data["model"].get("unk_token")
        if unk is not None and unk in data["model"]["vocab"]:
            named["unk_token"] = unk
        return named


def train_bpe(pieces: Iterable[str], vocab_size: int = DEFAULT_BPE_VOCAB) -> BPETokenizer:
    """A byte-level BPE of ``vocab_size`` tokens (the 256 byte symbols and merges) learnt from ``pieces`` of the
    training text, streamed (:func:`iter_pieces`); unordered: see :meth:`BPETokenizer.frequency_ordered`."""
    if not 256 <= vocab_size <= 1 << 24:
        raise TokenizerError(
            f"a byte-level BPE needs vocab_size in [256, 2**24] (the 256 byte symbols), got {vocab_size}"
        )
    hf = HFTokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
        show_progress=False,
    )
    hf.train_from_iterator(pieces, trainer)
    return BPETokenizer(hf.to_str())
