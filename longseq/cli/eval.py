"""``longseq eval``: score a checkpoint over one ordered pass (``eval recl``: RECL of a group of checkpoints)."""

from __future__ import annotations

import argparse
import os
from functools import partial

from longseq.cli.common import (
    checkpoint_kind,
    common_flags,
    device_flag,
    load_model,
    memory_lengths,
    overrides,
    read_corpus,
    say,
    set_threads,
    threads_flag,
    warnings_said,
)
from longseq.config import EvalConfig, apply_overrides

EPILOG = """reports loss (nats per token), ppl, bpc (byte and char tokenizers: bits per character), bpb (bits per
UTF-8 byte of the scored text, any tokenizer; a word tokenizer's text is its words joined by single spaces, lines
ended by a newline), tokens and bytes scored.

override evaluation settings with --set key=value; keys: split tgt_len mem_len clamp_len same_length sinks
sink_positions batch_size max_segments rope_scaling rope_factor rope_original_len.  The paper evaluates with a
longer memory than it trains with, e.g. --set tgt_len=64 mem_len=640 clamp_len=400 same_length=true for
WikiText-103.  A rope model (which clamp_len does not bound) read past its training memory: --set mem_len=256
rope_scaling=ntk rope_factor=4 (its positions stretched for this evaluation).  A pretrained model read far past
its context keeps its first tokens as attention sinks: --set sinks=4 mem_len=1020 same_length=true (StreamingLLM:
every token sees the 4 first and its 1,020 last).  A setting the model does not read is refused by name.

is the context used?  --per-position: mean loss at each position inside the segment with the memory (--set
mem_len etc.) and with it cut to 0, over the segments after those that fill the memory (JSON: positions,
loss_memory, loss_no_memory, unit: nats per token).  --context-curve 0,64,128,256: loss with every token seeing exactly that
many positions (same_length; --set same_length=false lets the segment add to it; --set clamp_len=N clamps
distances), JSON: contexts, loss, unit (nats per token).  --plot FILE.png draws either, in nats per token with bits
per token on a second axis."""


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "eval", help="evaluate a checkpoint", epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("mode", nargs="?", choices=["recl"], help="recl: relative effective context length of a group")
    p.add_argument(
        "--checkpoint", required=True, action="append", help="checkpoint directory (repeat for a RECL group)"
    )
    p.add_argument("--split", default="valid", choices=["train", "valid", "test"])
    p.add_argument("--data", help="corpus to evaluate (default: the one the checkpoint was trained on)")
    p.add_argument("--set", nargs="+", action="append", metavar="KEY=VALUE", help="evaluation override")
    evidence = p.add_mutually_exclusive_group()
    evidence.add_argument(
        "--per-position",
        action="store_true",
        help="mean loss at each position inside the segment, with the memory and with it cut to 0 (nats)",
    )
    evidence.add_argument(
        "--context-curve",
        type=memory_lengths,
        metavar="C1,C2,...",
        help="loss at each evaluation memory length, e.g. 0,64,128,256 (same_length unless --set same_length=false)",
    )
    p.add_argument("--plot", metavar="FILE.png", help="with --per-position or --context-curve: write the figure")
    p.add_argument(
        "--skip-segments",
        type=int,
        help="segments read before scoring (default: per-position, those that fill the memory; context curve, 0)",
    )
    p.add_argument("--contexts", type=int, nargs="+", default=[32, 64, 128, 256], help="RECL context lengths")
    p.add_argument("--r", type=float, nargs="+", default=[0.1, 0.5, 1.0], help="RECL top-r fractions")
    p.add_argument("--max-tokens", type=int, default=4000, help="RECL: tokens scored per model and length")
    device_flag(p)
    threads_flag(p)
    return common_flags(p)


def _load(args: argparse.Namespace):
    """The checkpoint's model, the evaluation settings, the split's ids (and documents), the bits unit, the share of
    ``<unk>`` and the tokenizer."""

    if len(args.checkpoint) != 1:
        raise ValueError(
            f"longseq eval takes one --checkpoint (got {len(args.checkpoint)}); RECL of a group: eval recl"
        )
    settings = apply_overrides({"eval": EvalConfig(split=args.split)}, overrides(args.set))["eval"]
    checkpoint, model, tokenizer, run_config = load_model(args.checkpoint[0], args.device)
    if not run_config.is_language_model:
        raise ValueError(f"{checkpoint} is not a language model: it is {checkpoint_kind(run_config)}")
    corpus = read_corpus(args.data, run_config, tokenizer, checkpoint)
    ids = corpus.split(settings.split)
    doc_ids = corpus.doc_ids[settings.split] if run_config.data.doc_reset and corpus.doc_ids is not None else None
    unk = unknown_rate(ids, tokenizer, f"the {settings.split} split of {corpus.source}")
    return (
        model,
        settings,
        run_config,
        ids,
        doc_ids,
        tokenizer.bits_metric,
        ({} if unk is None else {"unk_rate": unk}),
        tokenizer,
    )


WARN_UNKNOWN = 0.10  # PTB and WikiText hold 5-6% <unk> of their own; another corpus's vocabulary leaves far more


def unknown_rate(ids, tokenizer, what: str) -> float | None:
    """The share of ``<unk>`` among ``ids`` (a word vocabulary; None for tokenizers without one), said on stderr
    when it is above :data:`WARN_UNKNOWN`: scores on such text are scores of ``<unk>``.  (Above half, reading the
    corpus is refused.)"""
    import numpy as np

    unk = getattr(tokenizer, "unk_id", None)
    if unk is None or len(ids) == 0:
        return None
    step = 1 << 24
    rate = sum(int(np.count_nonzero(np.asarray(ids[i : i + step]) == unk)) for i in range(0, len(ids), step)) / len(ids)
    if rate > WARN_UNKNOWN:
        say(
            f"warning: {rate:.1%} of the tokens of {what} are <unk>: the vocabulary ({tokenizer.vocab_size:,} words) "
            "lacks many of its words, so the loss and perplexity are mostly those of <unk> and not comparable"
        )
    return rate


def run(args: argparse.Namespace) -> dict:
    set_threads(args)
    if args.mode == "recl":
        return run_recl(args)
    with warnings_said():  # a memory longer than a rope model's training memory, said as it starts
        return run_one(args)


def run_one(args: argparse.Namespace) -> dict:
    from longseq.eval.evaluate import evaluate
    from longseq.model.positions import position_encoding

    if args.plot and not (args.per_position or args.context_curve):
        raise ValueError("--plot draws --per-position or --context-curve; give one of them")
    if args.plot:
        from longseq.diagnostics.plots import check_figure

        check_figure(args.plot, "--plot")  # before any work
    model, settings, run_config, ids, doc_ids, unit, unk, tokenizer = _load(args)
    model = evaluated_model(model, settings)
    batch_size = settings.batch_size or run_config.data.eval_batch_size
    relative = position_encoding(model.config.positions.pos).relative
    if args.per_position or args.context_curve:
        if not relative or doc_ids is not None:
            raise ValueError(
                "--per-position and --context-curve need a model with a memory over one ordered stream: "
                + ("this one has absolute positions" if not relative else "this run keeps documents apart")
            )
        return run_evidence(args, model, settings, run_config, ids, batch_size)
    if not relative:  # the vanilla Transformer: sliding windows
        from longseq.eval.sliding import evaluate_sliding

        tgt_len = settings.tgt_len or run_config.data.tgt_len
        metrics = evaluate_sliding(
            model,
            ids,
            context=tgt_len,
            batch_size=batch_size,
            max_targets=settings.max_segments * tgt_len,
            bits_unit=unit,
            tokenizer=tokenizer,
        )
        return {"split": settings.split, **metrics, **unk}
    metrics = evaluate(
        model,
        ids,
        batch_size=batch_size,
        tgt_len=settings.tgt_len or run_config.data.eval_tgt_len,
        recurrence=settings.recurrence(model.config),
        max_segments=settings.max_segments,
        bits_unit=unit,
        progress=not args.quiet,
        doc_ids=doc_ids,
        tokenizer=tokenizer,
    )
    return {"split": settings.split, **metrics, **unk}


def evaluated_model(model, settings: EvalConfig):
    """``model`` as ``settings`` evaluate it: the memory settings it does not read refused by name, its positions
    replaced by the rope settings given (``--set rope_scaling=ntk rope_factor=4``)."""
    from longseq.eval.evaluate import ROPE_SETTINGS, refuse_unread_settings, with_positions

    keys = ("mem_len", "clamp_len", "same_length", "sinks", "sink_positions", *ROPE_SETTINGS)
    refuse_unread_settings(model.config, {k: f"--set {k}" for k in keys if getattr(settings, k) is not None})
    return with_positions(model, settings.positions(model.config))


def run_evidence(args, model, settings, run_config, ids, batch_size) -> dict:
    """``--per-position`` or ``--context-curve``: the numbers (nats per token, ``"unit"`` says so), and the figure with
    ``--plot`` (nats, with bits per token on a second axis)."""
    from longseq.diagnostics.plots import plot_context_curve, plot_per_position
    from longseq.eval.context import context_curve, per_position_losses

    tgt_len = settings.tgt_len or run_config.data.eval_tgt_len
    common = dict(tgt_len=tgt_len, batch_size=batch_size, max_segments=settings.max_segments, progress=not args.quiet)
    if args.per_position:
        recurrence = settings.recurrence(model.config)
        result = per_position_losses(model, ids, recurrence=recurrence, skip_segments=args.skip_segments, **common)
        summary = {
            "loss_memory_mean": sum(result["loss_memory"]) / len(result["loss_memory"]),
            "loss_no_memory_mean": sum(result["loss_no_memory"]) / len(result["loss_no_memory"]),
        }
        plot = plot_per_position
    else:
        skip = args.skip_segments or 0
        result = context_curve(
            model,
            ids,
            args.context_curve,
            recurrence=context_recurrence(model.config, settings),
            skip_segments=skip,
            **common,
        )
        summary = {"train_mem_len": model.config.memory.mem_len}
        plot = partial(plot_context_curve, train_mem_len=model.config.memory.mem_len)
    out = {"split": settings.split, "tgt_len": tgt_len, **result, **summary}
    if args.plot:  # drawn in the JSON's unit (nats per token), bits per token on the right
        out["plot"] = plot(result, args.plot)
    return out if args.json else for_people(out)


def for_people(out: dict) -> dict:
    """The plain output of ``--per-position`` and ``--context-curve``: the curves as a short table (per position:
    the positions 0, 1, 2, 4, 8, ... and the last), the full lists only in ``--json``."""
    if "positions" in out:
        positions = out["positions"]
        picks = sorted({i for i in range(len(positions)) if i & (i - 1) == 0} | {len(positions) - 1})
        table = [
            {
                "position": positions[i],
                "with_memory": out["loss_memory"][i],
                "memory_cut": out["loss_no_memory"][i],
                "tokens": out["tokens"][i],
            }  # fmt: skip
            for i in picks
        ]
        lists = ("positions", "loss_memory", "loss_no_memory", "tokens")
        name = "by_position"
    else:
        table = [{"memory": c, "loss": v} for c, v in zip(out["contexts"], out["loss"])]
        lists, name = ("contexts", "loss"), "by_memory"
    kept = {k: v for k, v in out.items() if k not in lists and k != "plot"}
    figure = {"plot": out["plot"]} if "plot" in out else {}
    return {**kept, name: table, "full_curves": "with --json", **figure}


def run_recl(args: argparse.Namespace) -> dict:
    from longseq.eval.recl import context_read_by, group_losses, recl

    if args.set:
        raise ValueError("eval recl takes no --set; choose the lengths with --contexts")
    models, corpus_ids, names = {}, None, []
    for path in args.checkpoint:
        path, model, tokenizer, run_config = load_model(path, args.device)
        name = os.path.basename(os.path.dirname(os.path.abspath(path))) or path
        if name in models:
            name = path
        ids = read_corpus(args.data, run_config, tokenizer, path).split(args.split)
        if corpus_ids is not None and (len(ids) != len(corpus_ids) or (ids[:1000] != corpus_ids[:1000]).any()):
            raise ValueError(f"{path} reads a different token sequence than {names[0]}: RECL needs the same tokens")
        corpus_ids = ids
        models[name] = (model, run_config)
        names.append(path)
    losses = group_losses(models, corpus_ids, args.contexts, max_targets=args.max_tokens, progress=not args.quiet)
    result = {"contexts": args.contexts, "tokens": int(len(next(iter(next(iter(losses.values())).values()))))}
    for r in args.r:
        result[f"recl_r{r:g}"] = recl(losses, r=r)
    result["context_read_by"] = {name: context_read_by(model.config) for name, (model, _) in models.items()}
    result["loss_by_context"] = {
        name: {str(c): float(v.mean()) for c, v in per.items()} for name, per in losses.items()
    }
    return result


def context_recurrence(config, settings: EvalConfig):
    """A context curve's recurrence (its memory length set per context): ``same_length`` on unless ``--set
    same_length=false`` (or learned or entropy chunks, which cannot take it), ``clamp_len`` from ``--set``."""
    same_length = settings.same_length if settings.same_length is not None else not config.hourglass.dynamic
    return config.recurrence(clamp_len=settings.clamp_len, same_length=same_length)
