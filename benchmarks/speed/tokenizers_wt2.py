"""Tokens per byte and bits per character of one small model on WikiText-2 with the byte, char, word and BPE
tokenizers.

    python benchmarks/speed/tokenizers_wt2.py [--tokenizers byte char word bpe] [--steps 300] [--vocab-size 8192]

Every tokenizer trains the same model (2 layers, d_model 128, 4 heads x 32, d_inner 512, mem_len 64; batch 16 x
64 tokens, AdamW lr 2e-3 with 50 warmup steps and cosine decay) for ``--steps`` steps, then the whole test split is
scored in 16 ordered streams, memory carried.  Equal steps are equal tokens, not equal text: the table gives the
characters each run saw.

Bits per character are comparable across tokenizers: the total NLL of the scored tokens, divided by ln 2 and by
the number of characters those tokens cover.  A token covers the characters from its start to the next token's
start (:meth:`Tokenizer.offsets`), so the text is shared out exactly: whitespace between words goes to the word
before it, and the bytes of one character share it (the last byte covers it).  The first token of every stream is
not predicted, so its characters are not counted.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
import time

import numpy as np

from longseq import DataConfig, ModelConfig, RunConfig, TrainConfig
from longseq.api import train
from longseq.data import load_corpus
from longseq.eval import evaluate
from longseq.train import load_checkpoint

DATA_ENV = "LONGSEQ_DATA"


def data_root(given: str | None) -> str:
    """The folder of the corpora: ``--data-root``, else ``$LONGSEQ_DATA``; an error names both when neither is set."""
    root = given or os.environ.get(DATA_ENV)
    if not root:
        raise SystemExit(f"the corpora are read from disk: pass --data-root DIR or set {DATA_ENV}=DIR (a folder "
                         "holding ptb/ and wikitext-2/)")  # fmt: skip
    if not os.path.isdir(root):
        raise SystemExit(f"the data root {root} (from --data-root or {DATA_ENV}) is not a folder")
    return root


BATCH, TGT_LEN = 16, 64


def chars_per_token(tokenizer, text: str, n_tokens: int) -> np.ndarray:
    """The characters each token covers: from its start to the next token's start."""
    starts = tokenizer.offsets(text)[:, 0]
    if len(starts) != n_tokens:
        raise RuntimeError(f"{tokenizer.kind}: {len(starts)} offsets for {n_tokens} tokens")
    return np.diff(np.append(starts, len(text)))


def scored_chars(per_token: np.ndarray, batch: int) -> int:
    """Characters covered by the tokens an ordered pass in ``batch`` streams predicts (each row's tokens 1..N-1)."""
    n_step = len(per_token) // batch
    rows = per_token[: n_step * batch].reshape(batch, n_step)  # (B, N)
    return int(rows[:, 1:].sum())


def run_one(spec: str, steps: int, vocab_size: int, work: str, wt2: str) -> dict:
    start = time.perf_counter()
    corpus = load_corpus(wt2, spec, vocab_size=vocab_size)
    run = RunConfig(
        model=ModelConfig(vocab_size=corpus.tokenizer.vocab_size, n_layer=2, d_model=128, n_head=4, d_head=32,
                             d_inner=512, dropout=0.1, mem_len=64),
        data=DataConfig(path=wt2, tokenizer=spec, vocab_size=vocab_size, tgt_len=TGT_LEN, batch_size=BATCH,
                        eval_tgt_len=TGT_LEN, eval_batch_size=BATCH),
        train=TrainConfig(max_steps=steps, lr=2e-3, min_lr=1e-4, warmup_steps=50, eval_interval=steps,
                          eval_max_segments=20, log_interval=steps),
    )  # fmt: skip
    out = os.path.join(work, spec)
    result = train(run, out, corpus=corpus, progress=False)
    model, _, _, _ = load_checkpoint(os.path.join(out, "last"))
    metrics = evaluate(model, corpus.test, batch_size=BATCH, tgt_len=TGT_LEN)
    with open(os.path.join(wt2, "wiki.test.tokens"), encoding="utf-8") as f:
        test_text = f.read()
    per_token = chars_per_token(corpus.tokenizer, test_text, len(corpus.test))
    chars = scored_chars(per_token, BATCH)
    nll = metrics["loss"] * metrics["tokens"]
    train_text_chars = os.path.getsize(os.path.join(wt2, "wiki.train.tokens"))  # ASCII-dominated: bytes ~ chars
    return {
        "tokenizer": spec,
        "vocab_size": corpus.tokenizer.vocab_size,
        "test_tokens_per_byte": len(corpus.test) / len(test_text.encode("utf-8")),
        "test_bpc": nll / math.log(2) / chars,
        "test_bits_per_token": metrics["loss"] / math.log(2),
        "scored_tokens": metrics["tokens"],
        "scored_chars": chars,
        "train_tokens_seen": result.tokens,
        "train_chars_seen_approx": round(result.tokens * train_text_chars / len(corpus.train)),
        "final_train_loss": result.train_loss,
        "wall_s": time.perf_counter() - start,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizers", nargs="+", default=["byte", "char", "word", "bpe"])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--vocab-size", type=int, default=8192)
    parser.add_argument("--data-root", help=f"the folder holding wikitext-2/ (default: ${DATA_ENV})")
    args = parser.parse_args()
    wt2 = os.path.join(data_root(args.data_root), "wikitext-2")
    with tempfile.TemporaryDirectory() as work:
        for spec in args.tokenizers:
            print(json.dumps(run_one(spec, args.steps, args.vocab_size, work, wt2)), flush=True)


if __name__ == "__main__":
    main()
