"""The paper's ablation (Dai et al., 2019, Table 6) on word-level PTB, equal budgets, small models.

Four models of the same size (4 layers, d_model 128, adaptive softmax with cutoffs 2,000 and 5,000) train for the
same number of steps (batches of 16 x 64 words) on ``../shared/data/ptb`` (10k words):

* Transformer-XL (recurrence, our encoding);
* Transformer-XL without recurrence (``mem_len=0`` in training);
* Transformer-XL with Shaw et al.'s clipped learned encoding (recurrence kept);
* the vanilla Transformer (absolute positions, no memory), evaluated by sliding windows as in the paper.

Reported per model: test perplexity at the training attention length ("PPL init"), the best test perplexity
over evaluation attention lengths ("PPL best") and the shortest length that reaches it ("Attn Len"), and
RECL (r = 0.1, 0.5, 1.0) of the group over the first ``--recl-tokens`` test tokens.  A recurrent model's
attention length is its evaluation ``mem_len`` with ``same_length`` (16 parallel streams over the test set); the
vanilla model's is its window, the training length.

Usage::

    python benchmarks/ptb_ablation.py [--steps 800] [--out runs/ptb_ablation] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time

import numpy as np
import torch

from longseq import DataConfig, ModelConfig, RunConfig, TrainConfig
from longseq.data.corpus import load_corpus
from longseq.eval import evaluate
from longseq.eval.recl import group_losses, recl
from longseq.eval.sliding import sliding_window_losses
from longseq.train import load_checkpoint, train

HERE = os.path.dirname(os.path.abspath(__file__))
PTB = os.path.join(HERE, "..", "..", "shared", "data", "ptb")
TGT_LEN = 64

MODELS = {
    "Transformer-XL": dict(mem_len=64),
    "no recurrence": dict(mem_len=0),
    "Shaw et al. encoding": dict(mem_len=64, pos="shaw", max_relative_distance=64),
    "vanilla (Al-Rfou et al.)": dict(mem_len=0, pos="absolute"),
}
RECURRENCE = {"Transformer-XL": True, "no recurrence": False, "Shaw et al. encoding": True}


def model_config(vocab: int, overrides: dict) -> ModelConfig:
    return ModelConfig.of(
        vocab_size=vocab, n_layer=4, d_model=128, n_head=4, d_head=32, d_inner=512, dropout=0.2, dropatt=0.0,
        cutoffs=[2000, 5000], **overrides,
    )  # fmt: skip


def test_ppl(model, corpus, attn_len: int | None, vanilla: bool, max_targets: int) -> float:
    """Test perplexity at one attention length (None: the model's training setting)."""
    if vanilla:
        losses = sliding_window_losses(model, corpus.test, context=attn_len or TGT_LEN, batch_size=64)
        return math.exp(float(np.mean(losses[:max_targets] if max_targets else losses)))
    if attn_len is None:
        metrics = evaluate(model, corpus.test, batch_size=16, tgt_len=TGT_LEN)
    else:
        metrics = evaluate(model, corpus.test, batch_size=16, tgt_len=TGT_LEN, mem_len=attn_len, same_length=True)
    return metrics["ppl"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--out", default=os.path.join("runs", "ptb_ablation"))
    parser.add_argument("--attn-lens", type=int, nargs="+", default=[64, 128, 256, 512])
    parser.add_argument("--recl-contexts", type=int, nargs="+", default=[16, 32, 64, 128, 256])
    parser.add_argument("--recl-tokens", type=int, default=3000)
    parser.add_argument("--only", help="comma-separated model names")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    corpus = load_corpus(PTB, "word")
    names = args.only.split(",") if args.only else list(MODELS)
    start = time.perf_counter()
    rows, trained = [], {}
    for i, name in enumerate(names):
        out = os.path.join(args.out, f"m{i}")
        cfg = model_config(corpus.tokenizer.vocab_size, MODELS[name])
        run = RunConfig(
            model=cfg,
            data=DataConfig(tokenizer="word", tgt_len=TGT_LEN, batch_size=16, eval_tgt_len=TGT_LEN, eval_batch_size=16),
            train=TrainConfig(max_steps=args.steps, lr=1e-3, min_lr=1e-5, warmup_steps=100, eval_interval=args.steps,
                              eval_max_segments=40, log_interval=50, seed=1111),
        )  # fmt: skip
        began = time.perf_counter()
        result = train(run, out, corpus=corpus, progress=False)
        train_s = time.perf_counter() - began
        model, _, run, _ = load_checkpoint(os.path.join(out, "last"))
        vanilla = cfg.positions.pos == "absolute"
        init = test_ppl(model, corpus, None, vanilla, 0)
        by_len = {TGT_LEN: init} if vanilla else {}  # absolute positions beyond the training length are untrained
        for attn_len in args.attn_lens if not vanilla else []:
            by_len[attn_len] = test_ppl(model, corpus, attn_len, vanilla, 0)
        best_len = min(by_len, key=lambda n: (round(by_len[n], 2), n))
        rows.append(
            {
                "model": name,
                "recurrence": RECURRENCE.get(name, False),
                "encoding": {"sinusoidal": "ours", "shaw": "Shaw et al.", "absolute": "absolute"}[cfg.positions.pos],
                "params": model.num_parameters(),
                "train_s": train_s,
                "train_tokens_per_s": result.tokens_per_s,
                "ppl_init": init,
                "ppl_by_attn_len": by_len,
                "ppl_best": by_len[best_len],
                "attn_len": best_len,
            }
        )
        trained[name] = (model, run)
        if not args.json:
            print(json.dumps(rows[-1]), flush=True)
    losses = group_losses(trained, corpus.test, args.recl_contexts, max_targets=args.recl_tokens)
    for r in (0.1, 0.5, 1.0):
        for row, value in zip(rows, recl(losses, r=r).values()):
            row[f"recl_r{r:g}"] = value
    meta = {"steps": args.steps, "torch": torch.__version__, "threads": torch.get_num_threads(),
            "seconds": time.perf_counter() - start, "recl_contexts": args.recl_contexts,
            "recl_tokens": args.recl_tokens}  # fmt: skip
    print(json.dumps({"meta": meta, "rows": rows}, indent=None if args.json else 1))


if __name__ == "__main__":
    main()
