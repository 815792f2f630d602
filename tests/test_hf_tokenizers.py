"""Exports carry a tokenizer transformers loads: ``AutoTokenizer.from_pretrained(DIR)`` is a fast tokenizer giving
longseq's ids for every tokenizer kind and decoding to longseq's text, and ``pipeline("text-generation",
model=DIR)`` continues a prompt with the tokens longseq draws."""

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")
if int(transformers.__version__.split(".")[0]) < 5:
    pytest.skip(f"longseq.hf needs transformers 5, this is {transformers.__version__}", allow_module_level=True)

from tokenizers import Tokenizer as HFTokenizer  # noqa: E402
from tokenizers import decoders, models, pre_tokenizers, trainers  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast, pipeline  # noqa: E402

import longseq.hf  # noqa: E402, F401  (registers the classes)
from longseq import ModelConfig, RunConfig  # noqa: E402
from longseq.cli import main  # noqa: E402
from longseq.config import DataConfig, TrainConfig  # noqa: E402
from longseq.data.tokenizers import (  # noqa: E402
    BPETokenizer,
    ByteTokenizer,
    CharTokenizer,
    WordTokenizer,
    fit_order,
    iter_pieces,
    train_bpe,
)
from longseq.generation import generate  # noqa: E402
from longseq.interop.hf_longseq import export_longseq_hf  # noqa: E402
from longseq.model import build_model  # noqa: E402
from longseq.train.checkpoint import save_checkpoint  # noqa: E402

TRAIN = (
    "The cat sat on the mat.\nLe chat — naïve café 東京\n\nΟΔΟΣ σ end  \ttabs\r\nmore lines here\n"
    "hello world, the cat and the hat <|endoftext|>\n"
) * 3
TEXTS = [  # unicode, newlines (none, one, several, \r\n), unusual whitespace, unknown words, a special token's text
    "",
    "\n",
    "The cat",
    "the cat\n",
    "a\n\nb\n\n two.\n\n\n",
    "unknown zebra word\n  spaced\t\tout \n",
    "東京 café naïve\r\n",
    "ΟΔΟΣ ΣΑ ΟΔΟΣ.",
    "x<eos>y <eos> <unk> <|endoftext|>",
    "<pad> [PAD]",
    "\x1c\x85odd\u2028sep\u3000wide",
    "emoji 🙂 mixed\n\n\n",
    "mat." * 40,
]


def gpt2_like() -> BPETokenizer:
    """A byte-level BPE file as GPT-2's: ``<|endoftext|>`` an added special token, merges of line ends ("\\n\\n",
    which longseq never reads: it encodes line by line), ids ordered by longseq."""
    hf = HFTokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(
        vocab_size=320, initial_alphabet=alphabet, special_tokens=["<|endoftext|>"], show_progress=False
    )
    hf.train_from_iterator([TRAIN, "one.\n\ntwo.\n\n\n" * 20], trainer)  # whole text: merges across line ends
    return fit_order(BPETokenizer(hf.to_str()), [TRAIN])


KINDS = {
    "byte": lambda: ByteTokenizer(),
    "char": lambda: CharTokenizer.build(TRAIN + "".join(TEXTS)),
    "word": lambda: WordTokenizer.build(TRAIN),
    "word-lowercase": lambda: WordTokenizer.build(TRAIN, lowercase=True),
    "bpe": lambda: fit_order(train_bpe(iter_pieces([TRAIN]), 300), [TRAIN]),
    "bpe-gpt2-like": gpt2_like,
}
SPECIAL = {  # what each kind names beside the padding token: only the tokens it has
    "word": {"eos_token": "<eos>", "unk_token": "<unk>"},
    "word-lowercase": {"eos_token": "<eos>", "unk_token": "<unk>"},
    "bpe-gpt2-like": {"eos_token": "<|endoftext|>"},
}
BASE = dict(n_layer=2, d_model=16, n_head=2, d_head=8, d_inner=32, mem_len=6, dropout=0.0)


def exported(tokenizer, directory, **extra) -> str:
    torch.manual_seed(0)
    model = build_model(ModelConfig(vocab_size=tokenizer.vocab_size, **BASE, **extra)).eval()
    export_longseq_hf(model, str(directory), tokenizer, segment_len=4)
    return str(directory)


@pytest.mark.parametrize("kind", list(KINDS))
def test_auto_tokenizer_gives_longseqs_ids_and_text(kind, tmp_path):
    ours = KINDS[kind]()
    directory = exported(ours, tmp_path / "hf")
    theirs = AutoTokenizer.from_pretrained(directory)
    assert isinstance(theirs, PreTrainedTokenizerFast) and theirs.vocab_size == ours.vocab_size
    assert len(theirs) == ours.vocab_size + 1 and theirs.pad_token_id == ours.vocab_size  # padding after the vocabulary
    named = {k: getattr(theirs, k) for k in ("bos_token", "eos_token", "unk_token", "pad_token")}
    assert named == {
        "bos_token": None,
        "eos_token": None,
        "unk_token": None,
        "pad_token": "<|pad|>",
        **SPECIAL.get(kind, {}),
    }
    texts = [t for t in TEXTS if kind != "char" or set(t) <= set(ours.chars)]
    if not kind.startswith("bpe"):  # the padding token's own text is text (a BPE tokenizer matches added tokens)
        texts.append("a<|pad|>b")
    batch = theirs(texts)["input_ids"]  # transformers' default: add_special_tokens=True
    for text, ids in zip(texts, batch):
        expected = ours.encode_prompt(text).tolist()  # encode's, but a word text's last line ends only if written so
        assert ids == expected == theirs.encode(text, add_special_tokens=False), text
        assert theirs.decode(expected) == ours.decode(expected), text
    theirs.save_pretrained(str(tmp_path / "again"))  # transformers' own round trip keeps it
    again = AutoTokenizer.from_pretrained(str(tmp_path / "again"))
    assert again(texts)["input_ids"] == batch


def test_unknown_characters_and_bytes(tmp_path):
    """A character outside a character vocabulary is an error both ways (never a dropped character); any byte
    sequence, invalid UTF-8 included, decodes as longseq decodes it."""
    chars = CharTokenizer.build("abc \n")
    theirs = AutoTokenizer.from_pretrained(exported(chars, tmp_path / "char"))
    with pytest.raises(ValueError, match="'z'"):
        chars.encode("abz")
    with pytest.raises(Exception, match="Missing \\[UNK\\] token"):
        theirs("abz")
    byte = ByteTokenizer()
    theirs = AutoTokenizer.from_pretrained(exported(byte, tmp_path / "byte"))
    rows = torch.randint(0, 256, (300, 9), generator=torch.Generator().manual_seed(0)).tolist()
    assert [theirs.decode(r) for r in rows] == [byte.decode(r) for r in rows]


def test_save_pretrained_carries_the_tokenizer(tmp_path):
    """A model that knows its tokenizer (loaded from an export, or ``from_longseq(..., tokenizer=)``) writes it with
    ``save_pretrained``; the tokenizer loads from there."""
    word = WordTokenizer.build(TRAIN)
    hf = AutoModelForCausalLM.from_pretrained(exported(word, tmp_path / "hf"))
    hf.save_pretrained(str(tmp_path / "saved"))
    direct = longseq.hf.from_longseq(hf.model, segment_len=4, tokenizer=word)
    direct.save_pretrained(str(tmp_path / "direct"))
    for directory in ("saved", "direct"):
        theirs = AutoTokenizer.from_pretrained(str(tmp_path / directory))
        assert theirs(TEXTS)["input_ids"] == [word.encode_prompt(t).tolist() for t in TEXTS]
    config = json.loads((tmp_path / "saved" / "tokenizer_config.json").read_text())
    assert config["longseq_kind"] == "word" and config["tokenizer_class"] == "PreTrainedTokenizerFast"


def test_pipeline_continues_a_prompt_as_longseq(tmp_path):
    """``pipeline("text-generation", model=DIR)`` on a ``longseq convert --to-hf`` export: the greedy and the
    seeded sampled continuations are longseq's, decoded by longseq's tokenizer."""
    tokenizer = ByteTokenizer()
    torch.manual_seed(0)
    model = build_model(ModelConfig(vocab_size=256, **BASE)).eval()
    run = RunConfig(model=model.config, data=DataConfig(tokenizer="byte", tgt_len=5), train=TrainConfig())
    save_checkpoint(str(tmp_path / "ck"), model, run, tokenizer)
    assert main(["convert", "--to-hf", "--checkpoint", str(tmp_path / "ck"), "--out", str(tmp_path / "hf")]) == 0
    generator = pipeline("text-generation", model=str(tmp_path / "hf"))
    prompt = "naïve cat\n"
    ids = torch.as_tensor(tokenizer.encode(prompt))[None]
    sampling = dict(recurrence=model.config.recurrence(mem_len=model.config.memory.mem_len + 5), segment_len=5)
    greedy = generator(prompt, max_new_tokens=10, do_sample=False)[0]["generated_text"]
    assert greedy == prompt + tokenizer.decode(generate(model, ids, 10, temperature=0, **sampling)[0].tolist())
    torch.manual_seed(3)
    drawn = generator(prompt, max_new_tokens=10, top_k=20, return_full_text=False)[0]["generated_text"]
    expected = generate(model, ids, 10, top_k=20, generator=torch.Generator().manual_seed(3), **sampling)
    assert drawn == tokenizer.decode(expected[0].tolist())


def test_pipeline_of_a_word_model_keeps_its_line_ends(tmp_path):
    """A word model's ``<eos>`` is its line end: pipelines skip special tokens unless told not to."""
    word = WordTokenizer.build(TRAIN)
    directory = exported(word, tmp_path / "hf")
    model = AutoModelForCausalLM.from_pretrained(directory)
    generator = pipeline("text-generation", model=directory)
    ids = torch.as_tensor(word.encode_prompt("the cat sat"))[None]  # the line goes on
    made = model.generate(ids, max_new_tokens=12, do_sample=False)[0, ids.size(1) :].tolist()
    text = generator(
        "the cat sat", max_new_tokens=12, do_sample=False, return_full_text=False, skip_special_tokens=False
    )
    assert text[0]["generated_text"] == word.decode(made)


@pytest.mark.parametrize("kind", ["byte", "word"])
def test_a_batched_pipeline_pads_and_gives_every_prompt_its_own_continuation(kind, tmp_path):
    """``pipeline(..., batch_size=3)`` pads prompts of different lengths on the left with the tokenizer's padding
    token: every prompt's greedy continuation is the one longseq generates for that prompt alone."""
    ours = KINDS[kind]()
    directory = exported(ours, tmp_path / "hf", init_std=0.3)  # predictions that depend on the context
    generator = pipeline("text-generation", model=directory, batch_size=3)
    assert generator.tokenizer.padding_side == "left" and generator.tokenizer.pad_token_id == ours.vocab_size
    texts = ["the cat sat on the mat", "hello", "the hat and", "café"]
    model = AutoModelForCausalLM.from_pretrained(directory).model
    batched = generator(texts, max_new_tokens=8, do_sample=False, return_full_text=False, skip_special_tokens=False)
    for text, out in zip(texts, batched):
        ids = torch.as_tensor(ours.encode_prompt(text))[None]
        expected = generate(
            model,
            ids,
            8,
            temperature=0,
            recurrence=model.config.recurrence(mem_len=model.config.memory.mem_len + 4),
            segment_len=4,
        )
        assert out[0]["generated_text"] == ours.decode(expected[0].tolist()), text
