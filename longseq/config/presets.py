"""Presets: plain functions returning a :class:`~longseq.config.run.RunConfig`."""

from __future__ import annotations

import difflib

from longseq.config.base import ConfigError
from longseq.config.model import MemoryConfig, ModelConfig
from longseq.config.run import DataConfig, RunConfig, TrainConfig


def tiny_shakespeare() -> RunConfig:
    """The default: a 4-layer character model on the bundled corpus, a few minutes on 2 CPU cores."""
    return RunConfig(
        model=ModelConfig(
            vocab_size=0,
            n_layer=4,
            d_model=128,
            n_head=4,
            d_head=32,
            d_inner=512,
            dropout=0.1,
            memory=MemoryConfig(mem_len=64),
        ),
        data=DataConfig(path=None, tokenizer="char", tgt_len=64, batch_size=16, eval_tgt_len=64, eval_batch_size=16),
        train=TrainConfig(
            max_steps=1200, lr=2e-3, min_lr=1e-4, warmup_steps=100, eval_interval=300, eval_max_segments=80
        ),
    )


def enwik8_base() -> RunConfig:
    """The paper's 12-layer enwik8 model (run_enwik8_base.sh); evaluate with tgt_len=80, mem_len=2100, clamp_len=820."""
    return RunConfig(
        model=ModelConfig(
            vocab_size=0, n_layer=12, d_model=512, n_head=8, d_head=64, d_inner=2048, dropout=0.1, dropatt=0.0,
            memory=MemoryConfig(mem_len=512),
        ),
        data=DataConfig(tokenizer="byte", tgt_len=512, batch_size=22, eval_tgt_len=128, eval_batch_size=10),
        train=TrainConfig(
            max_steps=400_000, lr=2.5e-4, min_lr=0.0, warmup_steps=0, schedule="cosine", clip=0.25,
            eval_interval=4000, log_interval=200,
        ),
    )  # fmt: skip


def text8_base() -> RunConfig:
    """The paper's 12-layer text8 model (same architecture as enwik8-base)."""
    run = enwik8_base()
    run.data.tokenizer = "char"
    return run


def wt103_base() -> RunConfig:
    """The paper's 16-layer WikiText-103 model with adaptive softmax; evaluate with tgt_len=64, mem_len=640, clamp_len=400, same_length=True."""
    return RunConfig(
        model=ModelConfig(
            vocab_size=0, n_layer=16, d_model=410, n_head=10, d_head=41, d_inner=2100, dropout=0.1,
            dropatt=0.0, memory=MemoryConfig(mem_len=150), cutoffs=[20_000, 40_000, 200_000], div_val=1,
        ),
        data=DataConfig(tokenizer="word", tgt_len=150, batch_size=60, eval_tgt_len=150, eval_batch_size=10),
        train=TrainConfig(
            max_steps=200_000, lr=2.5e-4, min_lr=0.0, warmup_steps=0, schedule="cosine", clip=0.25,
            eval_interval=4000, log_interval=200,
        ),
    )  # fmt: skip


def ptb() -> RunConfig:
    """A 24M-parameter Penn Treebank model of the paper's size (16 layers, d_model 380, adaptive softmax).

    The paper's PTB result also uses variational dropout and weight averaging, which longseq does not implement.
    """
    return RunConfig(
        model=ModelConfig(
            vocab_size=0, n_layer=16, d_model=380, n_head=10, d_head=38, d_inner=900, dropout=0.5,
            dropatt=0.2, memory=MemoryConfig(mem_len=70), cutoffs=[2000, 4000, 8000], div_val=1,
        ),
        data=DataConfig(tokenizer="word", tgt_len=70, batch_size=20, eval_tgt_len=70, eval_batch_size=10),
        train=TrainConfig(
            max_steps=100_000, lr=2.5e-4, min_lr=0.0, warmup_steps=1000, schedule="cosine", clip=0.25,
            eval_interval=2000, log_interval=200,
        ),
    )  # fmt: skip


PRESETS = {
    "tiny-shakespeare": tiny_shakespeare,
    "enwik8-base": enwik8_base,
    "text8-base": text8_base,
    "wt103-base": wt103_base,
    "ptb": ptb,
}


def get_preset(name: str) -> RunConfig:
    """Return a fresh :class:`RunConfig` for a preset name, or raise with the close matches."""
    if name not in PRESETS:
        close = difflib.get_close_matches(name, PRESETS, n=3, cutoff=0.4)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise ConfigError(f"unknown preset {name!r}{hint}; available: {', '.join(PRESETS)}")
    return PRESETS[name]()
