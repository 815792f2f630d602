"""``longseq plot``: training curves of several runs on one figure, against step and against wall time; and the
figures of ``longseq eval --per-position/--context-curve --plot`` and ``longseq diagnose``.

Every figure is laid out so that its labels lie inside it, names its unit on its axes (losses in nats per token,
as the JSON holds them, with bits per token on a second axis, or the other way round with ``bits``), and counts
integer quantities (steps, positions, memory lengths) with integer ticks."""

from __future__ import annotations

import math
import os

from longseq.data.tasks import iter_jsonl
from longseq.outputs import PNG_METADATA, check_output_file, is_longseq_png


def read_metrics(run_dir: str) -> list[dict]:
    """The records of ``run_dir/metrics.jsonl`` (a clear error when the file is missing or corrupt)."""
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{run_dir} is not a training run: no metrics.jsonl")
    return [record for _, record in iter_jsonl(path)]


def curves(
    records: list[dict], bits: bool, bpb: bool = False
) -> dict[str, tuple[list[float], list[float], list[float]]]:
    """(step, elapsed seconds, value) series for training and validation; loss in nats or, with ``bits``,
    in bits per token (loss / ln 2); with ``bpb`` validation's bits per UTF-8 byte only (training logs no bytes)."""
    scale = 1 / math.log(2) if bits else 1.0
    out: dict[str, tuple[list, list, list]] = {"train": ([], [], []), "valid": ([], [], [])}
    for r in records:
        if bpb:
            if "valid_bpb" in r:
                out["valid"][0].append(r["step"])
                out["valid"][1].append(r.get("elapsed_s", math.nan))
                out["valid"][2].append(r["valid_bpb"])
            continue
        key = "loss" if "loss" in r else "valid_loss" if "valid_loss" in r else None
        if key is None:
            continue
        series = out["train" if key == "loss" else "valid"]
        series[0].append(r["step"])
        series[1].append(r.get("elapsed_s", math.nan))
        series[2].append(r[key] * scale)
    return out


def tokenizer_of(run_dir: str) -> str | None:
    """The tokenizer a run's ``run.toml`` names (None when it cannot be read)."""
    from longseq.config import ConfigError, load_run_config

    try:
        return load_run_config(os.path.join(run_dir, "run.toml")).data.tokenizer
    except (ConfigError, OSError):
        return None


def plot_runs(run_dirs: list[str], out_path: str, *, bits: bool = False, bpb: bool = False) -> dict:
    """Plot training and validation loss of every run against step (left) and wall time (right); with ``bpb``,
    validation's bits per UTF-8 byte, which compares runs with different tokenizers (a loss per token does not:
    a BPE token holds several bytes).  Runs of different tokenizers drawn per token get a ``note`` saying so."""
    if not run_dirs:
        raise ValueError("plot needs at least one run directory")
    if bits and bpb:
        raise ValueError("--bits draws bits per token, --bpb bits per byte: give one of them")
    check_figure(out_path)
    records = {run_dir: read_metrics(run_dir) for run_dir in run_dirs}
    if bpb and not any("valid_bpb" in r for rs in records.values() for r in rs):
        raise ValueError("--bpb draws validation bits per byte, and none of these runs logged valid_bpb")
    plt = _pyplot()
    fig, (by_step, by_time) = plt.subplots(1, 2, figsize=(11, 4))
    summary = {}
    for run_dir in run_dirs:
        name = os.path.basename(os.path.normpath(run_dir))
        series = curves(records[run_dir], bits, bpb)
        for kind, style in (("train", "-"), ("valid", "o--")):
            steps, elapsed, values = series[kind]
            if not steps:
                continue
            line = by_step.plot(steps, values, style, label=f"{name} {kind}", markersize=3)[0]
            timed = [(t, v) for t, v in zip(elapsed, values) if not math.isnan(t)]
            if timed:
                by_time.plot(*zip(*timed), style, color=line.get_color(), label=f"{name} {kind}", markersize=3)
        summary[name] = {k: len(v[0]) for k, v in series.items()}
    by_step.set_xlabel("step")
    by_step.xaxis.set_major_locator(_integers())
    by_time.set_xlabel("wall time (s)")
    for ax in (by_step, by_time):
        if bpb:
            ax.set_ylabel("validation bits per byte")
        else:
            _loss_axes(ax, bits)
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    result = {"out": _save_figure(plt, fig, out_path), "runs": summary, "unit": "bits per byte" if bpb else _unit(bits)}
    kinds = sorted({kind for kind in map(tokenizer_of, run_dirs) if kind is not None})
    if len(kinds) > 1 and not bpb:
        result["note"] = (
            f"these runs use different tokenizers ({', '.join(kinds)}): their losses per token do not compare; "
            "--bpb draws validation bits per byte"
        )
    return result


def _unit(bits: bool) -> str:
    return "bits per token" if bits else "nats per token"


def _integers():
    from matplotlib.ticker import MaxNLocator

    return MaxNLocator(integer=True)


def _loss_axes(ax, bits: bool) -> None:
    """The y axis in the unit drawn (``bits`` per token, else nats), the other unit on a second axis at the right."""
    ln2 = math.log(2)
    ax.set_ylabel(f"loss ({_unit(bits)})")
    to_other = (lambda v: v * ln2, lambda v: v / ln2) if bits else (lambda v: v / ln2, lambda v: v * ln2)
    other = ax.secondary_yaxis("right", functions=to_other)
    other.set_ylabel(_unit(not bits))
    for axes in (ax, other):  # plain values: no "1e-5+3.406" offset above the axis, over the title
        axes.ticklabel_format(axis="y", useOffset=False)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def figure_path(out_path: str) -> str:
    """The file a figure is written to: ``out_path``, ``.png`` added to a name without an extension (as matplotlib
    does: the caller reports the file that exists)."""
    return out_path if os.path.splitext(out_path)[1] else out_path + ".png"


def check_figure(out_path: str, flag: str = "--out") -> None:
    """``out_path`` may receive a figure: new, or one longseq drew (an :class:`~longseq.outputs.OutputError`
    otherwise, before any work)."""
    check_output_file(figure_path(out_path), flag, "figure", is_longseq_png)


def save_png(fig, path: str, **kwargs) -> None:
    """``fig.savefig`` marked as longseq's (a PNG's ``Software`` chunk), so that a rerun may replace it."""
    png = os.path.splitext(path)[1].lower() == ".png"
    fig.savefig(path, metadata=PNG_METADATA if png else None, **kwargs)


def _save_figure(plt, fig, out_path: str) -> str:
    """Save and close ``fig``; returns the path written."""
    out_path = figure_path(out_path)
    try:
        check_figure(out_path)
        fig.tight_layout()
        os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
        save_png(fig, out_path, dpi=100, bbox_inches="tight")
    finally:
        plt.close(fig)
    return out_path


def plot_per_position(result: dict, out_path: str, *, bits: bool = False, title: str | None = None) -> str:
    """The result of :func:`longseq.eval.context.per_position_losses` (nats) as one figure: loss at each position
    inside the segment with the memory and with it cut to 0 (context fragmentation and its cure); drawn in nats
    per token, or bits per token with ``bits``, the other unit on the right."""
    plt = _pyplot()
    scale = 1 / math.log(2) if bits else 1.0
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    positions = result["positions"]
    ax.plot(positions, [v * scale for v in result["loss_memory"]], "-", label="with memory")
    ax.plot(positions, [v * scale for v in result["loss_no_memory"]], "--", label="memory cut to 0")
    ax.set_xlabel("position inside the segment")
    ax.xaxis.set_major_locator(_integers())
    _loss_axes(ax, bits)
    scored = f"{result.get('segments', '?')} segments per stream scored, the first {result.get('skip_segments', '?')} skipped"
    ax.set_title(title or f"loss by position ({scored})", fontsize=10)
    ax.legend()
    ax.grid(alpha=0.3)
    return _save_figure(plt, fig, out_path)


def plot_context_curve(
    result: dict, out_path: str, *, bits: bool = False, train_mem_len: int | None = None, title: str | None = None
) -> str:
    """The result of :func:`longseq.eval.context.context_curve` (nats): loss against the evaluation memory length,
    with the training memory marked (does context beyond it help?); units as :func:`plot_per_position`."""
    plt = _pyplot()
    scale = 1 / math.log(2) if bits else 1.0
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    ax.plot(result["contexts"], [v * scale for v in result["loss"]], "o-")
    if train_mem_len:
        ax.axvline(train_mem_len, color="gray", linestyle=":", label=f"training mem_len {train_mem_len}")
        ax.legend()
    ax.set_xlabel("evaluation memory (positions)" + (", same_length" if result.get("same_length") else ""))
    ax.xaxis.set_major_locator(_integers())
    _loss_axes(ax, bits)
    ax.set_title(title or "loss against evaluation memory")
    ax.grid(alpha=0.3)
    return _save_figure(plt, fig, out_path)


def plot_chunk_cuts(pieces: list[str], starts: list[bool], out_path: str, *, title: str, columns: int = 80) -> str:
    """Where a model with learned chunks cuts a text: its tokens (``pieces``, each as it reads) laid out in rows of
    ``columns`` cells, a new row after a line break, each chunk on its own shade and a red bar before every token
    that begins one (a cut, ``starts``)."""
    plt = _pyplot()
    from matplotlib.patches import Rectangle

    cells, row, col, chunk = [], 0, 0, -1
    for piece, cut in zip(pieces, starts):
        shown = "".join(c if c.isprintable() else "·" for c in piece.replace("\n", "↵")) or "·"
        if col and col + len(shown) > columns:
            row, col = row + 1, 0
        chunk += int(cut)
        cells.append((row, col, shown, chunk, cut))
        col += len(shown)
        if piece.endswith("\n"):
            row, col = row + 1, 0
    height = row + 1
    fig, ax = plt.subplots(figsize=(max(columns, 20) * 0.12, height * 0.24 + 0.9))
    for r, c, shown, k, cut in cells:
        ax.add_patch(Rectangle((c, -r - 1), len(shown), 1, color=("#cfe3f7", "#f7dccf")[k % 2], linewidth=0))
        ax.text(c + len(shown) / 2, -r - 0.5, shown, ha="center", va="center", family="monospace", fontsize=7)
        if cut:
            ax.plot([c, c], [-r - 1, -r], color="crimson", linewidth=1.2)
    ax.set_xlim(0, columns)
    ax.set_ylim(-height, 0)
    ax.axis("off")
    ax.set_title(title, fontsize=9)
    return _save_figure(plt, fig, out_path)


def recall_axis(results: dict[str, list[dict]]) -> str:
    """What the cells of ``results`` vary: ``distance`` (passkey) or ``length``."""
    return "distance" if any("distance" in c for runs in results.values() for c in runs[0]["cells"]) else "length"


def recall_table(results: dict[str, list[dict]]) -> tuple[list[str], list[int], list[list[float | None]]]:
    """Results of :func:`longseq.eval.recall.recall_grid` by model (each a list over seeds) as a table: the model
    names, the columns (distances when the cells have them, else lengths) and the mean accuracy over seeds (None
    where a model has no such cell)."""
    axis = recall_axis(results)
    columns = sorted({c[axis] for runs in results.values() for run in runs for c in run["cells"] if axis in c})
    table = []
    for runs in results.values():
        row = []
        for column in columns:
            values = [c["accuracy"] for run in runs for c in run["cells"] if c.get(axis) == column]
            row.append(sum(values) / len(values) if values else None)
        table.append(row)
    return list(results), columns, table


def plot_recall_heatmap(results: dict[str, list[dict]], out_path: str, *, title: str | None = None) -> str:
    """A heat map of recall accuracy: a row a model (named by the keys of ``results``: a checkpoint, a variant), a
    column a distance (or length), the mean over seeds written in each cell (%); a dashed line in a row marks its
    model's reach (attention: n_layer x mem_len tokens back; beyond it a key cannot be read), which the legend says;
    the colour bar reads in % with chance marked."""
    plt = _pyplot()
    from matplotlib.lines import Line2D
    from matplotlib.transforms import ScaledTranslation

    names, columns, table = recall_table(results)
    axis = recall_axis(results)
    fig, ax = plt.subplots(figsize=(2.2 + 0.62 * len(columns), 2.2 + 0.42 * len(names)))
    values = [[float("nan") if v is None else v for v in row] for row in table]
    image = ax.imshow(values, vmin=0, vmax=1, cmap="viridis", aspect="auto")
    reached = False
    for i, row in enumerate(table):
        for j, v in enumerate(row):
            if v is not None:
                ax.text(j, i, f"{100 * v:.0f}", ha="center", va="center", fontsize=7, color="w" if v < 0.6 else "k")
        reach = results[names[i]][0].get("effective_range", 0)
        if axis == "distance" and reach and any(c > reach for c in columns):
            edge = sum(c <= reach for c in columns) - 0.5
            ax.plot([edge, edge], [i - 0.5, i + 0.5], "--", color="r", linewidth=1.2)
            reached = True
    ax.set_xticks(range(len(columns)), [str(c) for c in columns], rotation=45, fontsize=8)
    ax.set_yticks(range(len(names)), names, fontsize=8)
    ax.set_xlabel(f"{axis} (tokens)")
    runs = results[names[0]][0]
    ax.set_title(title or f"{runs['task']}: accuracy (%), chance {100 * runs['chance']:.0f}%", fontsize=10)
    if reached:
        line = Line2D([], [], linestyle="--", color="r", label="the model's reach: n_layer x mem_len tokens back")
        below = ax.transAxes + ScaledTranslation(0, -0.8, fig.dpi_scale_trans)  # under the ticks and the x label
        ax.legend(handles=[line], loc="upper center", bbox_to_anchor=(0.5, 0), bbox_transform=below, fontsize=7,
                  frameon=False)  # fmt: skip
    bar = fig.colorbar(image, ax=ax, fraction=0.08, pad=0.03, label="accuracy (%); dotted: chance")
    bar.set_ticks([0, 0.25, 0.5, 0.75, 1.0], labels=["0", "25", "50", "75", "100"])
    bar.ax.axhline(runs["chance"], color="w", linestyle=":", linewidth=1.5)  # chance, on the bar's scale
    return _save_figure(plt, fig, out_path)
