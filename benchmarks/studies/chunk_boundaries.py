"""Where does a model with learned chunks cut a text?  Trains a small byte model with ``boundaries=learned`` (or
``entropy``) on the bundled tiny-shakespeare for a few hundred steps, reads a passage of its validation text
segment by segment, and writes:

* ``boundaries.png``: the passage with each chunk on its own shade, so word and line boundaries can be compared
  with the chunks' (a chunk begins at its first byte);
* ``chunks.json``: the training run's last losses and validation bpb, the mean chunk length and its spread over
  the first ``--measure`` bytes of the validation text (8,000), how many chunk starts fall at a word start (after a
  space or newline) or a line start against those positions' share of the text, and how many bytes the coarse
  memory's ``mem_len`` chunk slots cover.

A sketch of the evidence, not the study (that compares bits per byte at equal FLOPs over seeds).  On 2 CPU cores
the default run takes a few minutes.

Usage::

    python benchmarks/studies/chunk_boundaries.py --out runs/chunks --steps 600
    python benchmarks/studies/chunk_boundaries.py --out runs/chunks-entropy --boundaries entropy
    # the settings before issue 43's tuning (H-Net's ratio loss weight, the global entropy rule, no projection)
    python benchmarks/studies/chunk_boundaries.py --out runs/before --ratio-loss 0.03 --entropy-rule global \
        --no-residual-proj
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

TREE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, TREE)  # this tree's longseq, not an installed one (a study run from another worktree)

from longseq import ModelConfig, RunConfig  # noqa: E402
from longseq.api import train  # noqa: E402
from longseq.config import DataConfig, TrainConfig  # noqa: E402
from longseq.config.model import HourglassConfig  # noqa: E402
from longseq.data.sources import bundled_corpus_path  # noqa: E402
from longseq.diagnostics.chunks import chunk_statistics, read_boundaries  # noqa: E402
from longseq.model.boundaries import BOUNDARY_PREDICTORS  # noqa: E402
from longseq.train import load_checkpoint  # noqa: E402

SHADES = ("#cfe3f7", "#f7dccf")  # alternate chunks
COLUMNS = 80


def run_config(args) -> RunConfig:
    model = ModelConfig(vocab_size=0, n_layer=4, d_model=args.d_model, n_head=4, d_head=args.d_model // 4,
                        d_inner=4 * args.d_model, dropout=0.1, mem_len=args.mem_len, shorten_layers=[1, 3],
                        shorten_factor=args.target, boundaries=args.boundaries, **own_options(args))  # fmt: skip
    data = DataConfig(tokenizer="byte", tgt_len=args.tgt_len, batch_size=16, eval_tgt_len=args.tgt_len)
    train_config = TrainConfig(max_steps=args.steps, lr=2e-3, warmup_steps=50, eval_interval=args.steps,
                               eval_max_segments=20, log_interval=50, seed=args.seed)  # fmt: skip
    return RunConfig(model=model, data=data, train=train_config)


def own_options(args) -> dict:
    """The options the chosen predictor reads (a run that sets the other's is refused: it would have no effect)."""
    if args.boundaries == "learned":
        return {"ratio_loss": args.ratio_loss, "residual_proj": not args.no_residual_proj}
    return {"entropy_rule": args.entropy_rule}


def passage(n: int) -> bytes:
    """``n`` bytes from the last 5% of the bundled corpus (its validation and test part), from a line start."""
    with open(bundled_corpus_path(), "rb") as f:
        text = f.read()
    start = text.index(b"\n", int(len(text) * 0.95)) + 1
    return text[start : start + n]


def plot(data: bytes, starts: torch.Tensor, stats: dict, path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    rows, row, col, chunk = [], 0, 0, -1
    for t, byte in enumerate(data):
        chunk += int(starts[t])
        rows.append((row, col, chr(byte) if 32 <= byte < 127 else " ", chunk))
        row, col = (row + 1, 0) if byte == 10 or col + 1 == COLUMNS else (row, col + 1)
    height = row + 1
    fig, ax = plt.subplots(figsize=(COLUMNS * 0.12, height * 0.22 + 0.8))
    for r, c, char, k in rows:
        ax.add_patch(Rectangle((c, -r - 1), 1, 1, color=SHADES[k % 2], linewidth=0))
        ax.text(c + 0.5, -r - 0.5, char, ha="center", va="center", family="monospace", fontsize=7)
    ax.set_xlim(0, COLUMNS)
    ax.set_ylim(-height, 0)
    ax.axis("off")
    ax.set_title(f"{title}: mean chunk {stats['mean_length']:.2f} bytes (std {stats['std_length']:.2f}), "
                 f"{100 * stats['at_word_start']:.0f}% of chunks begin a word", fontsize=9)  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=150)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="the run's folder (figure and JSON beside it)")
    parser.add_argument("--boundaries", default="learned", choices=sorted(BOUNDARY_PREDICTORS))
    parser.add_argument("--target", type=int, default=4, help="the target mean chunk length (shorten_factor)")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--mem-len", type=int, default=64)
    parser.add_argument("--tgt-len", type=int, default=128)
    parser.add_argument("--passage", type=int, default=800, help="bytes of validation text drawn")
    parser.add_argument("--measure", type=int, default=8000, help="bytes of validation text the statistics count")
    parser.add_argument("--seed", type=int, default=1)
    defaults = HourglassConfig()
    parser.add_argument("--ratio-loss", type=float, default=defaults.ratio_loss, help="learned: the ratio loss weight")
    parser.add_argument("--entropy-rule", default=defaults.entropy_rule, choices=["global", "relative"])
    parser.add_argument(
        "--no-residual-proj", action="store_true", help="add the block's input itself, as before the option"
    )
    args = parser.parse_args()
    result = train(run_config(args), os.path.join(args.out, "run"), overwrite=True, progress=False)
    model, _, run, _ = load_checkpoint(os.path.join(args.out, "run", "last"))
    data = passage(max(args.passage, args.measure))
    starts = read_boundaries(model, torch.tensor(list(data)), args.tgt_len)
    stats = chunk_statistics(data[: args.measure], starts[: args.measure], args.mem_len)
    stats.update(boundaries=args.boundaries, target=args.target, steps=args.steps, seed=args.seed,
                 **own_options(args),
                 valid_bpb=result.valid.get("bpb"), last_losses=result.losses[-5:],
                 passage=data[: args.passage].decode("utf-8", "replace"))  # fmt: skip
    plot(
        data[: args.passage],
        starts[: args.passage],
        stats,
        os.path.join(args.out, "boundaries.png"),
        f"boundaries={args.boundaries}",
    )
    with open(os.path.join(args.out, "chunks.json"), "w") as f:
        json.dump(stats, f, indent=1)
    print(json.dumps({k: v for k, v in stats.items() if k != "passage"}, indent=1))


if __name__ == "__main__":
    main()
