"""Speed measurements of a longseq model: training throughput, evaluation time per token, generation.

These are the functions behind ``longseq bench train|eval|generate``; ``benchmarks/speed/vs_hf.py`` runs the
same measurements on the Hugging Face TransfoXL peer in the same session, alternating, for ratios.
Inputs are random token ids: speed does not depend on their values.
"""

from __future__ import annotations

import resource
import statistics
import time

import torch

from longseq.config import ModelConfig
from longseq.model import KVMemory, Memory, TransformerXLLM
from longseq.model.block import feed_forward_kind
from longseq.model.positions import position_encoding


def bench_config(mem_len: int, **overrides) -> ModelConfig:
    """The benchmark model of the performance issue: 4 layers, d_model 256, 8 heads x 32, d_inner 1024, bytes."""
    base = dict(vocab_size=256, n_layer=4, d_model=256, n_head=8, d_head=32, d_inner=1024, dropout=0.1, dropatt=0.0)
    return ModelConfig(**{**base, **overrides, "mem_len": mem_len})


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, in MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _peak_memory(device: torch.device) -> dict:
    """Peak resident set size, and on CUDA the peak memory torch allocated on the device, in MiB."""
    peaks = {"peak_rss_mb": peak_rss_mb()}
    if device.type == "cuda":
        peaks["peak_cuda_mb"] = torch.cuda.max_memory_allocated(device) / 2**20
    return peaks


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
    """Tokens per second of full training steps (forward, backward, clipping, Adam) with memory carried, on the
    device the model's parameters are on (``autocast="bf16"`` there)."""
    torch.manual_seed(seed)
    model.train()
    device = next(model.parameters()).device
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    compile_s = 0.0
    net = model
    if compile:  # the whole model, forward and backward, in one graph (fullgraph: a graph break is an error)
        net = torch.compile(model, fullgraph=True)
        warmup = max(warmup, 4)  # graphs for no memory, a first memory, then the memory's length marked dynamic
    data = torch.randint(0, model.config.vocab_size, (batch, (steps + warmup) * tgt_len + 1), device=device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    mems = None
    start, usage = 0.0, None
    for step in range(steps + warmup):
        _sync(device)
        if step == warmup:
            start, usage = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
        begin = time.perf_counter()
        x = data[:, step * tgt_len : (step + 1) * tgt_len]
        y = data[:, step * tgt_len + 1 : (step + 1) * tgt_len + 1]
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast == "bf16"):
            out = net(x, mems, y)
        optimizer.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        optimizer.step()
        mems = out.mems.detach()  # the end of a back-propagation window (with mem_bptt, state_bptt)
        if compile and step < warmup:
            _sync(device)
            compile_s += time.perf_counter() - begin
    _sync(device)
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_SELF)
    result = {
        "tokens_per_s": steps * batch * tgt_len / elapsed,
        "step_ms": 1000 * elapsed / steps,
        "loss": float(out.loss.detach()),
        # what the timed steps cost the process in CPU time (all threads), in system time and in page faults
        "cpu_s_per_step": (after.ru_utime + after.ru_stime - usage.ru_utime - usage.ru_stime) / steps,
        "sys_s_per_step": (after.ru_stime - usage.ru_stime) / steps,
        "minor_faults_per_step": (after.ru_minflt - usage.ru_minflt) / steps,
    }
    result.update(_peak_memory(device))
    if compile:
        result["compile_s"] = compile_s
    return result


def model_flops_per_token(
    config: ModelConfig,
    tgt_len: int,
    mem_len: int,
    batch: int = 1,
    keys_per_query: float | None = None,
    kv_memory: bool = False,
    chunk_length: float | None = None,
    coarse_keys_per_query: float | None = None,
) -> dict:
    """Matrix-multiply FLOPs per token of one forward pass of a Transformer-XL with ``config``, a segment of
    ``tgt_len`` tokens over a memory of ``mem_len`` (2 FLOPs per multiply-add), by part, and their total.

    Counted per segment token: the query projection of the segment and the key/value projection of every position
    of [memory; segment] (the hidden-state memory is projected again each segment; ``n_kv_head`` heads), the W_R
    projection of the K + 1 relative rows (once for the ``batch`` rows of a
    segment), per (query, key) pair the
    content score, the position score (XL's and Shaw's relative keys; rotary, ALiBi, T5, absolute and no positions
    score none) and the weighted value (3 or 2 dot products of d_head), the output projection, the feed-forward (3
    matrices when gated: SwiGLU, GeGLU) and the softmax layer.  ``keys_per_query`` is the pattern's average number
    of allowed keys (default: full causal attention, mem_len + (tgt_len + 1) / 2).  With ``kv_memory`` (evaluation), the memory's
    keys and values and the W_R R table are kept from earlier segments, so only the segment is projected.  Training
    is taken as 3x the forward (the
    backward computes two products per forward one), as nanoGPT and torchtitan count; layer norms, the softmax,
    masking and the optimizer are not matrix multiplies and are left out.

    An hourglass's shortened layers count as attention layers over ``tgt_len / chunk_length`` positions a segment
    with a memory of :meth:`~longseq.config.model.ModelConfig.coarse_mem` slots (``coarse_keys_per_query``: as
    ``keys_per_query`` there), divided by ``chunk_length`` per token: ``shorten_factor`` for fixed boundaries, and
    for learned or entropy ones the mean chunk length (default: the target ``shorten_factor``).  Beside them: the
    fixed hourglass's pooling and upsampling maps (2 d_model^2 each a position), and the dynamic one's boundary
    predictor (the router's W_q and W_k, or the entropy head over the T + 1 positions it reads), its residual
    projection and the smoothing scan (:func:`hourglass_flops_per_token`)."""
    c = config
    first, end = c.hourglass.shorten_layers or (c.n_layer, c.n_layer)
    per_layer = _attention_layer_flops(c, tgt_len, mem_len, batch, keys_per_query, kv_memory)
    parts = {name: (c.n_layer - (end - first)) * flops for name, flops in per_layer.items()}
    if end > first:
        k = chunk_length or c.hourglass.shorten_factor
        coarse = _attention_layer_flops(c, tgt_len / k, c.coarse_mem(mem_len), batch, coarse_keys_per_query, kv_memory)
        for name, flops in coarse.items():
            parts[name] += (end - first) * flops / k
        parts.update(hourglass_flops_per_token(c, tgt_len, k))
    parts["softmax_layer"] = 2 * c.d_model * c.vocab_size
    return {"forward": sum(parts.values()), "train": 3 * sum(parts.values()), "parts": parts}


def _attention_layer_flops(c: ModelConfig, tgt_len: float, mem_len: int, batch: int, keys, kv_memory: bool) -> dict:
    """One attention layer's forward FLOPs per query position (see :func:`model_flops_per_token`)."""
    width, kv_width, klen = c.n_head * c.d_head, (c.n_kv_head or c.n_head) * c.d_head, tgt_len + mem_len
    keys = mem_len + (tgt_len + 1) / 2 if keys is None else keys
    projected = tgt_len if kv_memory else klen
    pair_products = 3 if position_encoding(c.positions.pos).family == "relative" else 2  # + q.r for XL's and Shaw's
    return {
        "qkv": 2 * c.d_model * (width + 2 * kv_width * projected / tgt_len),
        "r_net": 2 * c.d_model * width * (klen + 1) / (tgt_len * batch)
        if c.positions.pos == "sinusoidal" and not kv_memory
        else 0.0,
        "attention": pair_products * 2 * width * keys,
        "o_net": 2 * width * c.d_model,
        "feed_forward": (3 if feed_forward_kind(c.ff).gated else 2) * 2 * c.d_model * c.d_inner,  # W1 (and W3), W2
    }


def hourglass_flops_per_token(config: ModelConfig, tgt_len: int, chunk_length: float) -> dict:
    """An hourglass's own matrix multiplies per token, besides its shortened layers: ``pool_upsample`` (fixed:
    the linear pooling of k positions, with ``shorten_fn=linear``, and the upsampling to k vectors), or ``router``
    (learned: W_q and W_k on every position; entropy: the head's logits at the T + 1 positions it reads),
    ``residual_proj`` (learned) and ``smoothing`` (the scan of :func:`~longseq.model.boundaries.smooth` in blocks of 16
    chunks, one key channel: the intra-block scores times the values, the blocks' states and what they carry; the
    padding of a segment's last block left out)."""
    from longseq.model.boundaries import SMOOTH_CHUNK

    h, d = config.hourglass, config.d_model
    if not h.dynamic:
        return {"pool_upsample": 2 * d * d * (2 if h.shorten_fn == "linear" else 1)}
    if h.boundaries == "learned":
        router = 2 * 2 * d * d
    else:
        router = 2 * d * config.vocab_size * (tgt_len + 1) / tgt_len
    block = SMOOTH_CHUNK  # per chunk: q k^T (1 channel) and scores v inside the block, a state written and read
    smoothing = 2 * (block + block * d + 2 * d) / chunk_length
    residual = 2 * d * d if h.residual_proj and h.boundaries == "learned" else 0.0  # learned chunks only
    return {"router": router, "residual_proj": residual, "smoothing": smoothing}


def matmul_flops_per_s(
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    seconds: float = 1.0,
    clock=time.perf_counter,
):
    """The matrix-multiply throughput of this machine, now: FLOP/s of square products (1024 on CPU, 8192 on GPU)
    repeated for about ``seconds``, the best of three rounds (the denominator of model FLOPs utilisation).  ``clock``
    times them (``time.process_time``: per second of this process's CPU time, for a one-thread probe on a machine
    shared with other work)."""
    device = torch.device(device)
    n = 8192 if device.type == "cuda" else 1024
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    torch.matmul(a, b)  # warm-up
    _sync(device)
    start = clock()
    reps = 1
    while True:  # calibrate: enough products for a third of the time
        torch.matmul(a, b)
        _sync(device)
        if clock() - start > seconds / 6:
            break
        reps += 1
    best = 0.0
    for _ in range(3):
        begin = clock()
        for _ in range(reps):
            torch.matmul(a, b)
        _sync(device)
        best = max(best, reps * 2 * n**3 / (clock() - begin))
    return best


def keys_per_query(config: ModelConfig, tgt_len: int, mem_len: int) -> float:
    """The mean number of keys a query attends to under the config's attention patterns (averaged over its
    attention layers; global tokens aside): a window of 256 over 32k tokens reads 256 keys, not 16k."""
    from longseq.model.attention.patterns import layer_patterns

    klen = tgt_len + mem_len
    used = [p for p, mixer in zip(layer_patterns(config), config.layer_mixers) if mixer == "attention"]
    if not used:
        return 0.0
    return sum(p.allowed_pairs(tgt_len, klen) for p in used) / (len(used) * tgt_len)


def mfu(config: ModelConfig, tokens_per_s: float, tgt_len: int, mem_len: int, batch: int, peak: float, training: bool):
    """Model FLOPs utilisation: the model's matrix-multiply FLOPs per token times tokens per second, over ``peak``
    (the measured :func:`matmul_flops_per_s`); evaluation counts a key/value memory.  Attention counts the pairs the
    patterns allow (:func:`keys_per_query`): a sparse pattern is not credited with full attention's FLOPs."""
    keys = keys_per_query(config, tgt_len, mem_len)
    flops = model_flops_per_token(config, tgt_len, mem_len, batch, keys_per_query=keys, kv_memory=not training)
    per_token = flops["train" if training else "forward"]
    return {"model_flops_per_token": per_token, "matmul_flops_per_s": peak, "mfu": per_token * tokens_per_s / peak}


@torch.no_grad()
def eval_per_token(model: TransformerXLLM, *, batch: int, tgt_len: int, mem_len: int, segments: int = 3) -> dict:
    """Milliseconds per token of evaluation once the memory holds ``mem_len`` positions (a key/value memory), on
    the device the model's parameters are on."""
    model.eval()
    device = next(model.parameters()).device
    fill = -(-mem_len // tgt_len)
    recurrence = model.config.recurrence(mem_len=mem_len)
    data = torch.randint(0, model.config.vocab_size, (batch, (fill + segments) * tgt_len + 1), device=device)
    mems = Memory.empty(KVMemory)
    start = 0.0
    for s in range(fill + segments):
        if s == fill:
            _sync(device)
            start = time.perf_counter()
        x = data[:, s * tgt_len : (s + 1) * tgt_len]
        mems = model(x, mems, data[:, s * tgt_len + 1 : (s + 1) * tgt_len + 1], recurrence=recurrence).mems
    _sync(device)
    elapsed = time.perf_counter() - start
    ms = 1000 * elapsed / (segments * batch * tgt_len)
    return {"ms_per_token": ms, "tokens_per_s": 1000 / ms, **_peak_memory(device)}


def generate_speed(
    model: TransformerXLLM, *, prompt_len: int, new_tokens: int, mem_len: int, segment_len: int = 128
) -> dict:
    """New tokens per second of greedy generation, prompt reading included."""
    from longseq.generation import generate

    prompt = torch.randint(0, model.config.vocab_size, (1, prompt_len))
    start = time.perf_counter()
    recurrence = model.config.recurrence(mem_len=mem_len)
    generate(model, prompt, new_tokens, temperature=0, recurrence=recurrence, segment_len=segment_len)
    elapsed = time.perf_counter() - start
    return {"tokens_per_s": new_tokens / elapsed, "seconds": elapsed, "peak_rss_mb": peak_rss_mb()}


@torch.no_grad()
def vanilla_ms_per_token(model: TransformerXLLM, *, attn_len: int, windows: int = 2) -> float:
    """Milliseconds per predicted token of the vanilla Transformer's evaluation (Al-Rfou et al., 2018): each
    prediction reads a fresh window of ``attn_len`` tokens, recomputed from scratch; only its last position
    goes through the softmax."""
    model.eval()
    data = torch.randint(0, model.config.vocab_size, (1, attn_len + windows))
    alone = model.config.recurrence(mem_len=0)  # every window from an empty memory
    model.next_token_scores(data[:, :attn_len], None, recurrence=alone)  # warm-up
    start = time.perf_counter()
    for w in range(windows):
        model.next_token_scores(data[:, w + 1 : w + 1 + attn_len], None, recurrence=alone)
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
