"""Plots: ``longseq plot`` reads runs' logs and refuses a broken one; every figure of ``longseq diagnose``, ``eval --plot`` and ``longseq plot`` keeps its
labels inside the canvas, counts heads, layers, positions and steps with integer ticks, writes the value in every
heat-map cell, and names its unit; the JSON names the unit of every number (entropy in bits, losses in nats).

The figures are caught as they are saved (``Figure.savefig`` wrapped), then measured with their own renderer."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest
import torch
from matplotlib.figure import Figure

from longseq import ModelConfig
from longseq.model import TransformerXLLM


@pytest.fixture
def saved_figures(monkeypatch) -> dict[str, Figure]:
    figures: dict[str, Figure] = {}
    original = Figure.savefig

    def savefig(self, path, *args, **kwargs):
        figures[os.path.basename(str(path))] = self
        return original(self, path, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", savefig)
    return figures


def assert_inside(fig: Figure, name: str) -> None:
    """Every axes (labels, tick labels, titles, a second y axis, colour bars) and the figure title lie inside it."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(fig).get_renderer()  # the figure was closed once saved: a canvas of its own
    box = fig.bbox
    parts = [ax.get_tightbbox(renderer) for ax in fig.axes if ax.get_visible() and ax.axison]
    if fig._suptitle is not None:
        parts.append(fig._suptitle.get_window_extent(renderer))
    for part in parts:
        assert box.x0 - 1 <= part.x0 and part.x1 <= box.x1 + 1, f"{name}: {part} outside {box}"
        assert box.y0 - 1 <= part.y0 and part.y1 <= box.y1 + 1, f"{name}: {part} outside {box}"


def shown_ticks(axis, limits) -> list[float]:
    low, high = sorted(limits)
    return [t for t in axis.get_ticklocs() if low - 1e-9 <= t <= high + 1e-9]


def labels(ticks) -> list[str]:
    return [t.get_text() for t in ticks]


def diagnosed(tmp_path, saved_figures, n_layer=3, n_head=3):
    from longseq.diagnostics import diagnose

    torch.manual_seed(0)
    config = ModelConfig(vocab_size=30, n_layer=n_layer, d_model=18, n_head=n_head, d_head=6, d_inner=32,
                            dropout=0.0, mem_len=6)  # fmt: skip
    ids = np.random.default_rng(2).integers(0, 30, 400)
    report = diagnose(TransformerXLLM(config), ids, str(tmp_path), tgt_len=8, warmup=2, batch_size=2, max_segments=6,
                      contexts=[0, 6, 12])  # fmt: skip
    return report, json.loads((tmp_path / "report.json").read_text())


def test_every_diagnose_figure_keeps_its_labels_inside(tmp_path, saved_figures):
    diagnosed(tmp_path, saved_figures)
    expected = {"attention_layer0.png", "entropy.png", "memory_share.png", "distance.png", "grad_norms.png",
                "per_position.png", "context_curve.png"}  # fmt: skip
    assert expected <= set(saved_figures)
    for name, fig in saved_figures.items():
        assert_inside(fig, name)


def test_heat_maps_have_a_tick_per_head_and_layer_and_a_value_in_every_cell(tmp_path, saved_figures):
    report, saved = diagnosed(tmp_path, saved_figures)
    for name, key in (("entropy.png", "entropy_bits"), ("memory_share.png", "memory_attention")):
        values = np.array(saved[key] if key == "entropy_bits" else saved[key]["memory_share"])
        ax = saved_figures[name].axes[0]
        assert labels(ax.get_xticklabels()) == ["0", "1", "2"]  # heads, not 0.0, 0.5, 1.0 ...
        assert labels(ax.get_yticklabels()) == ["0", "1", "2"]  # the attention layers' indices
        cells = sorted(t.get_text() for t in ax.texts)
        assert cells == sorted(f"{v:.2f}" for v in values.flatten())
    colorbar = saved_figures["entropy.png"].axes[1]
    assert colorbar.get_ylabel() == "bits" and "(bits)" in saved_figures["entropy.png"].axes[0].get_title()


def test_integer_quantities_get_integer_ticks(tmp_path, saved_figures):
    diagnosed(tmp_path, saved_figures, n_layer=2, n_head=2)
    grad = saved_figures["grad_norms.png"].axes[0]
    assert labels(grad.get_xticklabels()) == ["0", "1"]
    for name in ("distance.png", "per_position.png", "context_curve.png"):
        ax = saved_figures[name].axes[0]
        ticks = shown_ticks(ax.xaxis, ax.get_xlim())
        assert ticks and all(float(t).is_integer() for t in ticks), (name, ticks)
    attention = saved_figures["attention_layer0.png"]
    bars = {im.colorbar.ax for ax in attention.axes for im in ax.images if im.colorbar is not None}
    for ax in attention.axes:
        if ax in bars or not ax.axison:
            continue  # the colour bar's probabilities, an unused cell
        for axis, limits in ((ax.xaxis, ax.get_xlim()), (ax.yaxis, ax.get_ylim())):
            assert all(float(t).is_integer() for t in shown_ticks(axis, limits))


def test_attention_maps_have_a_colour_bar_and_the_line_figures_a_title(tmp_path, saved_figures):
    """The diagnose report's attention maps had no colour bar (a reader could not tell 0.1 from 0.9) and its distance
    and gradient-norm figures no title: each attention figure has one bar, labelled, whose scale every head's map
    shares; distance.png and grad_norms.png say what they draw."""
    diagnosed(tmp_path, saved_figures, n_layer=2, n_head=3)
    fig = saved_figures["attention_layer0.png"]
    images = [ax.images[0] for ax in fig.axes if ax.images]
    bars = {im.colorbar.ax for im in images if im.colorbar is not None}
    assert len(bars) == 1 and next(iter(bars)) in fig.axes
    bar = next(iter(bars))
    assert bar.get_ylabel() == "attention probability"
    assert len(images) == 3 and all(im.get_clim() == images[0].get_clim() for im in images)  # one scale
    low, high = images[0].get_clim()
    assert low == 0.0 and high == max(float(im.get_array().max()) for im in images)
    assert bar.get_ylim() == (low, high)
    assert "distance" in saved_figures["distance.png"].axes[0].get_title()
    assert "gradient norm" in saved_figures["grad_norms.png"].axes[0].get_title()


def test_the_report_json_names_its_units_and_entropy_is_in_bits(tmp_path, saved_figures):
    from longseq.diagnostics import summarize_attention

    report, saved = diagnosed(tmp_path, saved_figures)
    assert "entropy" not in saved and np.array(saved["entropy_bits"]).shape == (3, 3)
    numbers = {"loss", "entropy_bits", "memory_share", "mass_by_distance", "grad_norms", "per_position",
               "context_curve"}  # fmt: skip
    assert numbers <= set(saved["units"]) and saved["units"]["entropy_bits"] == "bits"
    assert saved["units"]["loss"] == "nats per token" == saved["per_position"]["unit"] == saved["context_curve"]["unit"]
    uniform = torch.full((1, 2, 4, 4), 0.25)  # every query spreads its mass over 4 keys: 2 bits
    assert summarize_attention([uniform], mlen=0)["entropy_bits"] == [[2.0, 2.0]]
    markdown = (tmp_path / "report.md").read_text()
    assert "Attention entropy (bits)" in markdown


def test_loss_figures_draw_the_json_s_unit_and_name_both(tmp_path, saved_figures):
    from longseq.diagnostics.plots import plot_context_curve, plot_per_position, plot_runs

    result = {"positions": list(range(8)), "loss_memory": [2.0] * 8, "loss_no_memory": [3.0] * 8, "segments": 3,
              "skip_segments": 1}  # fmt: skip
    plot_per_position(result, str(tmp_path / "pp.png"))
    plot_context_curve({"contexts": [0, 8, 16], "loss": [3.0, 2.5, 2.4]}, str(tmp_path / "cc.png"), train_mem_len=8)
    for name in ("pp.png", "cc.png"):
        ax = saved_figures[name].axes[0]
        assert ax.get_ylabel() == "loss (nats per token)"
        (right,) = ax.child_axes
        assert right.get_ylabel() == "bits per token"
        top = max(np.max(line.get_ydata()) for line in ax.get_lines())
        assert top == 3.0  # drawn in nats, as the JSON holds it
    run = tmp_path / "run"
    run.mkdir()
    lines = [{"step": s, "loss": 2.0 / s, "elapsed_s": 0.5 * s} for s in range(1, 6)]
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    out = plot_runs([str(run)], str(tmp_path / "curves.png"), bits=True)
    assert out["unit"] == "bits per token"
    by_step = saved_figures["curves.png"].axes[0]
    assert by_step.get_ylabel() == "loss (bits per token)" and by_step.child_axes[0].get_ylabel() == "nats per token"
    assert max(by_step.get_lines()[0].get_ydata()) == pytest.approx(2.0 / math.log(2))
    for name in ("pp.png", "cc.png", "curves.png"):
        assert_inside(saved_figures[name], name)


def test_eval_per_position_json_and_plot_share_their_unit(tmp_path, text_corpus, lm_checkpoint, saved_figures, capsys):

    from longseq.cli import main

    lm = lm_checkpoint
    assert main(["eval", "--checkpoint", lm, "--data", str(text_corpus), "--per-position", "--plot",
                 str(tmp_path / "pp.png"), "--json", "--quiet", "--set", "max_segments=4"]) == 0  # fmt: skip
    result = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert result["unit"] == "nats per token"
    drawn = saved_figures["pp.png"].axes[0].get_lines()[0].get_ydata()
    np.testing.assert_allclose(drawn, result["loss_memory"], rtol=0, atol=1e-12)  # the plot's numbers are the JSON's


def test_plot_reads_runs_and_rejects_broken_logs(tmp_path):
    from longseq.diagnostics import plot_runs

    for name, scale in (("a", 1.0), ("b", 2.0)):
        run = tmp_path / name
        run.mkdir()
        lines = [{"step": s, "loss": scale / s, "elapsed_s": 0.5 * s} for s in range(1, 6)]
        lines.append({"step": 5, "valid_loss": scale, "elapsed_s": 3.0})
        (run / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    result = plot_runs([str(tmp_path / "a"), str(tmp_path / "b")], str(tmp_path / "curves.png"))
    assert os.path.getsize(tmp_path / "curves.png") > 1000
    assert result["runs"]["a"] == {"train": 5, "valid": 1}
    bare = plot_runs([str(tmp_path / "a")], str(tmp_path / "curves2"))  # no extension: the file written is named
    assert bare["out"] == str(tmp_path / "curves2.png") and os.path.getsize(bare["out"]) > 1000
    (tmp_path / "a" / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0}\n{broken\n')
    with pytest.raises(ValueError, match="metrics.jsonl:2"):
        plot_runs([str(tmp_path / "a")], str(tmp_path / "x.png"))


def test_plot_compares_runs_of_different_tokenizers_in_bits_per_byte(tmp_path, capsys):
    """``longseq plot`` drew bits per token only: a BPE run (about 3 bytes a token) looked twice as bad as a byte run
    it beats in bits per byte.  ``--bpb`` draws validation bits per byte; per token, the mix is said."""
    from support import tiny_run

    from longseq.cli import main
    from longseq.config import DataConfig, RunConfig, write_run_config
    from longseq.diagnostics.plots import curves

    runs = {"byte": (1.6, 1.0), "bpe": (3.3, 3.0)}  # (valid loss in nats per token, bytes per token)
    for name, (loss, per_token) in runs.items():
        run = tmp_path / name
        run.mkdir()
        base = tiny_run()
        write_run_config(RunConfig(base.model, DataConfig(tokenizer=name), base.train), str(run / "run.toml"))
        lines = [{"step": 1, "loss": loss + 0.5, "elapsed_s": 1.0},
                 {"step": 1, "valid_loss": loss, "valid_bpb": loss / math.log(2) / per_token, "elapsed_s": 1.5}]  # fmt: skip
        (run / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    dirs = [str(tmp_path / name) for name in runs]
    assert main(["plot", *dirs, "--out", str(tmp_path / "tokens.png")]) == 0
    assert "different tokenizers (bpe, byte)" in capsys.readouterr().err
    assert main(["plot", *dirs, "--bpb", "--out", str(tmp_path / "bytes.png"), "--json"]) == 0
    out = capsys.readouterr()
    assert "different tokenizers" not in out.err and json.loads(out.out.splitlines()[-1])["unit"] == "bits per byte"
    drawn = {name: curves([json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()],
                          bits=False, bpb=True) for name in runs}  # fmt: skip
    assert drawn["bpe"]["valid"][2][0] < drawn["byte"]["valid"][2][0] and not drawn["bpe"]["train"][0]


def test_diagnose_draws_where_a_learned_chunk_model_cuts_the_text(tmp_path, saved_figures, capsys):
    """No command showed where a learned-chunk checkpoint cuts a text (diagnose ignored the chunks; the study script
    trained its own model).  diagnose draws chunks.png for a model that has them: one red bar per cut, before the
    token the model's boundary predictor begins a chunk with, the text's tokens written; the report and the command
    give the numbers.  A model without chunks has no such figure."""
    from longseq.cli import main
    from longseq.config import DataConfig, RunConfig, TrainConfig
    from longseq.data.tokenizers import ByteTokenizer
    from longseq.diagnostics import diagnose
    from longseq.diagnostics.chunks import read_boundaries
    from longseq.train import save_checkpoint

    torch.manual_seed(0)
    config = ModelConfig(vocab_size=256, n_layer=4, d_model=16, n_head=2, d_head=8, d_inner=32, dropout=0.0,
                         mem_len=8, shorten_layers=[1, 3], shorten_factor=3, boundaries="learned")  # fmt: skip
    model = TransformerXLLM(config).eval()
    text = b"the cat sat on the mat\nand then it slept.\n" * 8
    ids = np.frombuffer(text, dtype=np.uint8).astype(np.int64)
    report = diagnose(model, ids, str(tmp_path / "r"), tgt_len=16, contexts=[], tokenizer=ByteTokenizer())
    cuts = [t for t, cut in enumerate(read_boundaries(model, torch.as_tensor(ids), 16).tolist()) if cut]
    assert report["chunks"]["cuts"] == cuts and report["chunks"]["chunks"] == len(cuts) and 0 < len(cuts) < len(ids)
    ax = saved_figures["chunks.png"].axes[0]
    bars = [line for line in ax.lines if line.get_color() == "crimson"]
    assert len(bars) == len(cuts)
    letters = "".join(t.get_text() for t in ax.texts)
    assert letters == text.decode().replace("\n", "↵")  # the text, a token a cell, line breaks shown
    assert f"{len(cuts)} chunks" in ax.get_title()
    assert "chunks.png" in (tmp_path / "r" / "report.md").read_text()
    run = RunConfig(config, DataConfig(tokenizer="byte", tgt_len=16, eval_tgt_len=16), TrainConfig())
    save_checkpoint(str(tmp_path / "ck"), model, run, ByteTokenizer())
    (tmp_path / "text.txt").write_bytes(text * 20)
    argv = ["diagnose", "--checkpoint", str(tmp_path / "ck"), "--data", str(tmp_path / "text.txt"), "--json",
            "--quiet", "--contexts", "none", "--tgt-len", "16"]  # fmt: skip
    assert main([*argv, "--out", str(tmp_path / "cli")]) == 0
    result = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert "chunks.png" in result["files"] and result["mean_chunk_length"] > 0
    plain = TransformerXLLM(ModelConfig(vocab_size=256, n_layer=2, d_model=16, n_head=2, d_head=8, d_inner=32))
    assert "chunks" not in diagnose(plain, ids, str(tmp_path / "p"), tgt_len=16, contexts=[])
    assert not (tmp_path / "p" / "chunks.png").exists()


def test_the_recall_heat_map_explains_its_dashed_line_reads_its_colour_bar_and_names_the_model(
    tmp_path, saved_figures, capsys, monkeypatch
):
    """passkey.png drew a red dashed line nothing explained, squashed its colour bar to two ticks and named its row
    after the task: the legend says what the line is (the model's reach), the bar reads 0-100% in five ticks with
    chance marked, and ``longseq recall --plot`` names the row after the checkpoint and its model."""
    from longseq.cli import main
    from longseq.diagnostics.plots import plot_recall_heatmap

    def run(accuracies, reach=64):
        cells = [{"distance": d, "length": 2 * d, "accuracy": a} for d, a in accuracies.items()]
        return {"task": "passkey", "chance": 0.1, "effective_range": reach, "cells": cells}

    results = {"xl": [run({16: 1.0, 128: 0.2})], "long": [run({16: 1.0, 128: 0.9}, reach=512)]}
    plot_recall_heatmap(results, str(tmp_path / "heat.png"))
    ax = saved_figures["heat.png"].axes[0]
    dashed = [line for line in ax.lines if line.get_linestyle() == "--"]
    assert len(dashed) == 1 and dashed[0].get_ydata()[0] == -0.5  # the first row's reach lies within the columns
    legend = ax.get_legend()
    assert legend is not None and "reach" in legend.get_texts()[0].get_text()
    bar = ax.images[0].colorbar
    assert [t.get_text() for t in bar.ax.get_yticklabels()] == ["0", "25", "50", "75", "100"]
    assert bar.ax.get_ylabel() == "accuracy (%); dotted: chance"
    assert [line.get_ydata()[0] for line in bar.ax.lines] == [0.1]  # chance
    assert_inside(saved_figures["heat.png"], "heat.png")
    plot_recall_heatmap({"xl": [run({16: 1.0, 32: 0.9})]}, str(tmp_path / "near.png"))
    assert saved_figures["near.png"].axes[0].get_legend() is None  # no line, nothing to explain

    monkeypatch.chdir(tmp_path)
    assert main(["train", "--task", "passkey", "--out", "pk", "--quiet", "--set", "tgt_len=16", "mem_len=16",
                 "n_layer=2", "d_model=32", "n_head=2", "d_head=16", "d_inner=64", "batch_size=4", "seq_len=32",
                 "max_steps=1", "eval_interval=1", "key_len=1", "valid_size=8", "save_every_s=0"]) == 0  # fmt: skip
    assert main(["recall", "pk", "--distances", "4,40", "--n", "4", "--quiet", "--plot", "pk.png"]) == 0
    row = [t.get_text() for t in saved_figures["pk.png"].axes[0].get_yticklabels()]
    assert len(row) == 1 and os.path.join("pk", "best") in row[0] and "mem_len 16" in row[0], row
    assert row[0].split("\n")[0] != "passkey"
