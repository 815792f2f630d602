"""FlexAttention (compiled, CPU, inference) against longseq's own kernels, for Transformer-XL attention.

    python benchmarks/flex_cpu.py [--threads 1] [--json]

The relative position term enters FlexAttention as a ``score_mod`` that reads the projected position scores
(q_i + v) . W_R R_d; the pattern enters as a ``mask_mod`` and its block mask.  Two cases, heads 8 x 32, batch 1:

* full causal attention of a 128-token segment over 800 memory positions (the evaluation benchmark's layer),
  against the ``rel_shift`` kernel's inference path (PyTorch SDPA with the shifted position bias);
* a 256-key window over a 2,048-token segment with 256 memory positions, against the banded kernel.  Flex gets a
  position table of the W + 1 distances only (linear in length), as a window needs.

Outputs are checked against each other before timing.  Compile time is reported apart.
"""

from __future__ import annotations

import argparse
import json
import math
import time

import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from longseq.model.attention import blocked_attention, rel_shift_attention
from longseq.model.attention.patterns import AttentionPattern, PatternMask

H, D = 8, 32


def inputs(qlen: int, mlen: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    klen = qlen + mlen
    q, k, v = (torch.randn(1, H, n, D, generator=g) for n in (qlen, klen, klen))
    return (
        q,
        k,
        v,
        torch.randn(H, klen + 1, D, generator=g),
        torch.randn(H, D, generator=g),
        torch.randn(H, D, generator=g),
    )


def timed(fn, repeats: int) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return 1000 * (time.perf_counter() - start) / repeats


def case(name: str, qlen: int, mlen: int, window: int | None, repeats: int, flex) -> dict:
    q, k, v, rel, u, w = inputs(qlen, mlen)
    klen = qlen + mlen
    scale = 1 / math.sqrt(D)
    pattern = AttentionPattern("window" if window else "full", True, window or 256, (1,), 128, 64, 1, 0, 0, 0)
    mask = PatternMask(pattern, qlen, mlen, None, None, None, None)
    reach = window or klen  # distances a query may see: 0 .. reach - 1
    table = rel[:, klen + 1 - reach - 1 :]  # rows of distances reach .. 0  (reach + 1 rows)

    def mask_mod(b, h, i, j):
        allowed = j <= i + mlen
        return allowed & (i + mlen - j < window) if window else allowed

    def run_flex():
        position = torch.matmul((q + w[:, None]) * scale, table.transpose(-1, -2))  # (1, H, T, reach + 1)

        def score_mod(score, b, h, i, j):
            return score + position[b, h, i, torch.clamp(reach - (i + mlen - j), 0, reach)]

        block_mask = create_block_mask(mask_mod, None, None, qlen, klen, device="cpu")
        return flex(q + u[:, None], k, v, score_mod=score_mod, block_mask=block_mask)

    def run_ours():
        chunk = 64 if window else 0
        return blocked_attention(rel_shift_attention, chunk, q, k, v, rel, u, w, mask, 0.0, False)

    with torch.no_grad():
        start = time.perf_counter()
        first = run_flex()
        compile_s = time.perf_counter() - start
        error = float((first - run_ours()).abs().max())
        ours_ms, flex_ms = timed(run_ours, repeats), timed(run_flex, repeats)
    return {"case": name, "qlen": qlen, "mlen": mlen, "window": window, "max_abs_diff": error,
            "flex_compile_s": compile_s, "flex_ms": flex_ms, "longseq_ms": ours_ms, "flex_over_longseq": flex_ms / ours_ms}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    flex = torch.compile(flex_attention, dynamic=False)
    rows = [
        case("full, eval segment", 128, 800, None, args.repeats, flex),
        case("window 256, long segment", 2048, 256, 256, args.repeats, flex),
    ]
    for row in rows:
        print(json.dumps(row) if args.json else row)


if __name__ == "__main__":
    main()
