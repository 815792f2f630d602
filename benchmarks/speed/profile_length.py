"""Where a stack's training time per token goes as the sequence grows: one step of ``mixers.py``'s stack profiled
at two lengths, each op's self CPU time per token side by side, the ops that grew most first.

    python benchmarks/speed/profile_length.py linear 1024 32768 [--threads 2] [--rows 22]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from mixers import STACKS, build  # noqa: E402


def us_per_token(stack: str, length: int) -> dict[str, float]:
    """Each op's self CPU µs per token in one training step (forward, backward, Adam) after a warm-up step."""
    model = build(stack).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    x = torch.randint(0, 256, (1, length + 1))

    def step():
        model(x[:, :length], None, x[:, 1:]).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    ops = {e.key: e.self_cpu_time_total / length for e in prof.key_averages()}
    return {"TOTAL": sum(ops.values()), **ops}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stack", choices=list(STACKS))
    parser.add_argument("short", type=int)
    parser.add_argument("long", type=int)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", type=int, default=22)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    a, b = us_per_token(args.stack, args.short), us_per_token(args.stack, args.long)
    grown = sorted((set(a) | set(b)) - {"TOTAL"}, key=lambda k: -(b.get(k, 0) - a.get(k, 0)))
    print(f"{'op (self CPU µs a token)':50s} {args.short:>8} {args.long:>8}")
    for key in ["TOTAL", *grown[: args.rows]]:
        print(f"{key[:50]:50s} {a.get(key, 0):8.2f} {b.get(key, 0):8.2f}")


if __name__ == "__main__":
    main()
