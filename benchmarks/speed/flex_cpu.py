"""FlexAttention on CPU against longseq's own kernels, for Transformer-XL attention (inference).

    python benchmarks/speed/flex_cpu.py [--threads 1] [--repeats 5] [--json]

Three ways to run the same attention, all from the library, so that the comparison is with what longseq ships:

* ``rel_shift``: what ``attn_impl=auto`` runs on CPU (the SDPA inference path for full attention, the banded kernel
  for a window);
* ``flex``: ``attn_impl=flex`` as shipped on CPU, PyTorch's uncompiled FlexAttention (dense scores);
* ``flex compiled``: the same mask_mod and score_mod through ``torch.compile(flex_attention)``, the fused CPU
  kernel one could get by compiling (static shapes: a compile per shape; the dynamic-shape CPU kernel does not
  build on this CPU).  Its block mask is built once outside the timing, as the model builds it once per forward
  for all layers; its build time is reported apart, with the compile time.

Cases, heads 8 x 32, batch 1: full causal attention of a 128-token segment over 800 memory positions (one
evaluation layer), and a 256-key window over 2,048 queries with 256 memory positions.  Outputs are checked against
the rel_shift kernel before timing; times are medians of ``--repeats`` calls, one process, side by side.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from torch.nn.attention.flex_attention import flex_attention

import longseq.model.attention.flex as flex_module
from longseq.config.model import PatternConfig
from longseq.model.attention import blocked_attention, rel_shift_attention
from longseq.model.attention.flex import flex_relative_attention
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


def median_ms(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(1000 * (time.perf_counter() - start))
    return statistics.median(times)


def case(name: str, qlen: int, mlen: int, window: int | None, repeats: int) -> dict:
    q, k, v, rel, u, w = inputs(qlen, mlen)
    pattern = AttentionPattern("window" if window else "full", PatternConfig(window=window or 256))

    def mask() -> PatternMask:  # a new forward: a new mask (and block mask)
        return PatternMask(pattern, qlen, mlen)

    def ours():
        return blocked_attention(rel_shift_attention, 64 if window else 0, q, k, v, rel, u, w, mask(), 0.0, False)

    def flex(pattern_mask=None):
        return flex_relative_attention(q, k, v, rel, u, w, pattern_mask or mask(), 0.0, False)

    row = {"case": name, "qlen": qlen, "mlen": mlen, "window": window}
    with torch.no_grad():
        reference = ours()
        row["flex_max_abs_diff"] = float((flex() - reference).abs().max())
        row["rel_shift_ms"], row["flex_ms"] = median_ms(ours, repeats), median_ms(flex, repeats)
        compiled = torch.compile(flex_attention, dynamic=False)
        shipped = flex_module._flex
        flex_module._flex = lambda q_, k_, v_, score_mod, block_mask, scale: compiled(
            q_, k_, v_, score_mod=score_mod, block_mask=block_mask, scale=scale
        )
        try:
            start = time.perf_counter()
            shared = mask()
            flex_module._block_mask(shared, 1, H, qlen, qlen + mlen, q.device)
            row["block_mask_s"] = time.perf_counter() - start
            start = time.perf_counter()
            row["compiled_max_abs_diff"] = float((flex(shared) - reference).abs().max())
            row["compile_s"] = time.perf_counter() - start
            row["flex_compiled_ms"] = median_ms(lambda: flex(shared), repeats)
        finally:
            flex_module._flex = shipped
    row["flex_over_rel_shift"] = row["flex_ms"] / row["rel_shift_ms"]
    row["compiled_over_rel_shift"] = row["flex_compiled_ms"] / row["rel_shift_ms"]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = [
        case("full, eval segment", 128, 800, None, args.repeats),
        case("window 256, long segment", 2048, 256, 256, args.repeats),
    ]
    for row in rows:
        print(json.dumps(row) if args.json else row)


if __name__ == "__main__":
    main()
