"""Relative-attention kernels side by side: forward + backward time per call, as ratios.

Compares, in one process and on the same inputs:

* ``rel_shift``: longseq's default kernel (strided-view rel-shift, no pad, no copy);
* ``pad_shift``: the same attention with the original Transformer-XL rel-shift (zero-pad a column,
  reshape, drop a row, reshape back), written here as the peer;
* ``reference``: longseq's readable kernel that gathers R for every (i, j) pair.

Usage::

    python benchmarks/speed/attention_kernels.py [--lengths 128:128 512:512] [--repeats 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import time

import torch
import torch.nn.functional as F

from longseq.model.attention import ATTENTION_KERNELS, causal_mask


def pad_shift_attention(query, key, value, rel_key, r_w_bias, r_r_bias, mask, dropatt, training):
    """The original code's rel-shift, on a (B, H, T, K) layout (rel_key has K rows here)."""
    scale = 1.0 / math.sqrt(query.size(-1))
    content = torch.matmul((query + r_w_bias[:, None]) * scale, key.transpose(-1, -2))
    position = torch.matmul((query + r_r_bias[:, None]) * scale, rel_key[:, 1:].transpose(-1, -2))  # (B, H, T, K)
    b, h, t, k = position.shape
    padded = torch.cat([position.new_zeros(b, h, t, 1), position], dim=-1)  # (B, H, T, K+1)
    position = padded.view(b, h, k + 1, t)[:, :, 1:].reshape(b, h, t, k)
    scores = (content + position).masked_fill(mask, float("-inf"))
    probs = F.dropout(torch.softmax(scores, dim=-1), p=dropatt, training=training)
    return torch.matmul(probs, value)


KERNELS = {
    "rel_shift": ATTENTION_KERNELS["rel_shift"],
    "pad_shift": pad_shift_attention,
    "reference": ATTENTION_KERNELS["reference"],
}


def time_kernel(fn, inputs, repeats: int) -> float:
    for _ in range(2):  # warm-up
        out = fn(*inputs)
        out.sum().backward()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn(*inputs)
        out.sum().backward()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", nargs="+", default=["128:128", "512:512"], help="tgt_len:mem_len pairs")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--d-head", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--skip-reference-above", type=int, default=1024, help="skip the gather kernel when T+M exceeds this"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    rows = []
    for pair in args.lengths:
        qlen, mlen = (int(x) for x in pair.split(":"))
        klen = qlen + mlen
        b, h, d = args.batch, args.heads, args.d_head

        def leaf(*shape):
            return torch.randn(*shape).requires_grad_()

        inputs = (
            leaf(b, h, qlen, d), leaf(b, h, klen, d), leaf(b, h, klen, d), leaf(h, klen + 1, d),
            leaf(h, d), leaf(h, d), causal_mask(qlen, mlen, None), 0.0, True,
        )  # fmt: skip
        row = {"tgt_len": qlen, "mem_len": mlen}
        for name, fn in KERNELS.items():
            if name == "reference" and klen > args.skip_reference_above:
                continue
            row[f"{name}_ms"] = 1000 * time_kernel(fn, inputs, args.repeats)
        row["pad_shift_over_rel_shift"] = row["pad_shift_ms"] / row["rel_shift_ms"]
        if "reference_ms" in row:
            row["reference_over_rel_shift"] = row["reference_ms"] / row["rel_shift_ms"]
        rows.append(row)
    meta = {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "machine": platform.processor() or platform.machine(),
    }
    if args.json:
        print(json.dumps({"meta": meta, "rows": rows}))
        return
    print(
        f"# {meta}; batch {args.batch}, {args.heads} heads x {args.d_head}; forward + backward, best of {args.repeats}"
    )
    for row in rows:
        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}))


if __name__ == "__main__":
    main()
