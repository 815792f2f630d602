"""``longseq linearize``: replace attention layers of a trained model by linear-attention mixers initialised from
their weights, train them to give what the attention gave (attention transfer), then distil the student from its
teacher (docs/linearization.md).

    longseq linearize --teacher runs/t --mixer gla --layers 1,3 --out runs/lin
    longseq linearize --teacher runs/t --mixer gla --ratio 0.5 --select kl --out runs/lin \\
        --transfer-steps 300 --distill-steps 600 --set lr=1e-3 --distill-set alpha=1 lr=3e-4

OUT/transfer (stage 1, a run), OUT/layer-kl.json (with --select kl), OUT/student (the student after stage 1, a
checkpoint), OUT/distill (stage 2, a run; its best/ is the result).  --resume continues whichever stage stopped."""

from __future__ import annotations

import argparse

from longseq.cli.common import common_flags, overrides, say


def layer_list(text: str) -> list[int]:
    """An argparse type: comma-separated layer indices such as ``1,3``."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated layer indices such as 1,3, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError(f"expected at least one layer index, got {text!r}")
    return values


def add_parser(sub) -> argparse.ArgumentParser:
    from longseq.tasks.linearize import LINEARIZABLE

    p = sub.add_parser(
        "linearize",
        help="replace attention layers of a checkpoint by linear-attention mixers (transfer, then distillation)",
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--teacher", required=True, metavar="CHECKPOINT", help="the trained model (or its run directory)")
    p.add_argument(
        "--mixer", default="gla", choices=LINEARIZABLE, help="the mixer in place of attention (default: gla)"
    )
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--layers", type=layer_list, help="the attention layers to replace, e.g. 1,3")
    which.add_argument("--count", type=int, help="replace this many attention layers, chosen by --select")
    which.add_argument("--ratio", type=float, help="replace this fraction (0, 1] of the attention layers, by --select")
    p.add_argument(
        "--select",
        choices=("kl", "spread"),
        default="kl",
        help="with --count/--ratio: kl (transfer every layer, replace those whose replacement alone costs least KL "
        "on the validation text) or spread (the last of each of count equal groups, transferred alone) "
        "(default: kl)",
    )
    p.add_argument("--transfer-steps", type=int, default=200, help="stage 1 steps (default: 200)")
    p.add_argument("--distill-steps", type=int, default=200, help="stage 2 steps; 0 skips it (default: 200)")
    p.add_argument(
        "--distill-train",
        choices=("all", "layers"),
        default="all",
        help="stage 2 trains every parameter, or the replaced layers only (default: all)",
    )
    p.add_argument("--set", nargs="+", action="append", metavar="KEY=VALUE", help="a run config key, both stages")
    p.add_argument("--transfer-set", nargs="+", action="append", metavar="KEY=VALUE",
                   help="a run config key of stage 1 only (its task's: step_segments)")  # fmt: skip
    p.add_argument("--distill-set", nargs="+", action="append", metavar="KEY=VALUE",
                   help="a run config key of stage 2 only (its task's: alpha temperature top_k cache)")  # fmt: skip
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--resume", action="store_true", help="continue the stage that stopped")
    p.add_argument("--overwrite", action="store_true", help="start every stage over")
    return common_flags(p)


def run(args: argparse.Namespace) -> dict:
    from longseq.api import linearize

    return linearize(
        args.teacher,
        args.out,
        args.mixer,
        layers=args.layers,
        count=args.count,
        ratio=args.ratio,
        select=args.select,
        transfer_steps=args.transfer_steps,
        distill_steps=args.distill_steps,
        distill_trains=args.distill_train,
        settings=overrides(args.set),
        transfer_settings=overrides(args.transfer_set),
        distill_settings=overrides(args.distill_set),
        resume=args.resume,
        overwrite=args.overwrite,
        progress=not args.quiet,
        log=say,
    )
