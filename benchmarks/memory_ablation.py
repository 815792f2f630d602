"""Memory compaction ablation on character-level PTB, equal training budgets.

Character PTB is built from ``../shared/data/ptb`` by Mikolov's conversion (``longseq.data.corpus.ptb_to_char``).
Every variant trains the same 4-layer model (d_model 128, 4 heads x 32, d_inner 512, tgt_len 32, batch 16)
for the same number of steps, then is evaluated on the test split.  Reported per variant: test bpc, memory
bytes per layer per stream, memory slots, effective context (tokens one layer can reach back:
mem_len + cmem_rate * cmem_len), and training and evaluation tokens/s.

Usage::

    python benchmarks/memory_ablation.py [--steps 400] [--eval-segments 200] [--only plain,int8] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import torch

from longseq import DataConfig, ModelConfig, RunConfig, TrainConfig
from longseq.data.corpus import load_ptb_char
from longseq.eval import evaluate
from longseq.train import load_checkpoint, train

HERE = os.path.dirname(os.path.abspath(__file__))
PTB = os.path.join(HERE, "..", "..", "shared", "data", "ptb")

VARIANTS = {
    "plain": dict(mem_len=64),
    "no memory": dict(mem_len=0),
    "compressive mean": dict(mem_len=32, cmem_len=16, cmem_rate=2, cmem_fn="mean"),
    "compressive max": dict(mem_len=32, cmem_len=16, cmem_rate=2, cmem_fn="max"),
    "compressive conv": dict(mem_len=32, cmem_len=16, cmem_rate=2, cmem_fn="conv"),
    "compressive linear": dict(mem_len=32, cmem_len=16, cmem_rate=2, cmem_fn="linear"),
    "8-bit": dict(mem_len=64, mem_quant="int8"),
    "pruned (attention)": dict(mem_len=64, mem_select="attention"),
    "memory tokens": dict(mem_len=64, mem_tokens=8, mem_tokens_bptt=2),
}


def memory_bytes_per_layer(model, corpus, config: ModelConfig) -> int:
    """Bytes of one layer's memory for one stream once it is full."""
    x = torch.as_tensor(corpus.valid[: 32 * 8]).view(1, -1)
    mems = None
    with torch.no_grad():
        for s in range(8):
            mems = model(x[:, s * 32 : (s + 1) * 32], mems).mems
    return mems.nbytes // config.n_layer


def run_variant(name: str, overrides: dict, corpus, steps: int, eval_segments: int, out: str) -> dict:
    model_config = ModelConfig.of(
        vocab_size=corpus.tokenizer.vocab_size, n_layer=4, d_model=128, n_head=4, d_head=32, d_inner=512,
        dropout=0.1, **overrides,
    )  # fmt: skip
    run = RunConfig(
        model=model_config,
        data=DataConfig(tokenizer="word", tgt_len=32, batch_size=16, eval_tgt_len=32, eval_batch_size=16),
        # equal token budgets: a step with memory tokens back-propagating through k segments reads k segments
        train=TrainConfig(max_steps=steps // overrides.get("mem_tokens_bptt", 1), lr=2e-3, min_lr=1e-4, warmup_steps=50, eval_interval=steps, eval_max_segments=20, log_interval=50),
    )  # fmt: skip
    result = train(run, out, corpus=corpus, progress=False)
    model, _, _, _ = load_checkpoint(os.path.join(out, "last"))
    test = evaluate(model, corpus.test, batch_size=16, tgt_len=32, max_segments=eval_segments, bits_unit="bpc")
    extra = {}
    if (
        overrides.get("mem_quant", "none") == "none"
        and not model_config.memory.compacted
        and model_config.memory.mem_len
    ):
        # the same weights evaluated with an 8-bit memory: the cost of quantization alone
        quantized = type(model)(ModelConfig.of(**{**model_config.to_dict(), "mem_quant": "int8"}))
        quantized.load_state_dict(model.state_dict())
        q = evaluate(quantized, corpus.test, batch_size=16, tgt_len=32, max_segments=eval_segments, bits_unit="bpc")
        extra["test_bpc_int8_memory_same_weights"] = q["bpc"]
    return {
        **extra,
        "variant": name,
        "test_bpc": test["bpc"],
        "memory_bytes_per_layer": memory_bytes_per_layer(model, corpus, model_config),
        "memory_slots": model_config.memory.mem_len + model_config.memory.cmem_len,
        "effective_context": model_config.memory.mem_len + model_config.memory.cmem_rate * model_config.memory.cmem_len,
        "train_tokens_per_s": result.tokens_per_s,
        "eval_tokens_per_s": test["tokens_per_s"],
        "test_tokens": test["tokens"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--eval-segments", type=int, default=200)
    parser.add_argument("--only", help="comma-separated variant names")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    corpus = load_ptb_char(PTB)
    names = args.only.split(",") if args.only else list(VARIANTS)
    rows = []
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for i, name in enumerate(names):
            row = run_variant(name, VARIANTS[name], corpus, args.steps, args.eval_segments, os.path.join(tmp, str(i)))
            rows.append(row)
            if not args.json:
                print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
    meta = {
        "steps": args.steps,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "seconds": time.perf_counter() - start,
    }
    print(json.dumps({"meta": meta, "rows": rows}) if args.json else f"# {meta}")


if __name__ == "__main__":
    main()
