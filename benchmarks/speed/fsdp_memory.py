"""Per-rank memory of DDP against FSDP (``parallel=fsdp``) for one model, under torchrun on CPU (gloo).

    torchrun --standalone --nproc_per_node 2 benchmarks/speed/fsdp_memory.py --mode ddp|fsdp [--n-layer 8 --d-model 512]

Each rank builds the model, wraps it as the training loop does, runs a few AdamW steps on random tokens with
memory carried, and reports the bytes of parameters, gradients and optimizer moments it holds locally, and its
peak RSS. Run one launch per mode: peak RSS is a per-process high-water mark.
"""

from __future__ import annotations

import argparse
import json
import resource

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from longseq.eval.speed import bench_config
from longseq.model import build_model
from longseq.train.distributed import shard_model


def local_bytes(tensors) -> int:
    total = 0
    for t in tensors:
        t = t.to_local() if isinstance(t, DTensor) else t
        total += t.numel() * t.element_size()
    return total


def measure(mode: str, args) -> dict:
    torch.manual_seed(0)
    model = build_model(bench_config(args.mem_len, n_layer=args.n_layer, d_model=args.d_model,
                                     d_head=args.d_model // 8, d_inner=4 * args.d_model, dropout=0.0))  # fmt: skip
    net = model
    if mode == "fsdp":
        shard_model(model)
    else:
        net = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    data = torch.randint(0, 256, (args.batch, (args.steps + 1) * args.tgt_len + 1))
    mems = None
    for step in range(args.steps):
        x = data[:, step * args.tgt_len : (step + 1) * args.tgt_len]
        y = data[:, step * args.tgt_len + 1 : (step + 1) * args.tgt_len + 1]
        out = net(x, mems, y)
        out.loss.backward()
        optimizer.step()
        mems = out.mems
        if step < args.steps - 1:
            optimizer.zero_grad(set_to_none=True)
    params = list(model.parameters())
    moments = [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v) and v.dim()]
    return {
        "mode": mode,
        "parameters": sum(p.numel() for p in params),
        "param_mib": local_bytes(params) / 2**20,
        "grad_mib": local_bytes([p.grad for p in params if p.grad is not None]) / 2**20,
        "optimizer_mib": local_bytes(moments) / 2**20,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=["ddp", "fsdp"], required=True)
    parser.add_argument("--n-layer", type=int, default=8)
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--tgt-len", type=int, default=64)
    parser.add_argument("--mem-len", type=int, default=64)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    row = measure(args.mode, args)
    row["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if dist.get_rank() == 0:
        print(json.dumps({"world_size": dist.get_world_size(), "args": vars(args), "rank0": row}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
