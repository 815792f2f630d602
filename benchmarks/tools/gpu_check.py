"""One prepared GPU check: everything the CPU sessions could not verify, in one run that writes one JSON file.

    python benchmarks/tools/gpu_check.py                       # on the GPU: under 8 minutes
    python benchmarks/tools/gpu_check.py --device cpu --quick  # the same sections at toy sizes, to check the script

It writes its JSON to ``--out`` (default: ``$OUT/gpu_check.json`` when the environment names an output folder
``OUT``, as a machine whose working tree is discarded does; else ``gpu_check.json`` here), and prints the whole JSON
at the end, so that a log alone keeps the figures.

Self-contained: it needs torch, transformers (for the HF section only) and this repository; it installs nothing and
uses no network.  Every section runs in try/except and records its error in the JSON instead of stopping, the file
is rewritten after each section (a killed run keeps what it had), and a time budget (``--budget-s``, default 470 s)
skips what would not fit.  Sections:

* ``env``: torch, device, FlexAttention, allocator, the float32 matmul precision every section runs at (``highest``:
  a section that builds a Trainer, which sets ``high``, has it put back after).
* ``flex_vs_reference``: attn_impl=flex (compiled on CUDA) and the sparse kernels of rel_shift against the dense
  reference in float64 on the same device, every pattern, with and without memory, fp32 and bf16: the largest
  error of the output and of every gradient, relative to the reference's largest value.
* ``recompiles``: graphs dynamo compiled for ``flex_attention`` itself over five (segment, memory) lengths (its cache
  entries; expected: none after the second length, the first segment without memory and the first with it),
  ``create_block_mask``'s counted apart.
* ``train_speed``: the benchmark model (4 layers, d_model 256, 8 heads) at 2k, 8k and 32k tokens (mem_len 256,
  batch 1) for full, window and block_sparse, attn_impl=auto and rel_shift: tokens/s, peak CUDA memory, MFU
  against a matmul probe of the same run (attention FLOPs of the pairs the pattern allows, not full attention's).
* ``bf16_vs_fp32``: the same training step in bf16 autocast and fp32: throughput ratio and loss difference.
* ``hf_ratio``: longseq against Hugging Face TransfoXL, same weights, training at tgt_len/mem_len 512/512, batch 8
  (skipped with transformers 5, which has no TransfoXL: ``benchmarks/speed/vs_hf.py`` installs 4.46.3 itself).
* ``ddp_smoke``: one-process DDP (NCCL on CUDA, gloo on CPU): the loss and gradients equal the plain model's.
* ``exact_resume``: a run stopped and resumed on the device gives the uninterrupted run's losses bit for bit.
* ``host_syncs``: synchronising CUDA calls in a training forward and backward (``torch.cuda.set_sync_debug_mode``),
  every pattern and mixer kind, counted on the second step (the first compiles Flex, which synchronises; expected: 0).
* ``compiled_speed``: the benchmark model's training step eager and under ``torch.compile`` (inductor, fullgraph).
* ``torchrun``: DDP and FSDP under torchrun (NCCL, one process per GPU, 2; gloo on the CPU): stopped halfway and
  resumed, bit for bit with dropout (each rank's own RNG); skipped on one GPU, where no process group forms.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import math
import os
import sys
import tempfile
import time
import traceback

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))  # this repository, when not installed
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "speed"))  # peers.py

PATTERNS = {
    "full": {},
    "window": dict(window=48),
    "dilated": dict(window=16, dilation=(1, 2, 3, 1)),
    "strided": dict(window=16, stride=24),
    "block_sparse": dict(block_size=32, block_summary=2),
    "global": dict(window=16, num_global=2),
    "bigbird": dict(window=16, block_size=32, num_random_blocks=2, num_global=1),
}
BENCH = {"full": dict(attention=["full"]), "window": dict(attention=["window"], window=256),
         "block_sparse": dict(attention=["block_sparse"], block_size=128, block_summary=8)}  # fmt: skip


class Budget:
    def __init__(self, seconds: float) -> None:
        self.end = time.perf_counter() + seconds

    def left(self) -> float:
        return self.end - time.perf_counter()


def section_env(args, budget) -> dict:
    from longseq.model.attention.flex import flex_available
    from longseq.runtime import allocator

    info = {"torch": torch.__version__, "device": args.device, "flex_available": flex_available(),
            "allocator": allocator(), "threads": torch.get_num_threads(),
            "float32_matmul_precision": torch.get_float32_matmul_precision()}  # fmt: skip
    if args.device.startswith("cuda"):
        info.update(name=torch.cuda.get_device_name(), capability=list(torch.cuda.get_device_capability()))
        info["cuda"] = torch.version.cuda
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:
        info["transformers"] = None
    return info


def _layer(kernel: str, chunk: int, d_model: int, heads: int, d_head: int, dtype, device):
    from longseq.model.attention import RelativeMultiHeadAttention

    torch.manual_seed(0)
    layer = RelativeMultiHeadAttention(d_model, heads, d_head, kernel=kernel, chunk=chunk)
    return layer.to(device=device, dtype=dtype)


def _attention_case(kernel: str, name: str, qlen: int, mlen: int, dtype, device, heads: int = 4, d_head: int = 16):
    """Output and gradients (inputs, u, v, parameters) of one attention layer on ``device``."""
    from longseq.config.model import PatternConfig
    from longseq.model.attention.patterns import AttentionPattern, PatternMask, global_keys
    from longseq.model.memory import HiddenContext
    from longseq.model.positions import RelativePositions, relative_distances, sinusoidal_embedding

    d_model = heads * d_head
    layer = _layer(kernel, 32, d_model, heads, d_head, dtype, device)
    pattern = AttentionPattern(name, PatternConfig(**PATTERNS[name]))
    num_global = pattern.config.num_global
    g = torch.Generator(device="cpu").manual_seed(1)
    leaves = [torch.randn(2, n, d_model, generator=g) for n in (qlen, mlen)]
    leaves += [torch.randn(heads, d_head, generator=g) for _ in range(2)]
    hidden, memory, u, v = (t.to(device=device, dtype=dtype).requires_grad_() for t in leaves)
    distances = relative_distances(qlen + mlen, -1, device)
    pos_emb = sinusoidal_embedding(distances, d_model, torch.float64).to(dtype)
    flags = global_keys(None, num_global, 2, qlen, mlen, device) if pattern.has_global else None
    mask = PatternMask(pattern, qlen, mlen, global_keys=flags, device=device)
    if kernel == "reference":
        mask = mask.forbidden()
    out, _, _ = layer(
        hidden, RelativePositions(distances, pos_emb, dtype), u, v, mask, HiddenContext(memory if mlen else None)
    )
    weights = torch.randn(out.shape, generator=g).to(device=device, dtype=dtype)
    wrt = [hidden, u, v, *layer.parameters()] + ([memory] if mlen else [])
    return out, torch.autograd.grad((out * weights).sum(), wrt, allow_unused=True)


def _relative_error(fast, slow) -> float:
    scale = max(float(slow.abs().max()), 1e-30)
    return float((fast.double() - slow.double()).abs().max()) / scale


def _flex_cases(quick: bool, mlen: int) -> list[tuple[str, int, str, torch.dtype]]:
    """(pattern, memory, kernel, dtype), most telling first: on a GPU every pattern and dtype is a compile of its
    own (10-30 s), so the budget may end the list; on CPU (uncompiled) all of them run."""
    sparse = ("strided", "block_sparse", "global", "bigbird")
    cases = [(name, mlen, "flex", torch.float32) for name in PATTERNS]
    cases += [(name, mlen, "rel_shift", torch.float32) for name in sparse]  # what auto runs for them on CUDA
    cases += [(name, mlen, "flex", torch.bfloat16) for name in ("window", "full", "block_sparse")]
    cases += [(name, 0, "flex", torch.float32) for name in ("window", "full")]
    if quick:
        cases += [(name, m, k, d) for name in PATTERNS for m in (0, mlen) for k in ("flex", "rel_shift")
                  for d in (torch.float32, torch.bfloat16) if (name, m, k, d) not in cases]  # fmt: skip
    return cases


def section_flex_vs_reference(args, budget) -> dict:
    qlen, mlen = (64, 32) if args.quick else (256, 128)
    rows, tolerance, references = [], {"float32": 1e-4, "bfloat16": 5e-2}, {}
    for name, m, kernel, dtype in _flex_cases(args.quick, mlen):
        row = {"pattern": name, "mlen": m, "kernel": kernel, "dtype": str(dtype).split(".")[-1]}
        if budget.left() < 40:
            rows.append({**row, "skipped": "time budget"})
            continue
        try:
            if (name, m) not in references:
                references[name, m] = _attention_case("reference", name, qlen, m, torch.float64, args.device)
            ref_out, ref_grads = references[name, m]
            out, grads = _attention_case(kernel, name, qlen, m, dtype, args.device)
            row["output_error"] = _relative_error(out, ref_out)
            row["grad_error"] = max(_relative_error(a, b) for a, b in zip(grads, ref_grads) if a is not None)
            row["ok"] = max(row["output_error"], row["grad_error"]) <= tolerance[row["dtype"]]
        except Exception as exc:  # noqa: BLE001 - recorded, the check goes on
            row["error"] = _error(exc)
        rows.append(row)
    done = [r for r in rows if "skipped" not in r]
    return {"qlen": qlen, "tolerance": tolerance, "all_ok": all(r.get("ok") for r in done), "rows": rows}


def _graphs_of(function) -> int:
    """The graphs dynamo holds for ``function``'s code (its cache entries): those of one compiled function only."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    return len(_debug_get_cache_entry_list(function.__code__))


def section_recompiles(args, budget) -> dict:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    lengths = [(64, 0), (64, 64), (96, 64), (128, 32), (160, 96)] if args.quick else [
        (512, 0), (512, 256), (768, 256), (1024, 128), (1280, 384)]  # fmt: skip
    torch._dynamo.reset()  # the earlier sections' Flex graphs (other patterns, dtypes) are not this count's
    flex_graphs, mask_graphs = [], []
    for qlen, mlen in lengths:
        _attention_case("flex", "window", qlen, mlen, torch.float32, args.device)
        flex_graphs.append(_graphs_of(flex_attention))
        mask_graphs.append(_graphs_of(create_block_mask))
    compiled = args.device.startswith("cuda")
    # on an H200 dynamo's unique graphs, block masks included, went 2, 3, 3, 3, 3: a graph per new length after
    # the second is a recompile
    return {"lengths": lengths, "flex_graphs_after_each": flex_graphs, "block_mask_graphs_after_each": mask_graphs,
            "compiled": compiled, "ok": flex_graphs[-1] == flex_graphs[1] or not compiled}  # fmt: skip


def _train(pattern: str, length: int, impl: str, device, steps: int, autocast=None, batch: int = 1) -> dict:
    from longseq.eval.speed import bench_config, mfu, train_throughput
    from longseq.model import TransformerXLLM

    torch.manual_seed(0)
    config = bench_config(256, attn_chunk=64, attn_impl=impl, **BENCH[pattern])
    model = TransformerXLLM(config).to(device)
    result = train_throughput(model, batch=batch, tgt_len=length, steps=steps, warmup=2, autocast=autocast)
    result.update(mfu(config, result["tokens_per_s"], length, 256, batch, _peak(device, autocast), training=True))
    return result


@functools.cache
def _peak(device: str, autocast: str | None) -> float:
    """The matmul throughput of this device, measured once per run (MFU's denominator)."""
    from longseq.eval.speed import matmul_flops_per_s

    return matmul_flops_per_s(device, torch.bfloat16 if autocast else torch.float32)


def section_train_speed(args, budget) -> dict:
    lengths = [256, 512] if args.quick else [2048, 8192, 32768]
    rows = []
    for length in lengths:
        for pattern in BENCH:
            on_flex = args.device.startswith("cuda") and pattern != "block_sparse"  # what auto chooses
            for impl in ("auto", "rel_shift") if on_flex or args.quick else ("auto",):
                if budget.left() < (20 if args.quick else 30):
                    rows.append({"pattern": pattern, "length": length, "impl": impl, "skipped": "time budget"})
                    continue
                row = {"pattern": pattern, "length": length, "impl": impl}
                row["kernel"] = "flex" if impl == "auto" and on_flex else "rel_shift"
                try:
                    row.update(_train(pattern, length, impl, args.device, steps=2))
                except Exception as exc:  # noqa: BLE001 - out of memory at 32k is an expected answer for full
                    row["error"] = _error(exc)
                _free(args.device)
                rows.append(row)
    return {"batch": 1, "mem_len": 256, "rows": rows}


def section_bf16_vs_fp32(args, budget) -> dict:
    length = 256 if args.quick else 8192
    fp32 = _train("window", length, "auto", args.device, steps=2)
    bf16 = _train("window", length, "auto", args.device, steps=2, autocast="bf16")
    return {"pattern": "window", "length": length, "fp32": fp32, "bf16": bf16,
            "speedup": bf16["tokens_per_s"] / fp32["tokens_per_s"], "loss_difference": abs(bf16["loss"] - fp32["loss"])}  # fmt: skip


def _hf_train(hf, batch: int, tgt_len: int, steps: int, device) -> float:
    """Training tokens/s of the HF TransfoXL (warm-up 2 steps), the loop of benchmarks/speed/vs_hf.py on ``device``."""
    hf.train()
    optimizer = torch.optim.Adam(hf.parameters(), lr=1e-4)
    data = torch.randint(0, 256, (batch, (steps + 2) * tgt_len), device=device)
    mems, start = None, 0.0
    for step in range(steps + 2):
        if step == 2:
            torch.cuda.synchronize() if device.startswith("cuda") else None
            start = time.perf_counter()
        x = data[:, step * tgt_len : (step + 1) * tgt_len]
        out = hf(x, mems=mems, labels=x)
        optimizer.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(hf.parameters(), 0.25)
        optimizer.step()
        mems = out.mems
    torch.cuda.synchronize() if device.startswith("cuda") else None
    return steps * batch * tgt_len / (time.perf_counter() - start)


def _transformers_major() -> int | None:
    try:
        import transformers
    except ImportError:
        return None
    return int(transformers.__version__.split(".")[0])


def section_hf_ratio(args, budget) -> dict:
    major = _transformers_major()
    if major is None or major >= 5:
        return {"skipped": f"HF TransfoXL needs transformers 4.x (this has {major or 'none'}); "
                "benchmarks/speed/vs_hf.py installs 4.46.3 itself"}  # fmt: skip
    from peers import hf_twin

    from longseq.eval.speed import bench_config, train_throughput
    from longseq.model import TransformerXLLM

    tgt_len = mem_len = 64 if args.quick else 512
    batch, steps = (2, 2) if args.quick else (8, 5)
    torch.manual_seed(0)
    ours = TransformerXLLM(bench_config(mem_len))
    hf = hf_twin(ours).to(args.device)
    hf.reset_memory_length(mem_len)
    ours = ours.to(args.device)
    longseq_tps = train_throughput(ours, batch=batch, tgt_len=tgt_len, steps=steps, warmup=2)["tokens_per_s"]
    hf_tps = _hf_train(hf, batch, tgt_len, steps, args.device)
    return {"tgt_len": tgt_len, "mem_len": mem_len, "batch": batch, "longseq_tokens_per_s": longseq_tps,
            "hf_tokens_per_s": hf_tps, "speedup": longseq_tps / hf_tps}  # fmt: skip


def section_ddp_smoke(args, budget) -> dict:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from longseq.eval.speed import bench_config
    from longseq.model import TransformerXLLM

    backend = "nccl" if args.device.startswith("cuda") else "gloo"
    path = os.path.join(tempfile.mkdtemp(), "rendezvous")
    dist.init_process_group(backend, init_method=f"file://{path}", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        plain = TransformerXLLM(bench_config(32, n_layer=2, dropout=0.0)).to(args.device)
        wrapped = TransformerXLLM(bench_config(32, n_layer=2, dropout=0.0)).to(args.device)
        wrapped.load_state_dict(plain.state_dict())
        ids = [0] if args.device.startswith("cuda") else None
        ddp = DistributedDataParallel(wrapped, device_ids=ids)
        x = torch.randint(0, 256, (2, 65), device=args.device)
        losses = []
        for model in (plain, ddp):
            out = model(x[:, :64], None, x[:, 1:])
            out.loss.backward()
            losses.append(float(out.loss))
        grad_diff = max(float((p.grad - q.grad).abs().max()) for p, q in zip(plain.parameters(), wrapped.parameters()))
    finally:
        dist.destroy_process_group()
    return {"backend": backend, "losses": losses, "max_grad_difference": grad_diff,
            "ok": losses[0] == losses[1] and grad_diff < 1e-6}  # fmt: skip


def section_exact_resume(args, budget) -> dict:
    from longseq.api import train
    from longseq.config import DataConfig, ModelConfig, RunConfig, TrainConfig
    from longseq.data.corpus import Corpus
    from longseq.data.tokenizers import CharTokenizer

    words = ["abc", "defg", "hh", "gfe", "cab\n"]
    g = torch.Generator().manual_seed(0)
    text = " ".join(words[int(i)] for i in torch.randint(0, len(words), (2000,), generator=g))[:6000]
    tokenizer = CharTokenizer.build(text)
    ids = tokenizer.encode(text)
    corpus = Corpus(ids[:5000], ids[5000:5500], ids[5500:], tokenizer, "generated")

    def run_config():
        model = ModelConfig(vocab_size=10, n_layer=2, d_model=32, n_head=2, d_head=16, d_inner=64, dropout=0.1,
                               mem_len=16, attn_impl="rel_shift")  # fmt: skip
        data = DataConfig(tgt_len=16, batch_size=4, eval_tgt_len=16, eval_batch_size=2)
        device = args.device if args.device != "cuda" else "cuda:0"
        return RunConfig(model=model, data=data, train=TrainConfig(max_steps=12, lr=3e-3, warmup_steps=3,
                                                                   eval_interval=6, log_interval=1, device=device))  # fmt: skip

    out, precision = tempfile.mkdtemp(), torch.get_float32_matmul_precision()
    try:  # the Trainer sets its matmul_precision (high: TF32) for the process: put back for the later sections
        whole = train(run_config(), os.path.join(out, "whole"), corpus=corpus, progress=False)
        first = train(run_config(), os.path.join(out, "split"), corpus=corpus, progress=False, stop_after=5)
        second = train(run_config(), os.path.join(out, "split"), corpus=corpus, progress=False, resume=True)
    finally:
        torch.set_float32_matmul_precision(precision)
    resumed = list(first.losses) + list(second.losses)
    diff = max(abs(a - b) for a, b in zip(resumed, whole.losses)) if len(resumed) == len(whole.losses) else math.inf
    return {"steps": len(whole.losses), "bit_identical": resumed == list(whole.losses), "max_loss_difference": diff}


def _torchrun(args, out: str, steps: int, parallel: str, nproc: int, *extra: str) -> tuple[int, str]:
    """``torchrun`` of a tiny language-model run with dropout on the bundled corpus; (exit code, stderr's tail)."""
    import subprocess

    settings = ["batch_size=4", "tgt_len=16", "mem_len=16", "n_layer=2", "d_model=32", "n_head=2", "d_head=16",
                "d_inner=64", "dropout=0.1", "eval_interval=1000", "eval_max_segments=2", "log_interval=1",
                "schedule=constant", "warmup_steps=0", "mem_len_start=-1", f"parallel={parallel}",
                f"max_steps={steps}", f"device={'cuda' if args.device.startswith('cuda') else 'cpu'}"]  # fmt: skip
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc), "-m",
           "longseq", "train", "--out", out, "--quiet", *extra, "--set", *settings]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(HERE)), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    return done.returncode, done.stderr[-1500:]


def _losses(run_dir: str) -> list:
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [r["loss"] for r in map(json.loads, f) if "loss" in r]


def section_torchrun(args, budget) -> dict:
    """DDP and FSDP under torchrun (NCCL on CUDA, one process per GPU, at most 2; gloo on the CPU, 2 processes):
    a run stopped halfway and resumed gives the uninterrupted run's losses bit for bit, dropout included (each
    rank its own RNG, restored on its own device)."""
    nproc = min(2, torch.cuda.device_count()) if args.device.startswith("cuda") else 2
    out, report = tempfile.mkdtemp(), {"processes": nproc}
    if nproc < 2:  # NCCL takes one GPU a rank: with one, torchrun starts one process and no group forms
        return {"skipped": "needs two GPUs: NCCL takes one a rank, and one process forms no process group"}
    for parallel in ("ddp", "fsdp"):
        if budget.left() < 30:
            report[parallel] = {"skipped": "time budget"}
            continue
        where = {name: os.path.join(out, f"{parallel}-{name}") for name in ("whole", "split")}
        codes = [_torchrun(args, where["whole"], 8, parallel, nproc), _torchrun(args, where["split"], 4, parallel, nproc),
                 _torchrun(args, where["split"], 8, parallel, nproc, "--resume")]  # fmt: skip
        failed = [tail for code, tail in codes if code != 0]
        if failed:
            report[parallel] = {"error": failed[0]}
            continue
        whole, split = _losses(where["whole"]), _losses(where["split"])
        report[parallel] = {"steps": len(whole), "bit_identical": whole == split and len(whole) == 8}
    return report


def section_host_syncs(args, budget) -> dict:
    """Synchronising CUDA calls in a training forward and backward, counted by PyTorch itself
    (``torch.cuda.set_sync_debug_mode``), for every pattern and mixer kind of the CPU test."""
    if not args.device.startswith("cuda"):
        return {"skipped": "CUDA only (tests/test_model.py counts them on the CPU)"}
    import warnings

    from longseq.config import ModelConfig
    from longseq.model import TransformerXLLM

    cases = {"full": {}, "window": {"attention": ["window"], "window": 64}, "bigbird": {"attention": ["bigbird"],
             "window": 64, "block_size": 64, "num_random_blocks": 1, "num_global": 2}, "ssm": {"mixer": ["ssm"]},
             "hybrid": {"mixer": ["ssm", "attention"]}}  # fmt: skip
    counts = {}
    for name, extra in cases.items():
        torch.manual_seed(0)
        model = TransformerXLLM(ModelConfig(vocab_size=256, n_layer=2, d_model=128, n_head=4, d_head=32,
                                            d_inner=512, mem_len=256, **extra)).to(args.device)  # fmt: skip
        ids = torch.randint(0, 256, (2, 513), device=args.device)
        memory = model(ids[:, :256]).mems
        model(ids[:, 256:512], memory, ids[:, 257:513]).loss.backward()  # the first step compiles (and synchronises)
        model.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                model(ids[:, 256:512], memory, ids[:, 257:513]).loss.backward()
            finally:
                torch.cuda.set_sync_debug_mode("default")
        counts[name] = sum("synchroniz" in str(w.message) for w in caught)
    return {"syncs_per_forward_backward": counts, "counted": "the second training step of each model"}


def section_compiled_speed(args, budget) -> dict:
    """The benchmark model's training step, eager against torch.compile (inductor, fullgraph), tokens/s."""
    from longseq.eval.speed import bench_config, train_throughput
    from longseq.model import TransformerXLLM

    tgt_len = 256 if args.quick else 512
    steps = 2 if args.quick else 10
    result = {"tgt_len": tgt_len, "mem_len": tgt_len}
    for label, compile_ in (("eager", False), ("compiled", True)):
        torch.manual_seed(0)
        model = TransformerXLLM(bench_config(tgt_len, n_layer=2 if args.quick else 4)).to(args.device)
        measured = train_throughput(model, batch=8, tgt_len=tgt_len, steps=steps, warmup=1, compile=compile_)
        result[label] = {k: measured[k] for k in ("tokens_per_s", "step_ms") if k in measured}
        result[label]["compile_s"] = measured.get("compile_s", 0.0)
        _free(args.device)
    result["speedup"] = result["compiled"]["tokens_per_s"] / result["eager"]["tokens_per_s"]
    return result


def _error(exc: BaseException) -> str:
    lines = traceback.format_exception_only(type(exc), exc)
    return "".join(lines).strip()[-2000:]


def _free(device: str) -> None:
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


SECTIONS = {
    "env": section_env,
    "flex_vs_reference": section_flex_vs_reference,
    "recompiles": section_recompiles,
    "train_speed": section_train_speed,
    "bf16_vs_fp32": section_bf16_vs_fp32,
    "hf_ratio": section_hf_ratio,
    "ddp_smoke": section_ddp_smoke,
    "exact_resume": section_exact_resume,
    "host_syncs": section_host_syncs,
    "compiled_speed": section_compiled_speed,
    "torchrun": section_torchrun,
}
DEFAULT_BUDGET_S = 470.0
# On the GPU: at most CAP seconds for a section, and RESERVE seconds kept for each section after it.
CAP = {"flex_vs_reference": 100, "train_speed": 240}
RESERVE = {"recompiles": 10, "train_speed": 60, "bf16_vs_fp32": 40, "hf_ratio": 35, "ddp_smoke": 10, "exact_resume": 25,
           "host_syncs": 20, "compiled_speed": 60, "torchrun": 120}  # fmt: skip


def reserve(name: str, device: str) -> float:
    """The seconds kept for section ``name``: none for one that will skip at once (hf_ratio with transformers 5,
    torchrun on one GPU)."""
    major = _transformers_major()
    if name == "hf_ratio" and (major is None or major >= 5):
        return 0.0
    if name == "torchrun" and device.startswith("cuda") and torch.cuda.device_count() < 2:
        return 0.0
    return RESERVE.get(name, 0)


def default_out() -> str:
    """``$OUT/gpu_check.json`` when the environment gives an output folder, else ``gpu_check.json`` here."""
    folder = os.environ.get("OUT")
    return os.path.join(folder, "gpu_check.json") if folder and os.path.isdir(folder) else "gpu_check.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true", help="toy sizes: checks the script, measures nothing")
    parser.add_argument("--out", default=default_out(), help="the JSON file (default: %(default)s)")
    parser.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S)
    parser.add_argument("--sections", nargs="+", default=list(SECTIONS), choices=list(SECTIONS))
    args = parser.parse_args()
    begin = time.perf_counter()
    report = {"command": " ".join(sys.argv), "quick": args.quick, "budget_s": args.budget_s, "sections": {}}
    for name in args.sections:
        later = sum(reserve(n, args.device) for n in args.sections[args.sections.index(name) + 1 :])
        later *= min(1.0, args.budget_s / DEFAULT_BUDGET_S)  # reserves are sized for the default budget
        left = args.budget_s - (time.perf_counter() - begin)
        budget = Budget(left if args.quick else min(CAP.get(name, left), left - later))
        start = time.perf_counter()
        if budget.left() <= 0:
            result = {"skipped": "time budget"}
        else:
            try:
                result = SECTIONS[name](args, budget)
            except Exception as exc:  # noqa: BLE001 - every section records its error and the check goes on
                result = {"error": _error(exc), "traceback": traceback.format_exc()[-4000:]}
        result["seconds"] = time.perf_counter() - start
        report["sections"][name] = result
        report["total_s"] = time.perf_counter() - begin
        with open(args.out, "w") as f:
            json.dump(report, f, indent=2, default=str)
        skipped = sum("skipped" in row for row in result.get("rows", []) if isinstance(row, dict))
        said = "error" if "error" in result else "skipped" if "skipped" in result else "done"
        said += f" ({skipped} rows skipped)" if skipped else ""
        print(f"{name}: {said} in {result['seconds']:.1f} s", flush=True)
    print(f"wrote {args.out}:\n{json.dumps(report, indent=1, default=str)}", flush=True)  # a log alone keeps it


if __name__ == "__main__":
    main()
