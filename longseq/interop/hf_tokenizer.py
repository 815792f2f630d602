"""longseq's tokenizers as a ``tokenizer.json`` and ``tokenizer_config.json`` that transformers' ``AutoTokenizer``
loads as a fast tokenizer (``PreTrainedTokenizerFast``), built from the ``tokenizers`` library's own models,
normalizers, pre-tokenizers and decoders, written without transformers.

Each gives the ids :meth:`longseq.data.tokenizers.Tokenizer.encode` gives, and decodes to
:meth:`~longseq.data.tokenizers.Tokenizer.decode`'s text (``skip_special_tokens=False``, transformers' default):

* ``byte``: the ``ByteLevel`` pre-tokenizer (no regex split) over a BPE model of the 256 byte symbols and no merges,
  id = byte value; the ``ByteLevel`` decoder (invalid UTF-8 decodes with replacement characters).
* ``char``: every character its own piece (a ``Split`` pre-tokenizer), a ``WordLevel`` model of the characters and
  no unknown token: a character outside the vocabulary is an error at encoding, as longseq's (the library says
  ``Missing [UNK] token from the vocabulary``), never a dropped character.
* ``word``: normalizers end the text with a line end if it has none (an empty text stays empty) and write every
  line end as `` <eos> `` (after ``Lowercase`` with ``lowercase``); a ``Split`` on Python's whitespace characters
  (``str.split``'s) and a ``WordLevel`` model with ``<unk>``; decoders write every word followed by a space and
  ``<eos>`` as a newline.  ``eos_token`` is ``<eos>``, ``unk_token`` ``<unk>``.  ``split_special_tokens`` is on, so
  that text holding ``<eos>`` inside a word is read as longseq reads it (one unknown word).
* ``pretrained`` (an imported model's): its own file as it is (ids, special tokens, post-processor).
* ``bpe``: the tokenizer's own file, with ids renumbered to longseq's (frequency) order and the text cut at every
  line end and into pieces of at most :data:`~longseq.data.tokenizers.PIECE_CHARS` characters before its own
  pre-tokenizer (longseq encodes those pieces one by one), and no post-processor (longseq adds no tokens).  Its
  added tokens are matched in the text, as longseq's; ``<|endoftext|>`` (GPT-2's) is named ``eos_token``, the
  model's unknown token ``unk_token``.

Every kind gets a padding token, ``<|pad|>``, added after the vocabulary (id = the model's ``vocab_size``, so no
text token is given up for it): transformers pads batches with it (``padding_side="left"`` for generation), and
the model reads a position holding it, or masked by ``attention_mask``, as padding (skipped).  Byte, char and
word tokenizers never match its text (``split_special_tokens``); a BPE tokenizer matches it like its other added
tokens.  None adds a beginning-of-text token.
"""

from __future__ import annotations

import json
import os
import sys

from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from longseq.data.pretrained_tokenizer import PretrainedTokenizer
from longseq.data.tokenizers import (
    EOS,
    PIECE_CHARS,
    UNK,
    BPETokenizer,
    ByteTokenizer,
    CharTokenizer,
    Tokenizer,
    WordTokenizer,
)

TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
MISSING = "<not in the character vocabulary>"  # a char WordLevel's unk_token, absent from its vocabulary: an error
BPE_EOS = "<|endoftext|>"
PAD = "<|pad|>"  # the padding token, added after the vocabulary
# str.lower()'s final sigma, but for a case-ignorable character between the letter and the sigma ("A'Σ")
FINAL_SIGMA = r"(?<=\p{Cased})Σ(?!\p{Case_Ignorable}*\p{Cased})"
WHITESPACE = "".join(chr(c) for c in range(sys.maxunicode + 1) if chr(c).isspace())  # what str.split() splits on


def _byte_tokenizer() -> HFTokenizer:
    hf = HFTokenizer(models.BPE(_byte_symbols(), [], fuse_unk=False))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    hf.decoder = decoders.ByteLevel()
    return hf


def _byte_symbols() -> dict[str, int]:
    """The ByteLevel symbol of every byte -> the byte (GPT-2's map: printable bytes are themselves, the others
    256, 257, ... in order)."""
    printable = {*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)}
    shifted = iter(range(256, 512))
    return {chr(b) if b in printable else chr(next(shifted)): b for b in range(256)}


def _char_tokenizer(tokenizer: CharTokenizer) -> HFTokenizer:
    hf = HFTokenizer(models.WordLevel({ch: i for i, ch in enumerate(tokenizer.chars)}, unk_token=MISSING))
    hf.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    hf.decoder = decoders.Fuse()
    return hf


def _word_tokenizer(tokenizer: WordTokenizer) -> HFTokenizer:
    hf = HFTokenizer(models.WordLevel(dict(tokenizer.index), unk_token=UNK))
    steps = [normalizers.Replace(Regex(FINAL_SIGMA), "ς"), normalizers.Lowercase()] if tokenizer.lowercase else []
    steps += [normalizers.Replace(Regex(r"\n?\z"), "\n"), normalizers.Replace("\n", f" {EOS} ")]
    hf.normalizer = normalizers.Sequence(steps)
    spaces = "".join(f"\\x{{{ord(ch):x}}}" for ch in WHITESPACE)
    hf.pre_tokenizer = pre_tokenizers.Split(Regex(f"[{spaces}]+"), behavior="removed")
    hf.decoder = decoders.Sequence(
        [decoders.Replace(Regex(r"\z"), " "), decoders.Replace(Regex(f"\\A{EOS} \\z"), "\n"), decoders.Fuse()]
    )
    return hf


def _bpe_tokenizer(tokenizer: BPETokenizer) -> HFTokenizer:
    data = json.loads(tokenizer.hf_json)
    rank = [int(r) for r in tokenizer.rank]
    data["model"]["vocab"] = {token: rank[i] for token, i in data["model"]["vocab"].items()}
    data["added_tokens"] = [{**t, "id": rank[t["id"]]} for t in data.get("added_tokens") or []]
    pieces = [
        {"type": "Split", "pattern": {"Regex": "\n"}, "behavior": "MergedWithPrevious", "invert": False},
        {"type": "Split", "pattern": {"Regex": f"[\\s\\S]{{{PIECE_CHARS}}}"}, "behavior": "Isolated", "invert": False},
    ]
    own = data.get("pre_tokenizer")
    data["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": pieces + ([own] if own else [])}
    data["post_processor"] = None
    return HFTokenizer.from_str(json.dumps(data))


def hf_tokenizer(tokenizer: Tokenizer) -> HFTokenizer:
    """The ``tokenizers`` tokenizer that encodes and decodes as ``tokenizer`` (see the module docstring), with the
    padding token at id ``tokenizer.vocab_size``."""
    if isinstance(tokenizer, ByteTokenizer):
        hf = _byte_tokenizer()
    elif isinstance(tokenizer, CharTokenizer):
        hf = _char_tokenizer(tokenizer)
    elif isinstance(tokenizer, WordTokenizer):
        hf = _word_tokenizer(tokenizer)
    elif isinstance(tokenizer, BPETokenizer):
        hf = _bpe_tokenizer(tokenizer)
    elif isinstance(tokenizer, PretrainedTokenizer):
        hf = tokenizer.to_hf()  # its own file: ids, special tokens and post-processor as the model was trained
    else:
        raise ValueError(f"no transformers tokenizer for a {type(tokenizer).__name__}")
    if hf.token_to_id(PAD) is not None:
        raise ValueError(f"the tokenizer's vocabulary holds {PAD!r}, the padding token longseq adds after it")
    hf.add_special_tokens([AddedToken(PAD, special=True, normalized=False)])
    if hf.token_to_id(PAD) != tokenizer.vocab_size:
        raise ValueError(
            f"the padding token got id {hf.token_to_id(PAD)}, not {tokenizer.vocab_size} (after the vocabulary): "
            "the model's vocabulary has ids the tokenizer lacks (a padded embedding); export --format llama instead"
        )
    return hf


def special_tokens(tokenizer: Tokenizer) -> dict[str, str]:
    """The special tokens transformers names: ``pad_token``, and ``eos_token`` and ``unk_token`` where the
    tokenizer has them."""
    return {"pad_token": PAD, **_own_special_tokens(tokenizer)}


def _own_special_tokens(tokenizer: Tokenizer) -> dict[str, str]:
    if isinstance(tokenizer, PretrainedTokenizer):
        return {name: text for name, text in tokenizer.special_tokens().items() if name != "pad_token"}
    if isinstance(tokenizer, WordTokenizer):
        return {"eos_token": EOS, "unk_token": UNK}
    if isinstance(tokenizer, BPETokenizer):
        data = json.loads(tokenizer.hf_json)
        named = {}
        if any(t.get("content") == BPE_EOS and t.get("special") for t in data.get("added_tokens") or []):
            named["eos_token"] = BPE_EOS
        unk = data["model"].get("unk_token")
        if unk is not None and unk in data["model"]["vocab"]:
            named["unk_token"] = unk
        return named
    return {}


def hf_tokenizer_config(tokenizer: Tokenizer) -> dict:
    """The ``tokenizer_config.json`` that goes with :func:`hf_tokenizer`."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "clean_up_tokenization_spaces": False,
        "split_special_tokens": not isinstance(tokenizer, (BPETokenizer, PretrainedTokenizer)),
        "model_input_names": ["input_ids", "attention_mask"],
        "longseq_kind": tokenizer.kind,
        **special_tokens(tokenizer),
    }


def save_hf_tokenizer(tokenizer: Tokenizer, out: str) -> None:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` into the directory ``out``."""
    hf_tokenizer(tokenizer).save(os.path.join(out, TOKENIZER_FILE))
    with open(os.path.join(out, CONFIG_FILE), "w", encoding="utf-8") as f:
        json.dump(hf_tokenizer_config(tokenizer), f, indent=2, sort_keys=True, ensure_ascii=False)
