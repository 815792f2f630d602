"""The ``longseq`` command line: a thin layer that parses, calls the library and prints.

Commands::

    longseq train [--preset tiny-shakespeare] [--set key=value ...] [--data PATH] [--tokenizer byte|char|word]
                  [--out DIR] [--resume] [--json]
    longseq eval --checkpoint DIR [--split valid|test] [--set mem_len=1600 ...] [--data PATH] [--json]
    longseq eval recl --checkpoint A --checkpoint B ... [--contexts 32 64 128] [--r 0.1 0.5 1.0] [--json]
    longseq generate --checkpoint DIR --prompt TEXT --max-new-tokens N [--temperature T] [--top-k K]
                  [--top-p P] [--seed S] [--json]
    longseq bench train|eval|generate|eval-speed [--attn-len 800 1800 ...] [--json]
    longseq diagnose --checkpoint DIR [--data PATH] --out DIR [--json]
    longseq plot RUN_DIR [RUN_DIR ...] --out FILE.png [--bits]
    longseq finetune --task classify|span|mlm --data train.jsonl [--valid valid.jsonl] --checkpoint DIR --out DIR [--json]
    longseq data listops --out DIR [--seed N] [--train 2000 --valid 200 --test 200]

Human-readable progress goes to stderr; the result goes to stdout (one JSON object on the last line with ``--json``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

from longseq.config import PRESETS, ConfigError, EvalConfig, RunConfig, apply_overrides, get_preset

EPILOG_TRAIN = f"""presets: {", ".join(PRESETS)}
override any field of the model, data or train config with --set key=value (dotted, e.g. model.dropout,
when a name is ambiguous); lists as comma lists or JSON, e.g. --set cutoffs=20000,40000,200000.
keys include: max_steps batch_size tgt_len mem_len n_layer d_model n_head d_head d_inner lr dropout
dropatt clamp_len same_length pre_lnorm cutoffs div_val untie_r warmup_steps schedule clip grad_accum
attention window dilation pos optimizer layer_lr_decay precision activation_checkpointing nan_patience keep_last.
data parallel: torchrun --nproc_per_node N -m longseq train ..."""

EPILOG_EVAL = """override evaluation settings with --set key=value; keys: split tgt_len mem_len clamp_len same_length
batch_size max_segments.  The paper evaluates with a longer memory than it trains with, e.g.
--set tgt_len=64 mem_len=640 clamp_len=400 same_length=true for WikiText-103."""


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _emit(result: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(result, sort_keys=True))
        return
    for key, value in result.items():
        if isinstance(value, float):
            value = f"{value:.4f}" if math.isfinite(value) else str(value)
        print(f"{key:>16}: {value}")


def _overrides(values: list[list[str]] | None) -> list[str]:
    return [item for group in (values or []) for item in group]


def cmd_train(args: argparse.Namespace) -> dict:
    from longseq.train.checkpoint import load_checkpoint_config
    from longseq.train.loop import train

    extra = _overrides(args.set)
    if args.data is not None:
        extra.append(f"data.path={args.data}")
    if args.tokenizer is not None:
        extra.append(f"data.tokenizer={args.tokenizer}")
    if args.tensorboard:
        extra.append("train.tensorboard=true")
    out = args.out or os.path.join("runs", args.preset)
    run = load_checkpoint_config(os.path.join(out, "last")) if args.resume else get_preset(args.preset)
    sections = apply_overrides({"model": run.model, "data": run.data, "train": run.train}, extra)
    run = RunConfig(**sections)
    result = train(run, out, resume=args.resume, progress=not args.quiet, log=_say)
    import torch.distributed as dist

    if dist.is_initialized():  # under torchrun: rank 0 reports
        rank = dist.get_rank()
        dist.destroy_process_group()
        if rank != 0:
            return {}
    summary = {
        "step": result.step,
        "train_loss": result.train_loss,
        "loss": result.valid.get("loss", float("nan")),
        "ppl": result.valid.get("ppl", float("nan")),
        "best_valid_loss": result.best_valid_loss,
        "tokens": result.tokens,
        "tokens_per_s": result.tokens_per_s,
        "checkpoint": os.path.join(out, "best"),
    }
    if "bpc" in result.valid:
        summary["bpc"] = result.valid["bpc"]
        summary["unigram_bpc"] = result.unigram_bpc
        _say(f"validation bpc {summary['bpc']:.3f} vs. unigram model {summary['unigram_bpc']:.3f}")
    return summary


def cmd_eval(args: argparse.Namespace) -> dict:
    from longseq.data.corpus import load_corpus
    from longseq.eval.evaluate import evaluate
    from longseq.train.checkpoint import load_checkpoint
    from longseq.train.loop import bits_unit

    if args.mode == "recl":
        return cmd_recl(args)
    if len(args.checkpoint) != 1:
        raise ValueError(
            f"longseq eval takes one --checkpoint (got {len(args.checkpoint)}); RECL of a group: eval recl"
        )
    settings = apply_overrides({"eval": EvalConfig(split=args.split)}, _overrides(args.set))["eval"]
    model, tokenizer, run, _ = load_checkpoint(args.checkpoint[0])
    path = args.data if args.data is not None else run.data.path
    corpus = load_corpus(path, tokenizer.kind, tokenizer=tokenizer, lowercase=run.data.lowercase)
    ids = corpus.split(settings.split)
    doc_ids = None
    if run.data.doc_reset and corpus.doc_ids is not None:
        doc_ids = corpus.doc_ids[settings.split]
    if getattr(model.config, "pos", None) == "absolute":  # the vanilla Transformer: the paper's sliding windows
        from longseq.eval.sliding import evaluate_sliding

        tgt_len = settings.tgt_len or run.data.tgt_len
        metrics = evaluate_sliding(
            model,
            ids,
            context=tgt_len,
            batch_size=settings.batch_size or run.data.eval_batch_size,
            max_targets=settings.max_segments * tgt_len,
            bits_unit=bits_unit(tokenizer.kind),
        )
        return {"split": settings.split, **metrics}
    metrics = evaluate(
        model,
        ids,
        batch_size=settings.batch_size or run.data.eval_batch_size,
        tgt_len=settings.tgt_len or run.data.eval_tgt_len,
        mem_len=settings.mem_len,
        clamp_len=settings.clamp_len,
        same_length=settings.same_length,
        max_segments=settings.max_segments,
        bits_unit=bits_unit(tokenizer.kind),
        progress=not args.quiet,
        doc_ids=doc_ids,
    )
    return {"split": settings.split, **metrics}


def cmd_recl(args: argparse.Namespace) -> dict:
    from longseq.data.corpus import load_corpus
    from longseq.eval.recl import group_losses, recl
    from longseq.train.checkpoint import load_checkpoint

    if args.set:
        raise ValueError("eval recl takes no --set; choose the lengths with --contexts")
    models, corpus_ids, names = {}, None, []
    for path in args.checkpoint:
        model, tokenizer, run, _ = load_checkpoint(path)
        name = os.path.basename(os.path.dirname(os.path.abspath(path))) or path
        if name in models:
            name = path
        data = args.data if args.data is not None else run.data.path
        ids = load_corpus(data, tokenizer.kind, tokenizer=tokenizer, lowercase=run.data.lowercase).split(args.split)
        if corpus_ids is not None and (len(ids) != len(corpus_ids) or (ids[:1000] != corpus_ids[:1000]).any()):
            raise ValueError(f"{path} reads a different token sequence than {names[0]}: RECL needs the same tokens")
        corpus_ids = ids
        models[name] = (model, run)
        names.append(path)
    losses = group_losses(models, corpus_ids, args.contexts, max_targets=args.max_tokens, progress=not args.quiet)
    result = {"contexts": args.contexts, "tokens": int(len(next(iter(next(iter(losses.values())).values()))))}
    for r in args.r:
        result[f"recl_r{r:g}"] = recl(losses, r=r)
    result["loss_by_context"] = {
        name: {str(c): float(v.mean()) for c, v in per.items()} for name, per in losses.items()
    }
    return result


def cmd_diagnose(args: argparse.Namespace) -> dict:
    from longseq.data.corpus import load_corpus
    from longseq.diagnostics import diagnose
    from longseq.train.checkpoint import load_checkpoint

    model, tokenizer, run, _ = load_checkpoint(args.checkpoint)
    data = args.data if args.data is not None else run.data.path
    ids = load_corpus(data, tokenizer.kind, tokenizer=tokenizer, lowercase=run.data.lowercase).split(args.split)
    tgt_len = args.tgt_len or run.data.eval_tgt_len
    report = diagnose(model, ids, args.out, tgt_len=tgt_len, warmup=args.warmup)
    for warning in report["warnings"]:
        _say(f"warning: {warning}")
    keep = ("layers", "heads", "tgt_len", "mem_len", "loss", "grad_norms", "warnings", "files")
    return {"out": args.out, **{k: report[k] for k in keep}}


def cmd_finetune(args: argparse.Namespace) -> dict:
    from longseq.train import finetune

    config = finetune.FinetuneConfig(
        steps=args.steps,
        batch_size=args.batch_size,
        segment_len=args.segment_len or 0,
        lr=args.lr,
        layer_lr_decay=args.layer_lr_decay,
        head_only=args.head_only,
        seed=args.seed,
    )
    where = dict(valid_path=args.valid, log=_say)
    if args.task == "classify":
        extra = dict(pooling=args.pooling, lm_weight=args.lm_weight)
        return finetune.finetune_classifier(args.checkpoint, args.data, args.out, config, **where, **extra)
    if args.task == "span":
        extra = dict(max_answer_len=args.max_answer_len)
        return finetune.finetune_span(args.checkpoint, args.data, args.out, config, **where, **extra)
    extra = dict(mask_rate=args.mask_rate, mask_token=args.mask_token)
    return finetune.finetune_mlm(args.checkpoint, args.data, args.out, config, **where, **extra)


def cmd_data(args: argparse.Namespace) -> dict:
    from longseq.data.tasks import write_listops

    sizes = {"train": args.train, "valid": args.valid, "test": args.test}
    lengths = {"min_length": args.min_length, "max_length": args.max_length}
    return {"out": args.out, "seed": args.seed, **write_listops(args.out, args.seed, sizes, **lengths)}


def cmd_plot(args: argparse.Namespace) -> dict:
    from longseq.diagnostics import plot_runs

    return plot_runs(args.runs, args.out, bits=args.bits)


def cmd_generate(args: argparse.Namespace) -> dict:
    import torch

    from longseq.generation import generate
    from longseq.train.checkpoint import load_checkpoint

    model, tokenizer, run, _ = load_checkpoint(args.checkpoint)
    prompt = tokenizer.encode(args.prompt)
    if len(prompt) == 0:
        raise ValueError("the prompt is empty; give at least one character or word")
    generator = torch.Generator().manual_seed(args.seed)
    mem_len = args.mem_len if args.mem_len is not None else run.model.mem_len + run.data.tgt_len
    start = time.perf_counter()
    ids = generate(
        model,
        torch.as_tensor(prompt)[None],
        args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        mem_len=mem_len,
        segment_len=run.data.tgt_len,
        generator=generator,
    )
    elapsed = time.perf_counter() - start
    text = tokenizer.decode(ids[0].tolist())
    if not args.json:
        print(args.prompt + text)
        return {}
    return {
        "prompt": args.prompt,
        "text": text,
        "tokens": ids.size(1),
        "tokens_per_s": ids.size(1) / max(elapsed, 1e-9),
    }


def cmd_convert(args: argparse.Namespace) -> dict:
    from longseq.interop.hf import convert_from_hf, export_to_hf
    from longseq.train.checkpoint import load_checkpoint

    if bool(args.from_hf) == bool(args.to_hf):
        raise ValueError("give exactly one of --from-hf DIR or --to-hf (with --checkpoint DIR)")
    if args.from_hf:
        run = convert_from_hf(args.from_hf, args.out, vocab=args.vocab)
        return {
            "from_hf": args.from_hf,
            "checkpoint": args.out,
            "n_layer": run.model.n_layer,
            "vocab_size": run.model.vocab_size,
        }
    if not args.checkpoint:
        raise ValueError("--to-hf needs --checkpoint DIR (a longseq checkpoint)")
    model, tokenizer, _, _ = load_checkpoint(args.checkpoint)
    export_to_hf(model, args.out, tokenizer)
    return {"checkpoint": args.checkpoint, "to_hf": args.out}


def cmd_bench(args: argparse.Namespace) -> dict:
    import torch

    from longseq.eval import speed
    from longseq.model import TransformerXLLM

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if args.task == "eval-speed":
        rows = speed.eval_speed_vs_vanilla(args.attn_len, tgt_len=args.tgt_len, windows=args.steps, rounds=args.rounds)
        return {"task": "eval-speed", "tgt_len": args.tgt_len, "threads": torch.get_num_threads(), "lengths": rows}
    model = TransformerXLLM(speed.bench_config(args.mem_len, attn_chunk=args.attn_chunk))
    if args.task != "train" and (args.compile or args.autocast):
        raise ValueError("--compile and --autocast apply to `longseq bench train` only")
    settings = {"task": args.task, "tgt_len": args.tgt_len, "mem_len": args.mem_len, "threads": torch.get_num_threads()}
    if args.task == "train":
        result = speed.train_throughput(
            model,
            batch=args.batch,
            tgt_len=args.tgt_len,
            steps=args.steps,
            compile=args.compile,
            autocast=args.autocast,
        )
        if args.compile:
            settings["compile"] = True
        if args.autocast:
            settings["autocast"] = args.autocast
    elif args.task == "eval":
        result = speed.eval_per_token(
            model, batch=args.batch, tgt_len=args.tgt_len, mem_len=args.mem_len, segments=args.steps
        )
    else:
        result = speed.generate_speed(
            model,
            prompt_len=args.prompt_len,
            new_tokens=args.new_tokens,
            mem_len=args.mem_len,
            segment_len=args.tgt_len,
        )
    if args.task != "generate":
        settings["batch"] = args.batch
    return {**settings, **result}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="longseq", description="Transformer-XL language modeling: train, eval, generate."
    )
    sub = parser.add_subparsers(
        dest="command", metavar="{train,eval,generate,convert,bench,diagnose,plot,finetune,data}"
    )

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--json", action="store_true", help="print the result as one JSON object on the last line of stdout"
        )
        p.add_argument("--quiet", action="store_true", help="no progress bar")

    p = sub.add_parser(
        "train",
        help="train a model (default: tiny-shakespeare preset on the bundled corpus)",
        epilog=EPILOG_TRAIN,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--preset", default="tiny-shakespeare", help="named configuration (default: %(default)s)")
    p.add_argument("--set", nargs="+", action="append", metavar="KEY=VALUE", help="override a config field")
    p.add_argument("--data", help="corpus file or directory (default: bundled tiny-shakespeare)")
    p.add_argument("--tokenizer", choices=["byte", "char", "word"], help="tokenizer kind")
    p.add_argument("--out", help="run directory (default: runs/PRESET)")
    p.add_argument("--resume", action="store_true", help="continue exactly from OUT/last")
    p.add_argument("--tensorboard", action="store_true", help="also write TensorBoard events (OUT/tensorboard)")
    common(p)
    p.set_defaults(func=cmd_train)

    p = sub.add_parser(
        "eval", help="evaluate a checkpoint", epilog=EPILOG_EVAL, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("mode", nargs="?", choices=["recl"], help="recl: relative effective context length of a group")
    p.add_argument(
        "--checkpoint", required=True, action="append", help="checkpoint directory (repeat for a RECL group)"
    )
    p.add_argument("--split", default="valid", choices=["train", "valid", "test"])
    p.add_argument("--data", help="corpus to evaluate (default: the one the checkpoint was trained on)")
    p.add_argument("--set", nargs="+", action="append", metavar="KEY=VALUE", help="evaluation override")
    p.add_argument("--contexts", type=int, nargs="+", default=[32, 64, 128, 256], help="RECL context lengths")
    p.add_argument("--r", type=float, nargs="+", default=[0.1, 0.5, 1.0], help="RECL top-r fractions")
    p.add_argument("--max-tokens", type=int, default=4000, help="RECL: tokens scored per model and length")
    common(p)
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("generate", help="sample a continuation of a prompt")
    p.add_argument("--checkpoint", required=True, help="checkpoint directory")
    p.add_argument("--prompt", required=True, help="text to continue")
    p.add_argument("--max-new-tokens", type=int, default=200)
    p.add_argument("--temperature", type=float, default=1.0, help="0 for greedy decoding")
    p.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (0: all)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (1: off)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--mem-len", type=int, help="memory length while sampling (default: train mem_len + tgt_len)")
    common(p)
    p.set_defaults(func=cmd_generate)
    p = sub.add_parser(
        "bench",
        help="measure training, evaluation or generation speed of the benchmark model",
        description="The model of the performance issue (4 layers, d_model 256, 8 heads x 32, d_inner 1024, bytes) "
        "on random tokens. Side-by-side comparisons with other implementations: benchmarks/vs_hf.py.",
    )
    p.add_argument("task", choices=["train", "eval", "generate", "eval-speed"])
    p.add_argument(
        "--attn-len", type=int, nargs="+", default=[800, 1800, 2800, 3800], help="eval-speed attention lengths"
    )
    p.add_argument("--tgt-len", type=int, default=128, help="segment length (prompt segment length for generate)")
    p.add_argument("--mem-len", type=int, default=128)
    p.add_argument("--batch", type=int, default=8, help="parallel streams (train, eval)")
    p.add_argument("--steps", type=int, default=3, help="timed steps (train) or segments (eval)")
    p.add_argument("--rounds", type=int, default=1, help="eval-speed: alternate XL and vanilla, report medians")
    p.add_argument("--prompt-len", type=int, default=2000)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--attn-chunk", type=int, default=64, help="query block size of the attention kernel (0: none)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model (compile time reported apart)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's choice)")
    p.add_argument("--autocast", choices=["bf16"], help="train under CPU bf16 autocast")
    common(p)
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser(
        "convert",
        help="convert Hugging Face TransfoXL checkpoints to longseq and back",
        description="longseq convert --from-hf HF_DIR --out DIR [--vocab vocab.txt]  |  "
        "longseq convert --to-hf --checkpoint DIR --out HF_DIR",
    )
    p.add_argument(
        "--from-hf", metavar="DIR", help="HF TransfoXL directory (config.json + model.safetensors or pytorch_model.bin)"
    )
    p.add_argument("--to-hf", action="store_true", help="export --checkpoint to an HF TransfoXL directory")
    p.add_argument("--checkpoint", help="longseq checkpoint to export")
    p.add_argument("--vocab", help="plain-text vocabulary, one token per line in id order (never a pickle)")
    p.add_argument("--out", required=True, help="output directory")
    common(p)
    p.set_defaults(func=cmd_convert)

    p = sub.add_parser("diagnose", help="attention maps, entropy, gradient norms and memory statistics of a checkpoint")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--data", help="corpus (default: the checkpoint's)")
    p.add_argument("--split", default="valid", choices=["train", "valid", "test"])
    p.add_argument("--tgt-len", type=int, default=0, help="segment length (default: the checkpoint's eval_tgt_len)")
    p.add_argument("--warmup", type=int, default=2, help="segments read first to fill the memory")
    p.add_argument("--out", required=True, help="report directory (PNG plots, report.md, report.json)")
    common(p)
    p.set_defaults(func=cmd_diagnose)

    p = sub.add_parser("finetune", help="fine-tune an LM checkpoint on a task (classify, span, mlm)")
    p.add_argument("--task", required=True, choices=["classify", "mlm", "span"])
    p.add_argument("--data", required=True, help="training JSONL")
    p.add_argument("--valid", help="validation JSONL")
    p.add_argument("--checkpoint", required=True, help="LM checkpoint directory")
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--segment-len", type=int, help="segment length (default: the checkpoint's tgt_len)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--layer-lr-decay", type=float, default=0.8)
    p.add_argument("--head-only", action="store_true", help="train the task head only")
    p.add_argument("--pooling", default="last", choices=["last", "mean"])
    p.add_argument("--lm-weight", type=float, default=0.0, help="lambda of the joint LM loss")
    p.add_argument("--max-answer-len", type=int, default=64, help="span: longest answer in tokens")
    p.add_argument("--mask-rate", type=float, default=0.15, help="mlm: fraction of tokens chosen for masking")
    p.add_argument("--mask-token", help="mlm: the token standing for [MASK] (default: <unk>, or byte 0)")
    p.add_argument("--seed", type=int, default=0)
    common(p)
    p.set_defaults(func=cmd_finetune)

    p = sub.add_parser("data", help="generate task data")
    p.add_argument("kind", choices=["listops"])
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--train", type=int, default=2000)
    p.add_argument("--valid", type=int, default=200)
    p.add_argument("--test", type=int, default=200)
    p.add_argument("--min-length", type=int, default=500)
    p.add_argument("--max-length", type=int, default=2000)
    common(p)
    p.set_defaults(func=cmd_data)

    p = sub.add_parser("plot", help="training curves of runs against step and wall time")
    p.add_argument("runs", nargs="+", metavar="RUN_DIR")
    p.add_argument("--out", required=True, help="PNG file")
    p.add_argument("--bits", action="store_true", help="plot bits per token instead of nats")
    common(p)
    p.set_defaults(func=cmd_plot)
    return parser


def main(argv: list[str] | None = None) -> int:
    from longseq.data.batching import BatchingError
    from longseq.data.corpus import CorpusError
    from longseq.data.tokenizers import TokenizerError
    from longseq.interop.hf import ConversionError
    from longseq.train.checkpoint import CheckpointError
    from longseq.train.loop import TrainingError

    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        result = args.func(args)
    except (
        ConfigError,
        CorpusError,
        TokenizerError,
        CheckpointError,
        ConversionError,
        TrainingError,
        BatchingError,
        ValueError,
        FileNotFoundError,
    ) as exc:
        print(f"longseq {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"longseq {args.command}: interrupted", file=sys.stderr)
        return 130
    if result:
        _emit(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
