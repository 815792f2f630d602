"""``longseq bench``: training, evaluation and generation speed of the benchmark model on this machine.

``train`` and ``eval`` also report model FLOPs utilisation (``mfu``): the model's matrix-multiply FLOPs per token
(:func:`longseq.eval.speed.model_flops_per_token`) times tokens per second, over the matrix-multiply throughput this
command measures on the same machine in the same run (``matmul_flops_per_s``), as nanoGPT and torchtitan report it.
"""

from __future__ import annotations

import argparse

from longseq.cli.common import common_flags, device_flag


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "bench",
        help="measure training, evaluation or generation speed of the benchmark model",
        description="The model of the performance issue (4 layers, d_model 256, 8 heads x 32, d_inner 1024, bytes) "
        "on random tokens. Side-by-side comparisons with other implementations: benchmarks/speed/vs_hf.py.",
    )
    p.add_argument("task", choices=["train", "eval", "generate", "eval-speed"])
    p.add_argument(
        "--attn-len", type=int, nargs="+", default=[800, 1800, 2800, 3800], help="eval-speed attention lengths"
    )
    p.add_argument("--tgt-len", type=int, default=128, help="segment length (prompt segment length for generate)")
    p.add_argument("--mem-len", type=int, default=128)
    p.add_argument("--batch", type=int, default=8, help="parallel streams (train, eval)")
    p.add_argument("--steps", type=int, default=3, help="timed steps (train) or segments (eval)")
    p.add_argument("--rounds", type=int, default=1, help="eval-speed: alternate XL and vanilla, report medians")
    p.add_argument("--prompt-len", type=int, default=2000)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--attn-chunk", type=int, default=64, help="query block size of the attention kernel (0: none)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model (compile time reported apart)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's choice)")
    p.add_argument("--autocast", choices=["bf16"], help="train under bf16 autocast")
    p.add_argument("--no-mfu", action="store_true", help="skip the matrix-multiply probe (about 2 s) and the MFU")
    device_flag(p)
    return common_flags(p)


def run(args: argparse.Namespace) -> dict:
    import torch

    from longseq.eval import speed
    from longseq.model import TransformerXLLM

    check_arguments(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    from longseq.train.distributed import resolve_device

    device = str(resolve_device(args.device))
    if args.task == "eval-speed":
        if args.device.startswith("cuda"):
            raise ValueError("bench eval-speed compares with the vanilla Transformer on the CPU only; drop --device")
        rows = speed.eval_speed_vs_vanilla(args.attn_len, tgt_len=args.tgt_len, windows=args.steps, rounds=args.rounds)
        return {"task": "eval-speed", "tgt_len": args.tgt_len, "threads": torch.get_num_threads(), "lengths": rows}
    model = TransformerXLLM(speed.bench_config(args.mem_len, attn_chunk=args.attn_chunk)).to(device)
    if args.task != "train" and (args.compile or args.autocast):
        raise ValueError("--compile and --autocast apply to `longseq bench train` only")
    settings = {
        "task": args.task,
        "tgt_len": args.tgt_len,
        "mem_len": args.mem_len,
        "threads": torch.get_num_threads(),
        "device": device,
    }
    if args.task == "train":
        result = speed.train_throughput(
            model,
            batch=args.batch,
            tgt_len=args.tgt_len,
            steps=args.steps,
            compile=args.compile,
            autocast=args.autocast,
        )
        if args.compile:
            settings["compile"] = True
        if args.autocast:
            settings["autocast"] = args.autocast
    elif args.task == "eval":
        result = speed.eval_per_token(
            model, batch=args.batch, tgt_len=args.tgt_len, mem_len=args.mem_len, segments=args.steps
        )
    else:
        result = speed.generate_speed(
            model,
            prompt_len=args.prompt_len,
            new_tokens=args.new_tokens,
            mem_len=args.mem_len,
            segment_len=args.tgt_len,
        )
    if args.task != "generate":
        settings["batch"] = args.batch
        if not args.no_mfu:
            device = next(model.parameters()).device
            dtype = torch.bfloat16 if args.autocast == "bf16" else torch.float32
            peak = speed.matmul_flops_per_s(device, dtype)
            result.update(
                speed.mfu(
                    model.config,
                    result["tokens_per_s"],
                    args.tgt_len,
                    args.mem_len,
                    args.batch,
                    peak,
                    args.task == "train",
                )
            )
    return {**settings, **result}


def check_arguments(args: argparse.Namespace) -> None:
    """Every size in its range, before a model is built (a zero divided the timings: ZeroDivisionError)."""
    least = {
        "tgt_len": 1,
        "mem_len": 0,
        "batch": 1,
        "steps": 1,
        "rounds": 1,
        "prompt_len": 1,
        "new_tokens": 1,
        "attn_chunk": 0,
        "threads": 0,
    }
    for name, low in least.items():
        if getattr(args, name) < low:
            raise ValueError(f"--{name.replace('_', '-')} must be >= {low}, got {getattr(args, name)}")
    if any(length < 1 for length in args.attn_len):
        raise ValueError(f"--attn-len lengths must be >= 1, got {args.attn_len}")
