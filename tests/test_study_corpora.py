"""The study runner's byte corpora and equal-FLOPs steps (``benchmarks/studies/texts.py``, ``runner.py --flops``).

Claims: character PTB as bytes is one byte for every token of the character corpus, mapped one to one; the
shakespeare split by bytes is the byte tokenizer's split of the single file; a BPE reads the same bytes as the
byte model; ``--flops`` gives every variant the steps that spend the budget (within half a step), so an hourglass,
cheaper a token, trains longer than XL."""

import importlib.util
import os
import sys

import numpy as np
import pytest

from longseq.data.corpus import load_corpus, load_ptb_char

STUDIES = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "studies")


def module(name: str):
    sys.path.insert(0, STUDIES)
    spec = importlib.util.spec_from_file_location(name, os.path.join(STUDIES, f"{name}.py"))
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return loaded


PTB = {  # word-level PTB as the files are: a leading space, <unk>, a line of spaces only (characters of train)
    "train": b" the <unk> fell n years\n the cat 's sat\n \n a b\n",
    "valid": b" n cats <unk>\n",
    "test": b" a cat 's <unk> year\n",
}


def test_character_ptb_as_bytes_is_one_byte_a_character_token(tmp_path):
    texts = module("texts")
    for split, text in PTB.items():
        (tmp_path / f"ptb.{split}.txt").write_bytes(text)
    chars = load_ptb_char(str(tmp_path))
    names = {"_": b" ", "<unk>": texts.UNK, "<eos>": b"\n"}
    for split, text in PTB.items():
        tokens = [chars.tokenizer.words[int(i)] for i in getattr(chars, split)]
        expected = b"".join(names.get(t, t.encode()) for t in tokens)
        assert texts.ptb_bytes(text) == expected


def test_the_byte_corpora_give_every_tokenizer_the_same_test_bytes(tmp_path):
    texts = module("texts")
    stream = load_corpus(None, "byte")
    folder = texts.text_folder("shakespeare-bytes", None, str(tmp_path))
    by_bytes = load_corpus(folder, "byte")
    for split in ("train", "valid", "test"):
        assert np.array_equal(getattr(by_bytes, split), getattr(stream, split))
    bpe = load_corpus(folder, "bpe", vocab_size=300)
    assert bpe.tokenizer.text_bytes(bpe.test) == len(by_bytes.test)
    assert bpe.tokenizer.decode(bpe.test.tolist()).encode() == bytes(by_bytes.test.astype(np.uint8))


def test_equal_flops_sets_each_variant_s_steps():
    runner = module("runner")
    budget = 2e12
    args = runner.parse_args(["--out", "unused", "--corpus", "shakespeare-bytes", "--flops", str(budget),
                              "--variants", "bytes-xl", "bytes-fixed", "bytes-learned", "bpe-xl"])  # fmt: skip
    steps = {}
    for name in args.variant_overrides:
        run = runner.variant_run(args, name, 1, 1024 if name == "bpe-xl" else 256)
        per_step = runner.train_flops_per_step(run)
        assert abs(run.train.max_steps * per_step - budget) <= per_step / 2
        steps[name] = run.train.max_steps
    assert steps["bytes-fixed"] > steps["bytes-xl"] and steps["bytes-learned"] > steps["bytes-xl"]
    assert steps["bpe-xl"] < steps["bytes-xl"]  # its softmax over 1,024 tokens costs more a token
    with pytest.raises(SystemExit, match="attention stacks"):
        runner.train_flops_per_step(runner.variant_run(runner.parse_args(["--out", "x", "--flops", "1e12",
                                                                          "--variants", "ssm"]), "ssm", 1, 50))  # fmt: skip
