"""``longseq diagnose``: what a model's attention and memory look like on real text.

One segment is read after ``warmup`` segments have filled the memory.  The report directory holds

    attention_layer{i}.png   every head's attention map of layer i, one colour scale and its bar; memory | segment
                             boundary marked
    entropy.png              attention entropy per layer and head (bits), the value in every cell
    distance.png             attention mass against relative distance, per layer
    grad_norms.png           gradient norm of every layer's parameters for this segment's loss
    memory_share.png         share of every head's attention mass that goes into the memory, per layer
    chunks.png               where a model with learned chunks cuts the text (a red bar begins a chunk)
    per_position.png         loss at each position inside the segment, with the memory and with it cut to 0
    context_curve.png        loss against the evaluation memory length (``same_length``)
    report.md, report.json   the numbers, memory statistics and warnings

Units: attention entropy in bits (``entropy_bits``), losses in nats per token (as ``loss`` everywhere in longseq);
``report.json`` names the unit of every number under ``units``, and each figure names it on its axis.

The attention figures come from one segment of one stream; the two loss curves from an ordered pass over
``batch_size`` streams of the split (at most ``max_segments`` segments).

Attention probabilities are recomputed from each layer's inputs with the readable reference
(:meth:`longseq.model.attention.RelativeMultiHeadAttention.probs`), captured by forward hooks, so the model code stays
architecture only.
"""

from __future__ import annotations

import json
import math
import os

import numpy as np
import torch
from torch import Tensor

from longseq.diagnostics.chunks import draw_cuts, has_chunks
from longseq.model import HiddenMemory, TransformerXLLM
from longseq.outputs import check_output_directory, first_line_is, is_longseq_png, json_object_with

COLLAPSE_BITS = 0.15  # a head whose mean entropy is below this (about 0.1 nats) attends to (almost) one key
UNITS = {
    "loss": "nats per token",
    "entropy_bits": "bits",
    "memory_share": "share of the head's attention mass",
    "mass_by_distance": "share of the layer's attention mass",
    "grad_norms": "L2 norm of the layer's parameters' gradient",
    "per_position": "nats per token",
    "context_curve": "nats per token",
    "chunks": "tokens (lengths and cut positions)",
}


def attention_layers(model: TransformerXLLM) -> list[int]:
    """Indices into ``model.transformer.stack.layers`` of the layers that attend: a hybrid stack's ssm, conv and rnn
    layers have no attention map, and an hourglass block counts as one layer whose shortened layers are not read."""
    return [i for i, layer in enumerate(model.transformer.stack.layers) if layer.attends]


@torch.no_grad()
def attention_maps(model: TransformerXLLM, input_ids: Tensor, mems=None) -> tuple[list[Tensor], object]:
    """Attention probabilities (B, H, T, K) of every attention layer (:func:`attention_layers`, in that order)
    for one segment, and the new memory."""
    captured: list[tuple] = []

    def hook(module, args, kwargs):
        captured.append((module, args, kwargs))

    layers = model.transformer.stack.layers
    handles = [layers[i].dec_attn.register_forward_pre_hook(hook, with_kwargs=True) for i in attention_layers(model)]
    was_training = model.training
    model.eval()
    try:
        out = model(input_ids, mems)
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
    maps = []
    for module, args, kwargs in captured:
        maps.append(module.probs(*args, **kwargs))
    return maps, out.mems


def summarize_attention(maps: list[Tensor], mlen: int) -> dict:
    """Entropy in bits per (layer, head), mass by relative distance per layer, and the share of mass in the memory."""
    entropy, by_distance, memory_share = [], [], []
    for probs in maps:  # (B, H, T, K)
        batch, heads, qlen, klen = probs.shape
        p = probs.double()
        ent = -(p * torch.log2(p.clamp(min=1e-30))).sum(-1)  # (B, H, T) bits
        entropy.append(ent.mean(dim=(0, 2)).tolist())
        memory_share.append(p[..., :mlen].sum(-1).mean(dim=(0, 2)).tolist())
        distance = (torch.arange(qlen)[:, None] + mlen) - torch.arange(klen)[None, :]  # (T, K)
        mass = torch.zeros(klen, dtype=torch.float64)
        valid = distance >= 0
        mass.index_add_(0, distance[valid], p.sum(dim=(0, 1))[valid])  # total mass at each distance
        by_distance.append((mass / mass.sum()).tolist())
    return {"entropy_bits": entropy, "mass_by_distance": by_distance, "memory_share": memory_share}


@torch.no_grad()
def memory_attention_share(
    model: TransformerXLLM, ids: np.ndarray, *, tgt_len: int, batch_size: int = 4, segments: int = 8
) -> dict:
    """Share of every (layer, head)'s attention mass that goes into the memory, averaged over ``segments`` segments
    of ``batch_size`` ordered streams read once the memory is full (ceil(mem_len / tgt_len) segments first).

    ``uniform_share`` is the share a head spreading its mass evenly over its keys would give (memory keys over
    all keys a query sees, averaged over queries): a head far below it ignores the memory; attention dilution is a
    share near it with no gain from the memory.  The uniform share assumes the full pattern (every causal key, or
    the last ``mem_len`` with ``same_length``)."""
    mem_len = model.config.memory.mem_len
    if mem_len < 1:
        raise ValueError("memory_attention_share needs a model with a memory (mem_len >= 1)")
    fill = math.ceil(mem_len / tgt_len)
    n_step = len(ids) // batch_size
    if n_step < (fill + segments) * tgt_len + 1:
        raise ValueError(
            f"{len(ids):,} tokens cannot give {batch_size} streams of {fill + segments} segments of {tgt_len}"
        )
    data = torch.as_tensor(np.asarray(ids[: n_step * batch_size], dtype=np.int64)).view(batch_size, n_step)  # (B, N)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    mems, total = None, None
    try:
        for s in range(fill + segments):
            x = data[:, s * tgt_len : (s + 1) * tgt_len].to(device)
            if s < fill:
                mems = model(x, mems).mems
                continue
            mlen = _memory_length(mems)
            maps, mems = attention_maps(model, x, mems)
            share = torch.tensor(summarize_attention(maps, mlen)["memory_share"], dtype=torch.float64)  # (L, H)
            total = share if total is None else total + share
    finally:
        model.train(was_training)
    seen = torch.arange(tgt_len, dtype=torch.float64) + 1  # segment keys query t sees: t + 1
    if model.config.memory.same_length:  # every query sees the last `span` keys
        span = mem_len + model.config.memory.cmem_len
        uniform = float(((span - seen).clamp(min=0) / span).mean())
    else:
        uniform = float((mlen / (mlen + seen)).mean())
    return {
        "memory_share": (total / segments).tolist(),  # (attention layers, heads)
        "layers": attention_layers(model),
        "uniform_share": uniform,
        "mem_len": mlen,
        "segments": segments,
    }


def _grad_norms(model: TransformerXLLM, input_ids: Tensor, labels: Tensor, mems) -> tuple[list[float], float]:
    model.zero_grad(set_to_none=True)
    was_training = model.training
    model.eval()  # no dropout: the gradient of this exact segment
    try:
        with torch.enable_grad():
            loss = model(input_ids, mems, labels).loss
            loss.backward()
    finally:
        model.train(was_training)
    norms = []
    for layer in model.transformer.stack.layers:
        grads = [p.grad.double().norm() ** 2 for p in layer.parameters() if p.grad is not None]
        norms.append(float(torch.stack(grads).sum().sqrt()) if grads else 0.0)
    model.zero_grad(set_to_none=True)
    return norms, loss.item()


def _memory_stats(mems) -> list[dict]:
    """Per layer: an attention layer's (B, M, E) hidden states (dequantized), ``slots`` = M; a recurrent
    layer's state tensors (ssm, conv, rnn), ``slots`` = 0, the norm taken over each tensor's last axis."""
    stats = []
    for i, layer in enumerate(mems.layers):
        attends = isinstance(layer, HiddenMemory)
        parts = [mems[i]] if attends else list(layer.tensors)  # a recurrent layer's own tensors
        rows = [t.double().reshape(-1, t.size(-1)) for t in parts]
        m = torch.cat([r.flatten() for r in rows]) if rows else torch.zeros(0)
        norms = torch.cat([r.norm(dim=-1) for r in rows]) if rows else torch.zeros(0)
        stats.append(
            {
                "slots": layer.length if attends else 0,
                "mean": float(m.mean()) if m.numel() else 0.0,
                "std": float(m.std()) if m.numel() > 1 else 0.0,
                "abs_max": float(m.abs().max()) if m.numel() else 0.0,
                "mean_norm": float(norms.mean()) if m.numel() else 0.0,
                "non_finite": int((~torch.isfinite(m)).sum()),
            }
        )
    return stats


def default_contexts(mem_len: int, tgt_len: int) -> list[int]:
    """The context curve's default memory lengths: 0, half, one, two and four times the training memory."""
    base = mem_len or tgt_len
    return sorted({0, base // 2, base, 2 * base, 4 * base})


def context_evidence(
    model: TransformerXLLM,
    ids: np.ndarray,
    *,
    tgt_len: int,
    batch_size: int,
    contexts: list[int] | None = None,
    max_segments: int = 0,
) -> dict:
    """The per-position curves and the context curve (:mod:`longseq.eval.context`), nats per token."""
    from longseq.eval.context import context_curve, per_position_losses

    if contexts is None:
        contexts = default_contexts(model.config.memory.mem_len, tgt_len)
    common = dict(tgt_len=tgt_len, batch_size=batch_size, max_segments=max_segments)
    evidence = {
        "per_position": per_position_losses(model, ids, **common),
        "context_curve": context_curve(model, ids, contexts, **common),
    }
    try:  # the memory share over several segments and streams, when the split is long enough
        evidence["memory_attention"] = memory_attention_share(
            model, ids, tgt_len=tgt_len, batch_size=min(batch_size, 4)
        )
    except ValueError:
        evidence["memory_attention"] = None
    return evidence


def _check_diagnosable(model, n_tokens: int, **settings: int) -> None:
    """A clear error, before any work, for a model the report cannot read, a setting out of its range or too few
    tokens."""
    if not isinstance(model, TransformerXLLM):
        raise ValueError(
            f"diagnose reads the attention of a Transformer-XL language model; this checkpoint holds a "
            f"{type(model).__name__} (a fine-tuned model: longseq predict; the LSTM baseline has no attention)"
        )
    if not attention_layers(model):
        raise ValueError(
            f"diagnose reads attention maps and this model has no attention layer (mixers "
            f"{','.join(model.config.layer_mixers)}); its loss by position and context curve: longseq eval "
            f"--per-position, --context-curve"
        )
    least = {"tgt_len": 1, "warmup": 0, "batch_size": 1, "max_segments": 0}
    for name, value in settings.items():
        if value < least[name]:
            raise ValueError(f"diagnose: {name} must be >= {least[name]}, got {value}")
    warmup, tgt_len = settings["warmup"], settings["tgt_len"]
    needed = (warmup + 1) * tgt_len + 1
    if n_tokens < needed:
        raise ValueError(
            f"diagnose needs at least {needed:,} tokens ({warmup} + 1 segments of {tgt_len}), got {n_tokens:,}"
        )


def diagnose(
    model: TransformerXLLM,
    ids: np.ndarray,
    out_dir: str,
    *,
    tgt_len: int,
    warmup: int = 2,
    batch_size: int = 1,
    contexts: list[int] | None = None,
    max_segments: int = 0,
    tokenizer=None,
) -> dict:
    """Write the report for the segment after ``warmup`` memory-filling segments of ``ids``; returns the numbers.

    ``batch_size``, ``contexts`` and ``max_segments`` set the pass of the two loss curves (see
    :func:`context_evidence`); ``contexts=[]`` leaves the curves out.  A model with learned chunks also gets
    ``chunks.png``, where it cuts the text (``tokenizer``, the one ``ids`` were made by, writes its tokens; without
    it, their ids), and ``chunks`` in the report (:func:`~longseq.diagnostics.chunks.draw_cuts`)."""
    _check_diagnosable(
        model, len(ids), tgt_len=tgt_len, warmup=warmup, batch_size=batch_size, max_segments=max_segments
    )
    check_report_directory(out_dir)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    needed = (warmup + 1) * tgt_len + 1
    os.makedirs(out_dir, exist_ok=True)
    device = next(model.parameters()).device
    data = torch.as_tensor(np.asarray(ids[:needed], dtype=np.int64)).view(1, -1).to(device)
    mems = None
    with torch.no_grad():
        for s in range(warmup):
            mems = model.eval()(data[:, s * tgt_len : (s + 1) * tgt_len], mems).mems
    x = data[:, warmup * tgt_len : (warmup + 1) * tgt_len]
    y = data[:, warmup * tgt_len + 1 : (warmup + 1) * tgt_len + 1]
    mlen = 0 if mems is None else _memory_length(mems)
    maps, new_mems = attention_maps(model, x, mems)
    summary = summarize_attention(maps, mlen)
    grad_norms, loss = _grad_norms(model, x, y, mems)
    memory = _memory_stats(new_mems)
    attending = attention_layers(model)
    warnings = _warnings(attending, summary["entropy_bits"], loss, grad_norms, memory)
    report = {
        "layers": len(model.transformer.stack.layers),
        "attention_layers": attending,  # the rows of entropy, memory_share and mass_by_distance
        "heads": maps[0].size(1),
        "tgt_len": tgt_len,
        "mem_len": mlen,
        "loss": loss,
        **summary,
        "grad_norms": grad_norms,
        "memory": memory,
        "warnings": warnings,
        "units": UNITS,
    }
    evidence = None
    if contexts != [] and model.config.memory.mem_len:
        evidence = context_evidence(
            model, ids, tgt_len=tgt_len, batch_size=batch_size, contexts=contexts, max_segments=max_segments
        )
        report.update(evidence)
    if has_chunks(model):
        report["chunks"] = draw_cuts(model, ids, tgt_len, os.path.join(out_dir, "chunks.png"), tokenizer)
    images = _plots(plt, attending, maps, summary, grad_norms, mlen, out_dir, report.get("memory_attention"))
    images += ["chunks.png"] if "chunks" in report else []
    if evidence is not None:
        images += _evidence_plots(evidence, model.config.memory.mem_len, out_dir)
    with open(os.path.join(out_dir, "report.json"), "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2)
    with open(os.path.join(out_dir, "report.md"), "w", encoding="utf-8") as f:
        f.write(_markdown(report, images))
    report["files"] = sorted(os.listdir(out_dir))
    return report


REPORT_FILES = {
    "*.png": is_longseq_png,
    "report.json": json_object_with("units", "attention_layers"),
    "report.md": first_line_is("# longseq diagnostics"),
}


def check_report_directory(out_dir: str, flag: str = "--out") -> None:
    """``out_dir`` may receive a report: new, empty, or an earlier report (its figures, report.json and report.md,
    which are replaced); anything else is refused by name (:mod:`longseq.outputs`)."""
    check_output_directory(out_dir, flag, "a diagnostics report", REPORT_FILES)


def _warnings(attending: list[int], entropy_bits, loss: float, grad_norms: list[float], memory: list[dict]):
    """Collapsed heads, a loss or gradient norms that are not finite, NaN or Inf in the memory."""
    warnings = []
    for i, heads in zip(attending, entropy_bits):
        for h, value in enumerate(heads):
            if value < COLLAPSE_BITS:
                warnings.append(f"layer {i} head {h}: collapsed attention (entropy {value:.3f} bits)")
    if not math.isfinite(loss):
        warnings.append(f"the loss is not finite ({loss})")
    if any(not math.isfinite(g) for g in grad_norms):
        bad = ", ".join(f"layer {i}" for i, g in enumerate(grad_norms) if not math.isfinite(g))
        warnings.append(f"non-finite gradient norms: {bad}")
    for i, stats in enumerate(memory):
        if stats["non_finite"]:
            warnings.append(f"layer {i} memory holds {stats['non_finite']} NaN or Inf values")
    return warnings


def _memory_length(mems) -> int:
    return int(mems.length)


def _plots(plt, layers, maps, summary, grad_norms, mlen, out_dir, averaged=None) -> list[str]:
    """``layers``: the model's index of each attention map's layer."""
    images = [
        _save(plt, _attention_figure(plt, i, probs, mlen), out_dir, f"attention_layer{i}.png")
        for i, probs in zip(layers, maps)
    ]
    fig, ax = plt.subplots(figsize=(1.2 + 0.9 * len(summary["entropy_bits"][0]), 1.6 + 0.5 * len(layers)))
    _heatmap(fig, ax, np.array(summary["entropy_bits"]), layers, cmap="magma", label="bits")
    ax.set_title("mean attention entropy (bits)", fontsize=10)
    images.append(_save(plt, fig, out_dir, "entropy.png"))
    if mlen:
        share = np.array(summary["memory_share"] if averaged is None else averaged["memory_share"])  # (L, H)
        fig, ax = plt.subplots(figsize=(2.4 + 0.9 * share.shape[1], 1.8 + 0.5 * len(layers)))
        _heatmap(fig, ax, share, layers, cmap="viridis", label="share of attention mass", limits=(0.0, 1.0))
        where = (
            "one segment"
            if averaged is None
            else f"{averaged['segments']} segments; uniform {averaged['uniform_share']:.2f}"
        )
        ax.set_title(f"attention mass in the memory\n({mlen} positions, {where})", fontsize=9)
        images.append(_save(plt, fig, out_dir, "memory_share.png"))
    fig, ax = plt.subplots(figsize=(6, 3))
    for i, mass in zip(layers, summary["mass_by_distance"]):
        ax.plot(range(len(mass)), mass, label=f"layer {i}")
    ax.axvline(max(mlen, 0), color="gray", linestyle=":", label="beyond the segment: memory")
    ax.set_xlabel("relative distance (positions)")
    ax.set_ylabel("share of attention mass")
    ax.xaxis.set_major_locator(_integers())
    ax.set_title("attention mass against relative distance (one segment), per layer", fontsize=10)
    ax.legend(fontsize=7)
    images.append(_save(plt, fig, out_dir, "distance.png"))
    fig, ax = plt.subplots(figsize=(6, 3))
    ax.bar(range(len(grad_norms)), grad_norms)
    ax.set_xticks(range(len(grad_norms)))
    ax.set_xlabel("layer")
    ax.set_ylabel("gradient norm (L2)")
    ax.set_title("gradient norm of each layer's parameters (this segment's loss)", fontsize=10)
    images.append(_save(plt, fig, out_dir, "grad_norms.png"))
    return images


def _integers():
    from matplotlib.ticker import MaxNLocator

    return MaxNLocator(integer=True)


def _attention_figure(plt, layer: int, probs: Tensor, mlen: int):
    """Every head's attention map of one layer (one segment of one stream), on one colour scale with its bar."""
    heads = probs.size(1)
    cols = min(4, heads)
    rows = -(-heads // cols)
    fig, grid = plt.subplots(
        rows, cols + 1, figsize=(3.2 * cols + 0.8, 2.8 * rows), squeeze=False,
        gridspec_kw={"width_ratios": [1.0] * cols + [0.06]},
    )  # fmt: skip
    axes, bars = grid[:, :cols], grid[:, cols]  # the last column: the colour bar, beside the first row
    top = float(probs[0].max())
    image = None
    for h in range(rows * cols):
        ax = axes[h // cols][h % cols]
        if h >= heads:
            ax.axis("off")
            continue
        values = probs[0, h].float().numpy()
        image = ax.imshow(values, aspect="auto", cmap="viridis", interpolation="nearest", vmin=0.0, vmax=top)
        if mlen:
            ax.axvline(mlen - 0.5, color="white", linewidth=1)
        ax.set_title(f"head {h}", fontsize=8)
        ax.set_xlabel("key (memory | segment)", fontsize=7)
        ax.set_ylabel("query", fontsize=7)
        ax.xaxis.set_major_locator(_integers())
        ax.yaxis.set_major_locator(_integers())
        ax.tick_params(labelsize=6)
    fig.colorbar(image, cax=bars[0], label="attention probability")
    for ax in bars[1:]:
        ax.axis("off")
    fig.suptitle(f"layer {layer} attention")
    return fig


def _heatmap(fig, ax, values: np.ndarray, layers: list[int], *, cmap: str, label: str, limits=(None, None)) -> None:
    """A (layer, head) heat map with its value written in every cell, one tick per head and per layer."""
    low, high = limits
    im = ax.imshow(values, aspect="auto", cmap=cmap, vmin=low, vmax=high)
    middle = (np.nanmin(values) + np.nanmax(values)) / 2 if low is None else (low + high) / 2
    for (row, head), value in np.ndenumerate(values):
        color = "black" if value > middle else "white"  # magma and viridis are bright at the top
        ax.text(head, row, f"{value:.2f}", ha="center", va="center", fontsize=7, color=color)
    ax.set_xticks(range(values.shape[1]))
    ax.set_yticks(range(values.shape[0]), [str(i) for i in layers])
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    bar = fig.colorbar(im, ax=ax, label=label)
    bar.ax.ticklabel_format(useOffset=False)  # no "1e-5+3.356" above the bar, over the title


def _evidence_plots(evidence: dict, mem_len: int, out_dir: str) -> list[str]:
    from longseq.diagnostics.plots import plot_context_curve, plot_per_position

    plot_per_position(evidence["per_position"], os.path.join(out_dir, "per_position.png"))
    plot_context_curve(evidence["context_curve"], os.path.join(out_dir, "context_curve.png"), train_mem_len=mem_len)
    return ["per_position.png", "context_curve.png"]


def _save(plt, fig, out_dir: str, name: str) -> str:
    """Lay the figure out so that every label lies inside it, save, close."""
    from longseq.diagnostics.plots import save_png

    fig.tight_layout()
    save_png(fig, os.path.join(out_dir, name), dpi=90, bbox_inches="tight")
    plt.close(fig)
    return name


def _markdown(report: dict, images: list[str]) -> str:
    lines = [
        "# longseq diagnostics",
        "",
        f"{report['layers']} layers ({len(report['attention_layers'])} attending) x {report['heads']} heads; "
        f"segment {report['tgt_len']} tokens, memory {report['mem_len']} positions; loss {report['loss']:.4f}.",
        "",
        "## Warnings",
        "",
        *([f"- {w}" for w in report["warnings"]] or ["none"]),
        "",
        "## Attention entropy (bits) and share of mass in the memory",
        "",
        "| layer | " + " | ".join(f"head {h}" for h in range(report["heads"])) + " | memory share (this segment) |",
        "|---" * (report["heads"] + 2) + "|",
    ]
    for i, heads, shares in zip(report["attention_layers"], report["entropy_bits"], report["memory_share"]):
        share = sum(shares) / len(shares)
        lines.append(f"| {i} | " + " | ".join(f"{e:.2f}" for e in heads) + f" | {share:.3f} |")
    if report["mem_len"]:
        averaged = report.get("memory_attention")
        shares = report["memory_share"] if averaged is None else averaged["memory_share"]
        where = (
            "the diagnosed segment"
            if averaged is None
            else f"{averaged['segments']} segments of several streams; a uniform head would give "
            f"{averaged['uniform_share']:.3f}"
        )
        lines += ["", f"## Share of attention mass in the memory, per head ({where})", ""]
        lines += ["| layer | " + " | ".join(f"head {h}" for h in range(report["heads"])) + " |"]
        lines += ["|---" * (report["heads"] + 1) + "|"]
        for i, heads in zip(report["attention_layers"], shares):
            lines.append(f"| {i} | " + " | ".join(f"{v:.3f}" for v in heads) + " |")
    lines += _evidence_markdown(report)
    if "chunks" in report:
        c = report["chunks"]
        lines += ["", "## Where the model cuts the text (learned chunks)", ""]
        lines += [f"{c['chunks']} chunks over the first {c['tokens']} tokens: mean {c['mean_length']:.2f} tokens "
                  f"(std {c['std_length']:.2f}, longest {c['longest']}); chunks.png draws them."]  # fmt: skip
    lines += ["", "## Gradient norms and memory", "", "| layer | grad norm | memory slots | mean | std | max abs |"]
    lines.append("|---|---|---|---|---|---|")
    for i, g in enumerate(report["grad_norms"]):
        m = report["memory"][i] if i < len(report["memory"]) else {}
        lines.append(
            f"| {i} | {g:.4g} | {m.get('slots', 0)} | {m.get('mean', 0):.3g} | {m.get('std', 0):.3g} | {m.get('abs_max', 0):.3g} |"
        )
    lines += ["", "## Plots", ""] + [f"![{name}]({name})" for name in images]
    return "\n".join(lines) + "\n"


def _evidence_markdown(report: dict) -> list[str]:
    """The per-position curves at a few positions and the context curve, in nats."""
    if "per_position" not in report:
        return []
    pp, curve = report["per_position"], report["context_curve"]
    picks = sorted({0, 1, len(pp["positions"]) // 2, len(pp["positions"]) - 1})
    lines = [
        "",
        f"## Loss by position inside the segment (nats; {pp['segments']} segments per stream, the first "
        f"{pp['skip_segments']} skipped)",
        "",
        "| position | " + " | ".join(str(pp["positions"][i]) for i in picks) + " | mean |",
        "|---" * (len(picks) + 2) + "|",
    ]
    for key, label in (("loss_memory", "with memory"), ("loss_no_memory", "memory cut to 0")):
        values = pp[key]
        lines.append(
            f"| {label} | " + " | ".join(f"{values[i]:.4f}" for i in picks) + f" | {sum(values) / len(values):.4f} |"
        )
    lines += ["", "## Loss against evaluation memory (nats, same_length)", ""]
    lines += ["| memory | " + " | ".join(str(c) for c in curve["contexts"]) + " |"]
    lines += ["|---" * (len(curve["contexts"]) + 1) + "|"]
    lines += ["| loss | " + " | ".join(f"{v:.4f}" for v in curve["loss"]) + " |"]
    return lines
