"""``longseq recall``: a recall task's accuracy against distance and length, each sequence read segment by segment
with the memory carried (:func:`longseq.eval.recall.recall_grid`).

    longseq recall runs/passkey --distances 16,64,256,1024 --json
    longseq recall runs/induction --lengths 256,4096,65536 --n 32 --out induction.json --plot induction.png
"""

from __future__ import annotations

import argparse

from longseq.cli.common import common_flags, device_flag, memory_lengths


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "recall",
        help="a recall task's accuracy against distance and sequence length",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("checkpoint", help="a checkpoint (or run directory: its best/) of a recall task")
    p.add_argument("--distances", type=memory_lengths, help="passkey: distances from the key to the query, e.g. 16,64")
    p.add_argument("--lengths", type=memory_lengths, help="sequence lengths in tokens, e.g. 256,4096,65536")
    p.add_argument("--n", type=int, default=64, help="sequences a cell (default %(default)s)")
    p.add_argument("--batch-size", type=int, default=64, help="sequences read at once (default %(default)s)")
    p.add_argument("--segment-len", type=int, help="the segment read at a time (default: the task's)")
    p.add_argument("--seed", type=int, default=0, help="the evaluation stream (default %(default)s)")
    p.add_argument("--out", help="also write the result to this JSON file")
    p.add_argument("--plot", metavar="FILE.png", help="also draw the accuracy as a heat map (one row: this model)")
    device_flag(p)
    return common_flags(p)


def run(args: argparse.Namespace) -> dict:
    import json

    from longseq.cli.common import load_model
    from longseq.config import ConfigError
    from longseq.config.run import RECALL_TASKS
    from longseq.eval.recall import recall_grid

    check_outputs(args)  # before minutes of work
    path, model, _, run_config = load_model(args.checkpoint, args.device)
    if run_config.task is None or run_config.task.name not in RECALL_TASKS:
        raise ConfigError(f"{path} is not a recall task's checkpoint (passkey, mqar, copying, induction)")
    if args.n < 1 or args.batch_size < 1:
        raise ConfigError(f"--n and --batch-size must be >= 1, got {args.n} and {args.batch_size}")
    segment = args.segment_len or run_config.task.segment_len or run_config.data.tgt_len
    result = recall_grid(
        model.lm,
        run_config.task,
        segment,
        distances=args.distances,
        lengths=args.lengths,
        n=args.n,
        batch_size=args.batch_size,
        seed=args.seed,
        progress=not args.quiet,
    )
    result["checkpoint"] = path
    if args.out:
        check_outputs(args)
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
    if args.plot:
        from longseq.diagnostics.plots import plot_recall_heatmap

        result["plot"] = plot_recall_heatmap({model_label(path, run_config.model): [result]}, args.plot)
    return result


def model_label(path: str, model) -> str:
    """The heat map's name of a checkpoint's row: where it is and what it is (its layers and memory), not the task
    (the title names it)."""
    import os

    where = os.path.relpath(path) if not os.path.relpath(path).startswith("..") else path
    layers = "+".join(dict.fromkeys(model.layer_mixers))
    return f"{where}\n{model.n_layer} x {layers}, mem_len {model.memory.mem_len}"


RECALL_REPORT = ("task", "cells", "checkpoint")  # the keys of what --out writes: a file holding them is recall's own


def check_outputs(args: argparse.Namespace) -> None:
    """``--out`` and ``--plot`` may receive the result: new files, or this command's earlier ones."""
    from longseq.diagnostics.plots import check_figure
    from longseq.outputs import check_output_file, json_object_with

    if args.out:
        check_output_file(args.out, "--out", "recall report (JSON)", json_object_with(*RECALL_REPORT))
    if args.plot:
        check_figure(args.plot, "--plot")
