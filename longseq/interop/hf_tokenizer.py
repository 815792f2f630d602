"""longseq's tokenizers as a ``tokenizer.json`` and ``tokenizer_config.json`` that transformers' ``AutoTokenizer``
loads as a fast tokenizer (``PreTrainedTokenizerFast``), built from the ``tokenizers`` library's own models,
normalizers, pre-tokenizers and decoders, written without transformers.

Each gives the ids :meth:`longseq.data.tokenizers.Tokenizer.encode_prompt` gives (the text as written, which the
model continues: ``generate``'s prompts, the LM evaluation harness's requests; ``encode``'s but for a word
tokenizer, whose ``encode`` reads a corpus and ends its last line too), and decodes to
:meth:`~longseq.data.tokenizers.Tokenizer.decode`'s text (``skip_special_tokens=False``, transformers' default):

Each kind builds its own (:meth:`~longseq.data.tokenizers.Tokenizer.to_hf`, beside its encoder in
:mod:`longseq.data.tokenizers`) and names its special tokens (``<eos>`` and ``<unk>`` of a word vocabulary,
``<|endoftext|>`` of GPT-2's BPE); ``split_special_tokens`` is on except for a BPE, whose added tokens are matched in
the text as longseq matches them.

Every kind gets a padding token, ``<|pad|>``, added after the vocabulary (id = the model's ``vocab_size``, so no
text token is given up for it): transformers pads batches with it (``padding_side="left"`` for generation), and
the model reads a position holding it, or masked by ``attention_mask``, as padding (skipped).  Byte, char and
word tokenizers never match its text (``split_special_tokens``); a BPE tokenizer matches it like its other added
tokens.  None adds a beginning-of-text token.
"""

from __future__ import annotations

import json
import os

from tokenizers import AddedToken
from tokenizers import Tokenizer as HFTokenizer

from longseq.data.tokenizers import Tokenizer

TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
PAD = "<|pad|>"  # the padding token, added after the vocabulary


def hf_tokenizer(tokenizer: Tokenizer) -> HFTokenizer:
    """The ``tokenizers`` tokenizer that encodes and decodes as ``tokenizer`` (its kind's
    :meth:`~longseq.data.tokenizers.Tokenizer.to_hf`), with the padding token at id ``tokenizer.vocab_size``."""
    hf = tokenizer.to_hf()
    if hf.token_to_id(PAD) is not None:
        raise ValueError(f"the tokenizer's vocabulary holds {PAD!r}, the padding token longseq adds after it")
    hf.add_special_tokens([AddedToken(PAD, special=True, normalized=False)])
    if hf.token_to_id(PAD) != tokenizer.vocab_size:
        raise ValueError(
            f"the padding token got id {hf.token_to_id(PAD)}, not {tokenizer.vocab_size} (after the vocabulary): "
            "the model has ids its tokenizer lacks (a padded embedding); export it with --format llama"
        )
    return hf


def special_tokens(tokenizer: Tokenizer) -> dict[str, str]:
    """The special tokens transformers names: ``pad_token``, and ``eos_token`` and ``unk_token`` where the
    tokenizer has them."""
    return {"pad_token": PAD, **tokenizer.special_tokens()}


def hf_tokenizer_config(tokenizer: Tokenizer) -> dict:
    """The ``tokenizer_config.json`` that goes with :func:`hf_tokenizer`."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "clean_up_tokenization_spaces": False,
        "split_special_tokens": tokenizer.split_special_tokens,
        "model_input_names": ["input_ids", "attention_mask"],
        "longseq_kind": tokenizer.kind,
        **special_tokens(tokenizer),
    }


OLD_WORD_END = r"\n?\z"  # the normalizer pattern that ended every text with a line end (before 2026-12-07)


def ends_every_text(directory: str) -> bool:
    """Whether ``directory/tokenizer.json`` is a word tokenizer written before 2026-12-07, which ends every text with
    ``<eos>`` (a request of the harness then scores one token more than its text); write the export again."""
    try:
        with open(os.path.join(directory, TOKENIZER_FILE), encoding="utf-8") as f:
            steps = (json.load(f).get("normalizer") or {}).get("normalizers") or []
    except (OSError, ValueError, AttributeError):
        return False
    return any(isinstance(s, dict) and (s.get("pattern") or {}).get("Regex") == OLD_WORD_END for s in steps)


def save_hf_tokenizer(tokenizer: Tokenizer, out: str) -> None:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` into the directory ``out``."""
    with open(os.path.join(out, TOKENIZER_FILE), "w", encoding="utf-8") as f:  # an OSError names the file (save's
        f.write(hf_tokenizer(tokenizer).to_str(pretty=True))  # plain Exception does not); the same bytes
    with open(os.path.join(out, CONFIG_FILE), "w", encoding="utf-8") as f:
        json.dump(hf_tokenizer_config(tokenizer), f, indent=2, sort_keys=True, ensure_ascii=False)
