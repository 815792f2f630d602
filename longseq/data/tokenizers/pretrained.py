"""The tokenizer of a pretrained model (kind ``pretrained``): its own ``tokenizer.json`` on the HF ``tokenizers``
library, with its ids as they are (a pretrained model's ids are fixed: never ordered by frequency), its special
tokens (``bos_token``, ``eos_token``, ``unk_token``, ``pad_token``) and its chat template.

``longseq convert --from-hf`` makes one from the checkpoint's tokenizer as transformers reads it
(:mod:`longseq.interop.llama_tokenizer`), so that :meth:`PretrainedTokenizer.encode` gives the ids of
transformers' tokenizer without special tokens (``tokenizer(text, add_special_tokens=False)``), a text encoded
whole: a pretrained tokenizer's pieces may span any cut (a SentencePiece tokenizer marks the start of its input, a
Llama 3 pre-tokenizer joins spaces to the newlines after them), so a stream is one piece (:meth:`pieces`).
A prompt of ``longseq generate`` starts with what the tokenizer's post-processor puts before a text
(:meth:`start_ids`: a BOS for Llama 2 and 3; none for SmolLM2), and the evaluation harness reads a document after the
model's own beginning of text (:attr:`document_start_id`: its BOS, or its EOS where it has none, as its ``hf`` model
reads); requests are encoded as written, as transformers' tokenizer without special tokens.  The model's vocabulary may be larger than the tokenizer's (rows padded to a multiple): ids
past the tokenizer's are never produced and decode to nothing.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator

import numpy as np
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import pre_tokenizers

from longseq.data.tokenizers.base import Settings, Tokenizer, TokenizerError

SPECIAL_NAMES = ("bos_token", "eos_token", "unk_token", "pad_token")


class PretrainedTokenizer(Tokenizer):
    """A pretrained model's tokenizer: ``hf_json`` (its ``tokenizer.json`` text), ``vocab_size`` (the model's;
    at least the tokenizer's), ``special`` (transformers' names of its special tokens -> their text) and
    ``chat_template`` (Jinja, or None)."""

    kind = "pretrained"
    fit_on = "nothing"  # comes with its model: never learnt from a corpus
    split_special_tokens = False  # its added tokens are matched in the text, as transformers matches them
    ordered = True  # the model's own ids: never reordered

    def __init__(
        self, hf_json: str, vocab_size: int, special: dict[str, str] | None = None, chat_template: str | None = None
    ) -> None:
        try:
            self.hf = HFTokenizer.from_str(hf_json)
        except Exception as exc:  # the library raises its own exception type for a bad file
            raise TokenizerError(f"not a tokenizers file: {exc}") from None
        own = self.hf.get_vocab_size(with_added_tokens=True)
        if vocab_size < own:
            raise TokenizerError(f"the tokenizer has {own} tokens, more than the model's {vocab_size}")
        self.hf_json, self._vocab_size, self.chat_template = hf_json, vocab_size, chat_template
        self.special = dict(special or {})
        unknown = {name: text for name, text in self.special.items() if self.hf.token_to_id(text) is None}
        if set(self.special) - set(SPECIAL_NAMES) or unknown:
            raise TokenizerError(f"special tokens {unknown or self.special} are not tokens of this tokenizer")

    @classmethod
    def fit(cls, blocks: Iterable[str], settings: Settings) -> PretrainedTokenizer:
        raise TokenizerError(
            "a pretrained tokenizer comes with its model (longseq convert --from-hf); it is not learnt from text"
        )

    @classmethod
    def from_dict(cls, data: dict) -> PretrainedTokenizer:
        return cls(
            json.dumps(data["tokenizer"]), int(data["vocab_size"]), data.get("special"), data.get("chat_template")
        )

    def to_dict(self) -> dict:
        return {
            "kind": self.kind,
            "tokenizer": json.loads(self.hf_json),
            "vocab_size": self._vocab_size,
            "special": self.special,
            "chat_template": self.chat_template,
        }

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    def token_id(self, name: str) -> int | None:
        """The id of the special token transformers names ``name`` (``eos_token`` ...), or None."""
        text = self.special.get(name)
        return None if text is None else self.hf.token_to_id(text)

    @property
    def bos_id(self) -> int | None:
        return self.token_id("bos_token")

    @property
    def eos_id(self) -> int | None:
        return self.token_id("eos_token")

    @property
    def document_start_id(self) -> int | None:
        """What a document is read after: the model's BOS, or its EOS where it has none."""
        return self.bos_id if self.bos_id is not None else self.eos_id

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self.hf.encode(text, add_special_tokens=False).ids, dtype=np.int64)

    def start_ids(self) -> list[int]:
        """The special tokens the tokenizer's post-processor puts before a text (Llama's BOS; none for SmolLM2)."""
        plain = self.hf.encode("x", add_special_tokens=False).ids
        full = self.hf.encode("x", add_special_tokens=True).ids
        return next((full[:k] for k in range(len(full) - len(plain) + 1) if full[k : k + len(plain)] == plain), [])

    def pieces(self, blocks: Iterable[str]) -> Iterator[str]:
        """The whole stream as one piece (its tokens may span any cut: the module docstring)."""
        text = "".join(blocks)
        if text:
            yield text

    def encode_pieces(self, pieces: list[str]) -> np.ndarray:
        parts = [self.encode(piece) for piece in pieces]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    def offsets(self, text: str) -> np.ndarray:
        spans = self.hf.encode(text, add_special_tokens=False).offsets
        return np.asarray(spans, dtype=np.int64).reshape(-1, 2)

    def decode(self, ids: Iterable[int]) -> str:
        ids = np.asarray(ids if hasattr(ids, "__len__") else list(ids), dtype=np.int64).reshape(-1)
        bad = ids[(ids < 0) | (ids >= self.vocab_size)]
        if bad.size:
            raise TokenizerError(f"id {int(bad[0])} is outside the {self.vocab_size}-token vocabulary")
        own = self.hf.get_vocab_size(with_added_tokens=True)
        return self.hf.decode([i for i in ids.tolist() if i < own], skip_special_tokens=False)

    def byte_lengths(self) -> np.ndarray:
        """The UTF-8 bytes each id stands for: a byte-level token's symbols one byte each, a SentencePiece
        token's text with its ``▁`` a space and a byte token (``<0x0A>``) one byte, an added token its text's
        bytes; ids past the tokenizer's 0."""
        data = json.loads(self.hf_json)
        byte_level = (data.get("decoder") or {}).get("type") == "ByteLevel"
        alphabet = set(pre_tokenizers.ByteLevel.alphabet())
        added = self.hf.get_added_tokens_decoder()
        lengths = np.zeros(self.vocab_size, dtype=np.int64)
        for i in range(self.hf.get_vocab_size(with_added_tokens=True)):
            token = self.hf.id_to_token(i)
            if token is None:
                continue
            if i in added:
                lengths[i] = len(token.encode("utf-8"))
            elif byte_level and set(token) <= alphabet:
                lengths[i] = len(token)
            elif len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
                lengths[i] = 1
            else:
                lengths[i] = len(token.replace("\u2581", " ").encode("utf-8"))
        return lengths

    def to_hf(self) -> HFTokenizer:
        """The ``tokenizers`` library's tokenizer (its own file, post-processor and all)."""
        return HFTokenizer.from_str(self.hf_json)

    def special_tokens(self) -> dict[str, str]:
        """Its ``bos_token``, ``eos_token`` and ``unk_token`` (its ``pad_token`` is in :attr:`special`: longseq's
        transformers format pads with a token of its own)."""
        return {name: text for name, text in self.special.items() if name != "pad_token"}
