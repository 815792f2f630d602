"""Memory per attention layer against length, with and without Linformer's projection (``pattern.lowrank``):
the bytes an encoder layer keeps for its backward pass (every tensor autograd saves, counted once by storage), for
a bidirectional layer over one segment of L positions.  No timing: a count that a quiet machine and a busy one give
alike.

    python benchmarks/speed/lowrank_memory.py                      # L = 512 .. 8192, k = 64
    python benchmarks/speed/lowrank_memory.py --lengths 1024 4096 --rows 128 --json

Rows: ``full`` on the readable reference kernel (it keeps the (L, L) probabilities), ``full-sdpa`` (PyTorch's fused
kernel: on a CPU it may keep less, at the same O(L^2) work), and ``lowrank`` (k rows: what it keeps grows as L k).
Bytes per position flat in L is the claim for ``lowrank``; for ``full`` they grow with L.
"""

from __future__ import annotations

import argparse
import json

import torch

from longseq import ModelConfig, TransformerXLLM

ROWS = {
    "full": dict(attn_impl="reference"),
    "full-sdpa": dict(attn_impl="sdpa"),
    "lowrank": dict(attn_impl="sdpa", lowrank_share="headwise"),
}


def saved_bytes(model: TransformerXLLM, length: int) -> int:
    """The bytes of every distinct storage autograd saves in one forward over (1, length) tokens."""
    storages: dict[int, int] = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    x = torch.randint(0, model.config.vocab_size, (1, length))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        model(x, labels=x).loss.backward()
    return sum(storages.values())


def measure(lengths: list[int], rows: int, d_model: int, n_head: int) -> list[dict]:
    """One row per kernel and length: the MiB saved for backward and the bytes per position."""
    layer = dict(vocab_size=256, n_layer=1, d_model=d_model, n_head=n_head, d_head=d_model // n_head,
                 d_inner=2 * d_model, dropout=0.0, mem_len=0, pos="rope", bidirectional=True)  # fmt: skip
    results = []
    for name, options in ROWS.items():
        for length in lengths:
            extra = dict(lowrank=rows, lowrank_len=length) if name == "lowrank" else {}
            torch.manual_seed(0)
            total = saved_bytes(TransformerXLLM(ModelConfig(**layer, **options, **extra)), length)
            results.append(
                {"row": name, "length": length, "saved_mib": total / 2**20, "bytes_per_position": total / length}
            )
    return results


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192])
    parser.add_argument("--rows", type=int, default=64, help="k, the projected rows")
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--n-head", type=int, default=4)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    results = measure(args.lengths, args.rows, args.d_model, args.n_head)
    if args.json:
        print(json.dumps(results))
        return
    print(f"{'row':<10} {'L':>6} {'saved MiB':>10} {'bytes/position':>15}")
    for r in results:
        print(f"{r['row']:<10} {r['length']:>6} {r['saved_mib']:>10.1f} {r['bytes_per_position']:>15.0f}")


if __name__ == "__main__":
    main()
