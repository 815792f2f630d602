"""Where a training step's time goes, against its model FLOPs utilisation (MFU).

    python benchmarks/speed/mfu_breakdown.py [--tgt-len 128 --mem-len 128 --batch 8] [--threads 2] [--json]

The step of ``longseq bench train`` (the benchmark model, memory carried, Adam and clipping): two warm-up steps,
one timed, one profiled.  MFU = model FLOPs per step / (step time x matmul throughput), with the throughput measured
by the same probe in the same process.  It is about the product of two factors:

* the share of the step spent inside matrix multiplies (``aten::mm``, ``bmm``, ``addmm``, ``baddbmm``), and
* how fast those multiplies run at the model's shapes compared with the probe's square 1,024 products
  (``matmul efficiency`` = model FLOPs / (matmul time x throughput); above 1 would mean the kernel did fewer FLOPs
  than the model counts, e.g. skipped masked blocks).

The rest of the step is listed by kind of operator (self CPU time of the profiler, summed).
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from torch.profiler import ProfilerActivity, profile

from longseq.eval.speed import bench_config, matmul_flops_per_s, model_flops_per_token
from longseq.model import TransformerXLLM

KINDS = {
    "matmul": ("aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm"),
    "softmax": ("aten::_softmax", "aten::_softmax_backward_data", "aten::_log_softmax", "aten::_log_softmax_backward_data"),
    "copies and layout": ("aten::copy_", "aten::cat", "aten::stack", "aten::constant_pad_nd", "aten::index",
                          "aten::index_select", "aten::index_add_", "aten::clone", "aten::as_strided_scatter"),
    "dropout": ("aten::bernoulli_", "aten::native_dropout", "aten::native_dropout_backward"),
    "masking and fills": ("aten::masked_fill_", "aten::fill_", "aten::zero_", "aten::zeros"),
    "layer norm": ("aten::native_layer_norm", "aten::native_layer_norm_backward"),
    "optimizer and clipping": ("aten::_foreach_", "aten::sqrt", "aten::addcmul_", "aten::addcdiv_", "aten::lerp_",
                               "aten::linalg_vector_norm", "aten::_foreach_norm"),
}  # fmt: skip


def kind_of(name: str) -> str:
    for kind, prefixes in KINDS.items():
        if any(name == p or (p.endswith("_") and name.startswith(p)) for p in prefixes):
            return kind
    return "elementwise and other"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tgt-len", type=int, default=128)
    parser.add_argument("--mem-len", type=int, default=128)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    config = bench_config(args.mem_len)
    model = TransformerXLLM(config).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    data = torch.randint(0, 256, (args.batch, 4 * args.tgt_len + 1))
    mems = None

    def step(i: int):
        nonlocal mems
        x = data[:, i * args.tgt_len : (i + 1) * args.tgt_len]
        out = model(x, mems, data[:, i * args.tgt_len + 1 : (i + 1) * args.tgt_len + 1])
        optimizer.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        optimizer.step()
        mems = out.mems

    step(0)
    step(1)
    start = time.perf_counter()
    step(2)
    wall = time.perf_counter() - start
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step(3)
    peak = matmul_flops_per_s("cpu", torch.float32)
    events = prof.key_averages()
    operators = sum(e.self_cpu_time_total for e in events) / 1e6  # seconds of operator time in the profiled step
    by_kind: dict[str, float] = {}
    for e in events:
        by_kind[kind_of(e.key)] = by_kind.get(kind_of(e.key), 0.0) + e.self_cpu_time_total / 1e6
    total = max(wall, operators)
    by_kind["outside operators (Python, autograd)"] = total - operators
    flops = model_flops_per_token(config, args.tgt_len, args.mem_len, args.batch)["train"] * args.tgt_len * args.batch
    result = {
        "step_s": wall,
        "profiled_operator_s": operators,
        "matmul_flops_per_s": peak,
        "mfu": flops / (wall * peak),
        "matmul_share": by_kind.get("matmul", 0.0) / total,
        "matmul_efficiency": flops / (by_kind.get("matmul", 0.0) * peak),
        "shares": {k: v / total for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])},
    }
    if args.json:
        print(json.dumps(result))
        return
    print(f"MFU {result['mfu']:.2f}: matmul share {result['matmul_share']:.2f}, matmul efficiency "
          f"{result['matmul_efficiency']:.2f} (probe {peak / 1e9:.1f} GFLOP/s, step {wall:.2f} s)")  # fmt: skip
    for kind, share in result["shares"].items():
        print(f"  {kind:>24}: {share:6.1%}")


if __name__ == "__main__":
    main()
