"""Every kind of longseq model trains on DNA unchanged: a generated genome (a motif repeated with 4% of its bases
mutated, soft-masked stretches and a run of N) read with the ``nucleotide`` tokenizer, the memory carried; after a
few dozen steps each model's validation ``bits_per_base`` is far below the 2 bits of a model that reads no context.
The fast run holds XL, an ssm stack, a gla/delta hybrid with windowed attention and learned chunks to it; the
``llama-xl`` preset and the fixed hourglass are ``slow``."""

from __future__ import annotations

import numpy as np
import pytest

from longseq import RunConfig
from longseq.api import train
from longseq.config import DataConfig, ModelConfig, TrainConfig, get_preset
from longseq.data.corpus import Corpus
from longseq.data.tokenizers import NucleotideTokenizer

SMALL = dict(n_layer=4, d_model=32, n_head=2, d_head=16, d_inner=64, dropout=0.0, mem_len=32)
MODELS = {
    "xl": {},
    "ssm": {"mixer": ["ssm"], "head_dim": 16, "mem_len": 0, "n_head": 8, "d_head": 64},  # heads: the defaults
    "gla-delta": {"mixer": ["gla", "attention", "delta", "attention"], "attention": ["window"], "window": 16},
    "learned": {"shorten_layers": [1, 3], "shorten_factor": 2, "boundaries": "learned"},
    "hourglass": {"shorten_layers": [1, 3], "shorten_factor": 2},
}


def genome(n: int = 24_000, seed: int = 0) -> str:
    rng = np.random.default_rng(seed)
    motif = rng.choice(list("ACGT"), size=13)
    bases = np.resize(motif, n)
    mutated = rng.random(n) < 0.04
    bases[mutated] = rng.choice(list("ACGT"), size=int(mutated.sum()))
    text = "".join(bases)
    return text[:3000] + text[3000:4000].lower() + "N" * 200 + text[4200:]


def dna_corpus() -> Corpus:
    t = NucleotideTokenizer()
    ids = t.encode(genome())
    cut, end = int(len(ids) * 0.9), int(len(ids) * 0.95)
    return Corpus(ids[:cut], ids[cut:end], ids[end:], t, "generated genome")


def dna_run(model: ModelConfig) -> RunConfig:
    data = DataConfig(tokenizer="nucleotide", tgt_len=32, batch_size=8, eval_tgt_len=32, eval_batch_size=4)
    schedule = TrainConfig(max_steps=60, lr=3e-3, warmup_steps=5, eval_interval=60, eval_max_segments=8,
                           save_every_s=0.0)  # fmt: skip
    return RunConfig(model, data, schedule)


def bits_after_training(run: RunConfig, tmp_path) -> float:
    result = train(run, str(tmp_path / "run"), corpus=dna_corpus(), progress=False)
    return result.valid["bits_per_base"]


@pytest.mark.parametrize("name", ["xl", "ssm", "gla-delta", "learned"])
def test_each_model_kind_learns_dna(name, tmp_path):
    options = {**SMALL, **MODELS[name]}
    if name == "ssm":
        options = {k: v for k, v in options.items() if k not in ("n_head", "d_head", "mem_len")}
    bits = bits_after_training(dna_run(ModelConfig(vocab_size=7, **options)), tmp_path)
    assert bits < 1.5, f"{name}: {bits:.3f} bits/base"  # no context: 2 bits; the motif read back: about 0.4


@pytest.mark.slow
@pytest.mark.parametrize("name", ["llama-xl", "hourglass"])
def test_the_llama_preset_and_the_fixed_hourglass_learn_dna(name, tmp_path):
    if name == "llama-xl":
        model = get_preset("llama-xl").model.replace(vocab_size=7, **{k: v for k, v in SMALL.items() if k != "d_inner"})
    else:
        model = ModelConfig(vocab_size=7, **SMALL, **MODELS[name])
    assert bits_after_training(dna_run(model), tmp_path) < 1.5
