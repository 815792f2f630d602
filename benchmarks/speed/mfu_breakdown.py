"""Where a training step's time goes, against its model FLOPs utilisation (MFU).

    python benchmarks/speed/mfu_breakdown.py [--tgt-len 128 --mem-len 128 --batch 8] [--threads 2] [--json]
    python benchmarks/speed/mfu_breakdown.py --threads 1 --clock cpu --set pos=rope pre_lnorm=true ff=gelu

The step of ``longseq bench train`` (the benchmark model, memory carried, Adam and clipping): two warm-up steps,
one timed, one profiled.  MFU = model FLOPs per step / (step time x matmul throughput), with the throughput measured
by the same probe in the same process.  It is about the product of two factors:

* the share of the step spent inside matrix multiplies (``aten::mm``, ``bmm``, ``addmm``, ``baddbmm``, and the
  fused attention of ``scaled_dot_product_attention``, mostly products), and
* how fast those multiplies run at the model's shapes compared with the probe's square 1,024 products
  (``matmul efficiency`` = model FLOPs / (matmul time x throughput); above 1 would mean the kernel did fewer FLOPs
  than the model counts, e.g. skipped masked blocks).

The rest of the step is listed by kind of operator (self CPU time of the profiler, summed).  ``--set`` changes the
benchmark model's options (``key=value``, values read as JSON: ``pos=rope``, ``attn_chunk=128``); ``--clock cpu``
times the step and the probe in this process's CPU time instead of wall time (with ``--threads 1`` on a machine
shared with other work: the time it was not scheduled is not counted).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # this checkout

from longseq.eval.speed import bench_config, matmul_flops_per_s, model_flops_per_token  # noqa: E402
from longseq.model import TransformerXLLM  # noqa: E402

KINDS = {
    "matmul": ("aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm"),
    "fused attention": ("aten::_scaled_dot_product_flash_attention_for_cpu",
                        "aten::_scaled_dot_product_flash_attention_for_cpu_backward"),
    "softmax": ("aten::_softmax", "aten::_softmax_backward_data", "aten::_log_softmax", "aten::_log_softmax_backward_data"),
    "copies and layout": ("aten::copy_", "aten::cat", "aten::stack", "aten::constant_pad_nd", "aten::index",
                          "aten::index_select", "aten::index_add_", "aten::clone", "aten::as_strided_scatter"),
    "dropout": ("aten::bernoulli_", "aten::native_dropout", "aten::native_dropout_backward", "aten::random_",
                "aten::bitwise_and_", "aten::bitwise_right_shift", "aten::bitwise_not_"),  # block.dropout's mask
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
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="options of the benchmark model")
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    config = bench_config(args.mem_len, **dict(_option(item) for item in args.set))
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
    start = clock()
    step(2)
    wall = clock() - start
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step(3)
    peak = matmul_flops_per_s("cpu", torch.float32, clock=clock)
    events = prof.key_averages()
    operators = sum(e.self_cpu_time_total for e in events) / 1e6  # seconds of operator time in the profiled step
    by_kind: dict[str, float] = {}
    for e in events:
        by_kind[kind_of(e.key)] = by_kind.get(kind_of(e.key), 0.0) + e.self_cpu_time_total / 1e6
    total = operators  # the profiler times operators on the wall clock: CPU time is not split by operator
    if args.clock == "wall":
        total = max(wall, operators)
        by_kind["outside operators (Python, autograd)"] = total - operators
    flops = model_flops_per_token(config, args.tgt_len, args.mem_len, args.batch)["train"] * args.tgt_len * args.batch
    products = by_kind.get("matmul", 0.0) + by_kind.get("fused attention", 0.0)
    mfu = flops / (wall * peak)
    result = {
        "config": args.set,
        "clock": args.clock,
        "step_s": wall,
        "profiled_operator_s": operators,
        "matmul_flops_per_s": peak,
        "mfu": mfu,
        "matmul_share": products / total,
        "matmul_efficiency": mfu * total / products,  # model FLOPs / (the step's time in products x the probe's)
        "shares": {k: v / total for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])},
    }
    if args.json:
        print(json.dumps(result))
        return
    print(f"MFU {result['mfu']:.2f}: matmul share {result['matmul_share']:.2f}, matmul efficiency "
          f"{result['matmul_efficiency']:.2f} (probe {peak / 1e9:.1f} GFLOP/s, step {wall:.2f} s)")  # fmt: skip
    for kind, share in result["shares"].items():
        print(f"  {kind:>24}: {share:6.1%}")


def _option(item: str) -> tuple[str, object]:
    key, _, value = item.partition("=")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value  # a bare word: pos=rope


if __name__ == "__main__":
    main()
