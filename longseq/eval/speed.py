"""Speed measurements of a longseq model: training throughput, evaluation time per token, generation.

These are the functions behind ``longseq bench train|eval|generate``; ``benchmarks/vs_hf.py`` runs the
same measurements on the Hugging Face TransfoXL peer in the same session, alternating, for ratios.
Inputs are random token ids: speed does not depend on their values.
"""

from __future__ import annotations

import resource
import statistics
import time

import torch

from longseq.config import ModelConfig
from longseq.model import Memory, TransformerXLLM


def bench_config(mem_len: int, **overrides) -> ModelConfig:
    """The benchmark model of the performance issue: 4 layers, d_model 256, 8 heads x 32, d_inner 1024, bytes."""
    base = dict(vocab_size=256, n_layer=4, d_model=256, n_head=8, d_head=32, d_inner=1024, dropout=0.1, dropatt=0.0)
    return ModelConfig.of(**{**base, **overrides, "mem_len": mem_len})


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, in MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def train_throughput(
    model: TransformerXLLM,
    *,
    batch: int,
    tgt_len: int,
    steps: int = 3,
    warmup: int = 1,
    seed: int = 0,
    compile: bool = False,
    autocast: str | None = None,
) -> dict:
    """Tokens per second of full training steps (forward, backward, clipping, Adam) with memory carried."""
    torch.manual_seed(seed)
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    step_fn = model
    compile_s = 0.0
    if compile:  # the decoder layers only: the input checks and the loss stay eager
        for layer in model.transformer.layers:
            layer.compile()
        warmup = max(warmup, 3)  # graphs for no memory, a growing memory and a full one
    data = torch.randint(0, model.config.vocab_size, (batch, (steps + warmup) * tgt_len + 1))
    mems = None
    start = 0.0
    for step in range(steps + warmup):
        if step == warmup:
            start = time.perf_counter()
        begin = time.perf_counter()
        x = data[:, step * tgt_len : (step + 1) * tgt_len]
        y = data[:, step * tgt_len + 1 : (step + 1) * tgt_len + 1]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast == "bf16"):
            out = step_fn(x, mems, y)
        optimizer.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        optimizer.step()
        mems = out.mems
        if compile and step < warmup:
            compile_s += time.perf_counter() - begin
    elapsed = time.perf_counter() - start
    result = {
        "tokens_per_s": steps * batch * tgt_len / elapsed,
        "step_ms": 1000 * elapsed / steps,
        "peak_rss_mb": peak_rss_mb(),
    }
    if compile:
        result["compile_s"] = compile_s
    return result


@torch.no_grad()
def eval_per_token(model: TransformerXLLM, *, batch: int, tgt_len: int, mem_len: int, segments: int = 3) -> dict:
    """Milliseconds per token of evaluation once the memory holds ``mem_len`` positions."""
    model.eval()
    fill = -(-mem_len // tgt_len)
    data = torch.randint(0, model.config.vocab_size, (batch, (fill + segments) * tgt_len + 1))
    mems = Memory.empty("kv")
    start = 0.0
    for s in range(fill + segments):
        if s == fill:
            start = time.perf_counter()
        x = data[:, s * tgt_len : (s + 1) * tgt_len]
        mems = model(x, mems, data[:, s * tgt_len + 1 : (s + 1) * tgt_len + 1], mem_len=mem_len).mems
    elapsed = time.perf_counter() - start
    return {"ms_per_token": 1000 * elapsed / (segments * batch * tgt_len), "peak_rss_mb": peak_rss_mb()}


def generate_speed(
    model: TransformerXLLM, *, prompt_len: int, new_tokens: int, mem_len: int, segment_len: int = 128
) -> dict:
    """New tokens per second of greedy generation, prompt reading included."""
    from longseq.generation import generate

    prompt = torch.randint(0, model.config.vocab_size, (1, prompt_len))
    start = time.perf_counter()
    generate(model, prompt, new_tokens, temperature=0, mem_len=mem_len, segment_len=segment_len)
    elapsed = time.perf_counter() - start
    return {"tokens_per_s": new_tokens / elapsed, "seconds": elapsed, "peak_rss_mb": peak_rss_mb()}


@torch.no_grad()
def vanilla_ms_per_token(model: TransformerXLLM, *, attn_len: int, windows: int = 2) -> float:
    """Milliseconds per predicted token of the vanilla Transformer's evaluation (Al-Rfou et al., 2018): each
    prediction reads a fresh window of ``attn_len`` tokens, recomputed from scratch; only its last position
    goes through the softmax."""
    model.eval()
    data = torch.randint(0, model.config.vocab_size, (1, attn_len + windows))
    model.next_token_scores(data[:, :attn_len], None, mem_len=0)  # warm-up
    start = time.perf_counter()
    for w in range(windows):
        model.next_token_scores(data[:, w + 1 : w + 1 + attn_len], None, mem_len=0)
    return 1000 * (time.perf_counter() - start) / windows


def eval_speed_vs_vanilla(
    attn_lens: list[int], *, tgt_len: int = 128, windows: int = 2, segments: int = 3, rounds: int = 1
) -> list:
    """Per-token evaluation time of Transformer-XL (segments of ``tgt_len``, memory of ``attn_len``) against the
    vanilla Transformer with a sliding window of ``attn_len``, same size (the benchmark model), same process.
    With ``rounds`` > 1 the two alternate that many times and the medians are reported (a shared machine is
    noisy); every round's figures are kept under ``rounds``."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    rows = []
    for attn_len in attn_lens:
        torch.manual_seed(0)
        xl = TransformerXLLM(bench_config(attn_len))
        vanilla = TransformerXLLM(bench_config(0, pos="absolute"))
        xl_times, vanilla_times = [], []
        for _ in range(rounds):
            xl_times.append(
                eval_per_token(xl, batch=1, tgt_len=tgt_len, mem_len=attn_len, segments=segments)["ms_per_token"]
            )
            vanilla_times.append(vanilla_ms_per_token(vanilla, attn_len=attn_len, windows=windows))
        xl_ms, vanilla_ms = statistics.median(xl_times), statistics.median(vanilla_times)
        row = {
            "attn_len": attn_len,
            "xl_ms_per_token": xl_ms,
            "vanilla_ms_per_token": vanilla_ms,
            "ratio": vanilla_ms / xl_ms,
        }
        if rounds > 1:
            row["rounds"] = {"xl_ms_per_token": xl_times, "vanilla_ms_per_token": vanilla_times}
        rows.append(row)
    return rows
