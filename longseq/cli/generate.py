"""``longseq generate``: sample a continuation of a prompt with the recurrence memory."""

from __future__ import annotations

import argparse
import time

from longseq.cli.common import common_flags


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("generate", help="sample a continuation of a prompt")
    p.add_argument("--checkpoint", required=True, help="checkpoint directory")
    p.add_argument("--prompt", required=True, help="text to continue")
    p.add_argument("--max-new-tokens", type=int, default=200)
    p.add_argument("--temperature", type=float, default=1.0, help="0 for greedy decoding")
    p.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (0: all)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (1: off)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--mem-len", type=int, help="memory length while sampling (default: train mem_len + tgt_len)")
    return common_flags(p)


def run(args: argparse.Namespace) -> dict:
    import torch

    from longseq.generation import generate
    from longseq.train.checkpoint import load_checkpoint

    model, tokenizer, run, _ = load_checkpoint(args.checkpoint)
    prompt = tokenizer.encode(args.prompt)
    if len(prompt) == 0:
        raise ValueError("the prompt is empty; give at least one character or word")
    generator = torch.Generator().manual_seed(args.seed)
    mem_len = args.mem_len if args.mem_len is not None else run.model.memory.mem_len + run.data.tgt_len
    start = time.perf_counter()
    ids = generate(
        model,
        torch.as_tensor(prompt)[None],
        args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        mem_len=mem_len,
        segment_len=run.data.tgt_len,
        generator=generator,
    )
    elapsed = time.perf_counter() - start
    text = tokenizer.decode(ids[0].tolist())
    if not args.json:
        print(args.prompt + text)
        return {}
    return {
        "prompt": args.prompt,
        "text": text,
        "tokens": ids.size(1),
        "tokens_per_s": ids.size(1) / max(elapsed, 1e-9),
    }
