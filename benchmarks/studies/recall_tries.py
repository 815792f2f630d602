"""Tries at the recall tasks the study did not learn (MQAR, induction heads, selective copying): one row of the
study (``recall.py``) trained with other settings (batch, learning rate, weight decay, warmup, clip, steps and any
model key), validated every ``--every`` steps; or ``--control``: an independent two-layer pre-norm GPT written
with ``torch.nn`` alone (learned absolute positions), trained on the same MQAR batches, to tell a property of the
task at this budget from one of longseq's model.  Each try writes ``--out NAME.json``: its settings and the
validation curve.

Usage::

    nice python benchmarks/studies/recall_tries.py mqar attention --name prenorm-3e-3 --steps 30000 --batch 64 \\
        --lr 3e-3 --wd 0.1 --warmup 200 --clip 1.0 --set pre_lnorm=true
    nice python benchmarks/studies/recall_tries.py mqar attention --control --name plain-gpt --steps 3000
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

import recall as study  # noqa: E402

from longseq.config import ModelConfig, RunConfig  # noqa: E402
from longseq.config.base import apply_values  # noqa: E402


def longseq_try(args, settings: list) -> list[dict]:
    """The study's row with ``settings`` applied, through the Trainer; the validation curve from metrics.jsonl."""
    from longseq.api import train

    run = study.run_config(args.task, args.variant, args.seed, args.steps)
    sections = {"model": run.model, "data": run.data, "train": run.train, "task": run.task}
    run = RunConfig(**apply_values(sections, settings))
    out = args.work or tempfile.mkdtemp()
    base = RunConfig(ModelConfig(**study.BASE_MODEL), run.data, run.train, run.task)
    train(run, out, overwrite=True, progress=False, base=base, log=lambda m: print(m, flush=True))
    with open(os.path.join(out, "metrics.jsonl"), encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    return [{"step": r["step"], "accuracy": r["valid_accuracy"], "loss": r["valid_loss"]} for r in rows
            if "valid_accuracy" in r]  # fmt: skip


def control_try(args) -> list[dict]:
    """The plain GPT on the study's MQAR batches (validation: 512 sequences of stream 99)."""
    import torch.nn.functional as F
    from torch import nn

    from longseq.data.recall import recall_batch

    class Block(nn.Module):
        def __init__(self, d: int, heads: int) -> None:
            super().__init__()
            self.n1, self.n2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.att = nn.MultiheadAttention(d, heads, batch_first=True)
            self.ff = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

        def forward(self, x, mask):
            y = self.n1(x)
            x = x + self.att(y, y, y, attn_mask=mask, need_weights=False)[0]
            return x + self.ff(self.n2(x))

    task = study.task_config(args.task)
    n = task.seq_len
    torch.manual_seed(args.seed)
    emb, pos, blocks = nn.Embedding(256, 64), nn.Embedding(n, 64), nn.ModuleList(Block(64, 2) for _ in range(2))
    head = nn.Sequential(nn.LayerNorm(64), nn.Linear(64, 256))
    model = nn.ModuleList([emb, pos, blocks, head])
    mask = torch.triu(torch.full((n, n), float("-inf")), 1)

    def logits(x):
        h = emb(x) + pos(torch.arange(n))
        for block in blocks:
            h = block(h, mask)
        return head(h)

    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.wd or 0.0)
    valid, curve = recall_batch(task, 99, 0, 512, n), []
    for step in range(1, args.steps + 1):
        batch = recall_batch(task, args.seed, step, args.batch, n)
        loss = F.cross_entropy(logits(batch.inputs).flatten(0, 1), batch.labels.flatten(), ignore_index=-100)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        opt.step()
        if step % args.every == 0:
            with torch.no_grad():
                out, keep = logits(valid.inputs), valid.labels != -100
                acc = (out.argmax(-1)[keep] == valid.labels[keep]).float().mean().item()
                nll = F.cross_entropy(out[keep], valid.labels[keep]).item()
            curve.append({"step": step, "accuracy": acc, "loss": nll})
            print(curve[-1], flush=True)
    return curve


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("task", choices=list(study.STUDIES))
    p.add_argument("variant", help="a row of the task in recall.py")
    p.add_argument("--name", required=True, help="the try's name: OUT/TASK-VARIANT-NAME.json")
    p.add_argument("--out", default=os.path.join(study.ROOT, "benchmarks", "results", "recall", "tries"))
    p.add_argument("--work", help="run directory (default: a temporary one)")
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--every", type=int, default=500, help="validate every N steps")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--wd", type=float, default=0.0)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=JSON", help="model or run keys, as --set takes")
    p.add_argument("--control", action="store_true", help="the plain torch.nn GPT instead of longseq (MQAR)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    settings = [("lr", args.lr), ("min_lr", args.lr / 10), ("weight_decay", args.wd), ("warmup_steps", args.warmup),
                ("clip", args.clip), ("eval_interval", args.every), ("batch_size", args.batch)]  # fmt: skip
    settings += [(k, json.loads(v)) for k, v in (s.split("=", 1) for s in args.set)]
    start = time.perf_counter()
    curve = control_try(args) if args.control else longseq_try(args, settings)
    record = {"task": args.task, "variant": "plain torch.nn GPT" if args.control else args.variant,
              "settings": dict(settings) | {"max_steps": args.steps, "seed": args.seed}, "curve": curve,
              "wall_s": round(time.perf_counter() - start), "command": " ".join(sys.argv)}  # fmt: skip
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"{args.task}-{args.variant}-{args.name}.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1)
    print(path)


if __name__ == "__main__":
    main()
