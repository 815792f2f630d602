"""One runner for the studies: learning curves of named variants over several seeds, scored alike, resumable.

Every variant trains the same base model on the same data for the same steps, once per seed; the validation
loss is logged every ``--eval-interval`` steps.  After training, each run's last checkpoint is scored on the
test split: bpc at its training setting, loss by position inside the segment with its memory and with it cut
to 0 (:func:`longseq.eval.context.per_position_losses`), and loss against evaluation memory with
``same_length`` (:func:`longseq.eval.context.context_curve`).  Per variant: mean, sample std and range over the
seeds; against the baseline variant, the gap and whether the ranges are apart.  The learning curves give, per
evaluation step, the gap between each variant and the baseline and whether the seeds' ranges separate there:
the budget at which a table can claim a difference.

The base run is ``base.toml`` (``--base``: any run config file, which may name a preset), with the vocabulary,
tokenizer, steps, validation interval and seed from the flags; the corpus's overrides and ``--set`` are laid over
it, then the variant.  Variants are the tables of ``variants/*.toml`` (``[NAME.model]``, ``[NAME.train]``, ...),
laid over the base with the project's own loader (:func:`longseq.config.files.apply_sections`);
``--variant NAME KEY=VALUE ...`` defines another on the command line.

Files under ``--out``: ``VARIANT/seedS/`` (the run: checkpoints, metrics.jsonl, result.json once scored),
``summary.json``, ``summary.md``, ``curves.png`` (validation bpc against step and against wall time, mean and
range over seeds), ``per_position.png``, ``context.png``, and with ``--set keep_last=N`` (history checkpoints)
``memory_share.png``: the share of attention mass in the memory against step (attention dilution).  A run with a
result.json is finished and reused; a run with a checkpoint but no result continues with ``--resume`` (and is
refused without it).  ``--store DIR`` (a folder under ``benchmarks/results``) keeps a copy of every finished run's
result.json as ``DIR/VARIANT/seedS/result.json`` (the loss by position thinned: :func:`store_copy`) and reuses what
it finds there, so that a table that takes several sessions survives a fresh clone (the checkpoints under ``--out``
do not travel, and are not committed);
``--summarize`` trains nothing, reads no corpus and summarizes the finished runs it finds, each variant over the
seeds it has.  ``--flops F`` trains every variant for the steps that spend F training FLOPs
(:func:`longseq.eval.speed.model_flops_per_token`), in place of ``--steps``: equal compute, not equal steps.  The
byte corpora (``ptb-bytes``, ``wt2-bytes``, ``shakespeare-bytes``: :mod:`texts`) give every tokenizer the same
bytes, so that a variant may read them with another (``[NAME.data] tokenizer = "bpe"``); their table compares
bits per byte over the whole test split, and RECL is measured among the variants of the corpus's own tokens.  The corpora are read from ``--data-root`` (default: the environment variable ``LONGSEQ_DATA``),
a folder holding ``ptb/`` and ``wikitext-2/``; the bundled tiny-shakespeare needs neither.

Usage::

    # XL (mem_len 128) against no memory on character PTB, 3 seeds; the same command continues after a stop
    python benchmarks/studies/runner.py --data-root ../shared/data --out runs/curves --steps 3000 --seeds 1 2 3 \\
        --variants xl no-memory --set keep_last=12 --resume
    # the memory-compaction ablation, its results kept in the repository
    python benchmarks/studies/runner.py --out runs/compaction --store benchmarks/results/compaction-ptb-char-3000 \\
        --steps 3000 --seeds 1 2 3 --baseline xl --set keep_last=12 --resume \\
        --variants xl compress-max compress-mean xl-pruned xl-int8 mem-tokens compress-conv compress-linear
    # the summary of the stored results alone: no corpus, no training (--out is where summary and plots go)
    python benchmarks/studies/runner.py --out /tmp/compaction --store benchmarks/results/compaction-ptb-char-3000 \\
        --steps 3000 --seeds 1 2 3 --baseline xl --set keep_last=12 --summarize \\
        --variants xl compress-max compress-mean xl-pruned xl-int8 mem-tokens compress-conv compress-linear
    # issue 43: learned chunks against the fixed hourglass, byte XL and BPE XL at equal training FLOPs, in bits per
    # byte (benchmarks/results/learned-chunks-flops/README.md)
    python benchmarks/studies/runner.py --data-root ../shared/data --corpus ptb-bytes --out runs/chunks-ptb-bytes \
        --flops 2.4e13 --baseline bytes-xl --variants bytes-xl bytes-fixed bytes-learned bpe-xl --resume
    # pilot (about a minute on 2 CPU cores)
    python benchmarks/studies/runner.py --out /tmp/curves-pilot --steps 60 --eval-interval 20 --seeds 1 \\
        --test-segments 20 --set n_layer=2

Each study's command, and what it found, is in the README.md beside its results under ``benchmarks/results/``.
"""

from __future__ import annotations

import argparse
import glob
import io
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

TREE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, TREE)  # this tree's longseq, not an installed one (a study run from another worktree)

from longseq import RunConfig  # noqa: E402
from longseq.api import train  # noqa: E402
from longseq.config import apply_overrides  # noqa: E402
from longseq.config.base import ConfigError, apply_values  # noqa: E402
from longseq.config.files import apply_sections, load_run_config, read_config_file  # noqa: E402
from longseq.data.corpus import load_corpus, load_ptb_char  # noqa: E402
from longseq.diagnostics import attention_layers, memory_attention_share  # noqa: E402
from longseq.diagnostics.chunks import chunk_statistics, read_boundaries  # noqa: E402
from longseq.eval import evaluate  # noqa: E402
from longseq.eval.context import context_curve, per_position_losses  # noqa: E402
from longseq.eval.recl import group_losses, recl  # noqa: E402
from longseq.eval.sliding import evaluate_sliding  # noqa: E402
from longseq.eval.speed import generate_speed, model_flops_per_token  # noqa: E402
from longseq.model.registry import unread_options  # noqa: E402
from longseq.train import load_checkpoint  # noqa: E402
from longseq.train.checkpoint import load_checkpoint_config  # noqa: E402
from longseq.train.signals import Interrupted  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from texts import NEEDS_NO_DATA as TEXTS_NEED_NO_DATA  # noqa: E402
from texts import TEXTS, text_folder  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
BASE = os.path.join(HERE, "base.toml")
DATA_ENV = "LONGSEQ_DATA"
CORPORA = {  # name -> (loader of the data root, tokenizer kind, overrides every variant gets)
    "ptb-char": (lambda root: load_ptb_char(os.path.join(root, "ptb")), "char", []),
    "ptb": (lambda root: load_corpus(os.path.join(root, "ptb"), "word"), "word", ["cutoffs=2000,5000"]),
    "wt2": (lambda root: load_corpus(os.path.join(root, "wikitext-2"), "word"), "word", ["cutoffs=2000,10000"]),
    "wt2-char": (lambda root: load_corpus(os.path.join(root, "wikitext-2"), "char"), "char", []),
    # the bundled corpus of the default preset (90/5/5): with --steps 1200 --set mem_len=64 warmup_steps=100 the
    # base model is the tiny-shakespeare preset, where a recipe must hold before it becomes the preset's default
    "shakespeare": (lambda root: load_corpus(None, "char"), "char", []),
    # the same bytes for every tokenizer (texts.py): byte models and a BPE model scored alike, in bits per byte
    **{name: (None, "byte", []) for name in TEXTS},
}
NEEDS_NO_DATA = ("shakespeare", *TEXTS_NEED_NO_DATA)
BASELINE = "no-memory"


def data_root(given: str | None) -> str:
    """The folder of the corpora: ``--data-root``, else ``$LONGSEQ_DATA``; an error names both when neither is set."""
    root = given or os.environ.get(DATA_ENV)
    if not root:
        raise SystemExit(f"this corpus is read from disk: pass --data-root DIR or set {DATA_ENV}=DIR (a folder "
                         "holding ptb/ and wikitext-2/)")  # fmt: skip
    if not os.path.isdir(root):
        raise SystemExit(f"the data root {root} (from --data-root or {DATA_ENV}) is not a folder")
    return root


def load_named_corpus(name: str, root: str | None, work: str | None = None, tokenizer: str | None = None,
                      vocab_size: int | None = None):  # fmt: skip
    """Corpus ``name`` read from ``root`` (see :func:`data_root`); the bundled one needs no root.  A byte corpus
    (:mod:`texts`) is derived under ``work`` (default: the temporary folder) and read with ``tokenizer`` (default:
    bytes) and ``vocab_size`` (a BPE's)."""
    root = None if name in NEEDS_NO_DATA else data_root(root)
    if name in TEXTS:
        folder = text_folder(name, root, work or os.path.join(tempfile.gettempdir(), "longseq-study-texts"))
        return load_corpus(folder, tokenizer or "byte", vocab_size=vocab_size)
    return CORPORA[name][0](root)


def variant_corpus(args, run: RunConfig, corpus):
    """The corpus a variant reads: the study's, or, for a variant with another tokenizer on a byte corpus (a BPE
    model), the same text read with its tokenizer (loaded once)."""
    if corpus is None or run.data.tokenizer == CORPORA[args.corpus][1]:
        return corpus
    if args.corpus not in TEXTS:
        raise SystemExit(f"a variant with tokenizer={run.data.tokenizer} needs a corpus every tokenizer reads alike: "
                         f"--corpus {' or '.join(TEXTS)}")  # fmt: skip
    key = (run.data.tokenizer, run.data.vocab_size)
    if key not in args.corpora:
        args.corpora[key] = load_named_corpus(args.corpus, args.data_root, args.out, *key)
    return args.corpora[key]


def variant_setup(args, name: str, seed: int, corpus) -> tuple[RunConfig, object]:
    """The run of variant ``name`` at ``seed`` and the corpus it reads (``corpus`` None: summarizing)."""
    if corpus is None:
        return None, None
    run = variant_run(args, name, seed, corpus.tokenizer.vocab_size)
    own = variant_corpus(args, run, corpus)
    return (run if own is corpus else variant_run(args, name, seed, own.tokenizer.vocab_size)), own


def load_variants(folder: str = os.path.join(HERE, "variants")) -> dict[str, dict]:
    """Every variant of ``folder/*.toml``: name -> its tables (``{"model": {...}, "train": {...}}``) and its file."""
    variants: dict[str, dict] = {}
    for path in sorted(glob.glob(os.path.join(folder, "*.toml"))):
        for name, tables in read_config_file(path).items():
            if name in variants:
                raise SystemExit(f"variant {name!r} is defined in {variants[name]['file']} and in {path}")
            if not isinstance(tables, dict) or set(tables) - {"model", "data", "train"}:
                raise SystemExit(f"{path}: variant {name!r} must hold [{name}.model], [{name}.data] or [{name}.train]")
            variants[name] = {"tables": tables, "file": path, "overrides": as_overrides(tables)}
    return variants


def as_overrides(tables: dict) -> list[str]:
    """A variant's tables as ``key=value`` strings (what result.json records, as ``--variant`` would take them)."""

    def text(value) -> str:
        if isinstance(value, bool):
            return "true" if value else "false"
        return ",".join(map(str, value)) if isinstance(value, list) else str(value)

    return [f"{key}={text(value)}" for section in tables.values() for key, value in section.items()]


VARIANTS = load_variants()


def base_run(args, seed: int, tokenizer: str, vocab: int) -> RunConfig:
    """``--base`` with what the flags set: vocabulary, tokenizer, steps, validation interval and seed."""
    run = load_run_config(args.base)
    items = [("model.vocab_size", vocab), ("data.tokenizer", tokenizer), ("train.max_steps", args.steps),
             ("train.eval_interval", args.eval_interval), ("train.eval_max_segments", args.eval_segments),
             ("train.seed", seed)]  # fmt: skip
    return RunConfig(**apply_values(run.sections(), items))


def variant_run(args, name: str, seed: int, vocab: int) -> RunConfig:
    """The run of variant ``name`` at ``seed``: the base, the corpus's overrides and ``--set``, then the variant."""
    _, tokenizer, corpus_overrides = CORPORA[args.corpus]
    run = base_run(args, seed, tokenizer, vocab)
    run = RunConfig(**apply_overrides(run.sections(), [*corpus_overrides, *args.set]))
    variant = args.variant_overrides[name]
    try:
        if "tables" in variant:
            run = apply_sections(run, variant["tables"], f"{variant['file']} [{name}]")
        else:
            run = RunConfig(**apply_overrides(run.sections(), variant["overrides"]))
    except ConfigError as exc:
        raise SystemExit(f"variant {name}: {exc}") from None
    sets_steps = any(o.startswith(("max_steps=", "train.max_steps=")) for o in [*args.set, *variant["overrides"]])
    window = run.model.segments_per_step
    if args.flops:  # equal training FLOPs: the steps that spend the budget
        run.train.max_steps = max(1, round(args.flops / train_flops_per_step(run)))
    elif window > 1 and not sets_steps:
        run.train.max_steps = args.steps // window  # a step reads `window` segments: equal tokens, fewer steps
    return run


def train_flops_per_step(run: RunConfig, chunk_length: float | None = None) -> float:
    """Training FLOPs of one optimizer step (:func:`longseq.eval.speed.model_flops_per_token`, at the target chunk
    length unless ``chunk_length`` is given): attention stacks and hourglasses are counted, other mixers refused."""
    m, d = run.model, run.data
    if set(m.layer_mixers) != {"attention"}:
        raise SystemExit(f"--flops counts attention stacks (and hourglasses) only, not mixer={m.layer_mixers}")
    per_token = model_flops_per_token(m, d.tgt_len, m.memory.mem_len, d.batch_size, chunk_length=chunk_length)
    return per_token["train"] * d.batch_size * d.tgt_len * m.segments_per_step


def write_json(path: str, data) -> None:
    """Write atomically (a killed run never leaves half a result) and compactly (the stores are committed)."""
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, separators=(",", ":"))  # compact: stored results stay small
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_curve(run_dir: str, per_byte: bool = False) -> list[tuple[int, float, float]]:
    """(step, elapsed seconds, validation loss) of every validation record of a run; ``per_byte``: the loss in
    nats per byte (a byte corpus, where models of different tokenizers compare)."""
    key = "valid_bpb" if per_byte else "valid_loss"
    scale = math.log(2) if per_byte else 1.0
    return [(r["step"], r.get("elapsed_s", math.nan), r[key] * scale) for r in read_metrics(run_dir) if key in r]


def read_metrics(run_dir: str) -> list[dict]:
    with open(os.path.join(run_dir, "metrics.jsonl"), encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def training_speed(trained, run_dir: str) -> float:
    """Training tokens/s of the last session that trained: the trainer's figure, or, when this session resumed a
    run whose steps were all done (it was stopped while being scored) and so trained nothing, the last logged
    session average (logged tokens/s are averages since the session began)."""
    if trained.tokens_per_s > 0:
        return trained.tokens_per_s
    logged = [r["tokens_per_s"] for r in read_metrics(run_dir) if r.get("tokens_per_s")]
    return logged[-1] if logged else math.nan


def score(model, run: RunConfig, corpus, args) -> dict:
    """Test bpc at the training setting, the per-position curves and the context curve (nats).  The vanilla model
    (absolute positions) is scored the paper's way, one window of its training length per target; it reads no
    memory, so its context curve is its segment loss at every context; a stack of recurrent layers only (ssm, conv,
    rnn) carries a state that no ``mem_len`` changes, so one pass gives its whole context curve.  The context curve
    varies the attention memory only: a compressed memory, memory tokens or a hybrid's recurrent states are kept at
    every point (its ``kept``), so for those variants "memory 0" is not the segment alone."""
    common = dict(tgt_len=run.data.eval_tgt_len, batch_size=run.data.eval_batch_size, max_segments=args.test_segments)
    # on a byte corpus, bits per byte over the whole test split: the same bytes for every tokenizer
    whole = {"max_segments": 0, "tokenizer": corpus.tokenizer} if args.corpus in TEXTS else {}
    test = evaluate(model, corpus.test, **{**common, **whole}, bits_unit="bpc")
    positions = per_position_losses(model, corpus.test, **common, skip_segments=args.skip_segments)
    if run.model.positions.pos == "absolute":
        segments = test
        max_targets = args.test_segments * common["batch_size"] * common["tgt_len"]
        test = evaluate_sliding(
            model, corpus.test, context=run.data.tgt_len, batch_size=64, max_targets=max_targets, bits_unit="bpc"
        )
        curve = {"contexts": list(args.contexts), "loss": [segments["loss"]] * len(args.contexts), "no_memory": True}
        test["segments_bpc"] = segments["bpc"]
    elif not reads_memory_length(run):  # a recurrent state does not depend on mem_len: one pass gives every point
        loss = evaluate(model, corpus.test, **common, skip_segments=args.skip_segments)["loss"]
        curve = {"contexts": list(args.contexts), "loss": [loss] * len(args.contexts), "one_pass": True}
    else:
        curve = context_curve(model, corpus.test, args.contexts, **common, skip_segments=args.skip_segments)
    speed = {
        "eval_ms_per_token": 1000 / test["tokens_per_s"],  # the test pass above: eval_batch_size streams
        # 128 greedy tokens after 512: a model without memory keeps its segment's worth of keys (what it trained on)
        "generate_tokens_per_s": generate_speed(
            model, prompt_len=512, new_tokens=128, mem_len=max(run.model.memory.mem_len, run.data.tgt_len)
        )["tokens_per_s"],
    }
    return {"test": test, "per_position": positions, "context_curve": curve, "memory_share": share(model, run, corpus),
            "speed": speed}  # fmt: skip


def spent(model, run: RunConfig, corpus, args) -> dict:
    """With ``--flops``: the training FLOPs of a step and of the run, and for learned or entropy chunks, where the
    model cuts the first ``CHUNK_TOKENS`` test tokens (:func:`longseq.diagnostics.chunks.chunk_statistics`) and the
    run's FLOPs at the mean chunk length measured there (the budget assumed the target)."""
    if not args.flops:
        return {}
    per_step = train_flops_per_step(run)
    out = {"train_flops_per_step": per_step, "train_flops": per_step * run.train.max_steps, "chunks": None}
    if run.model.hourglass.dynamic:
        ids = corpus.test[:CHUNK_TOKENS]
        starts = read_boundaries(model, torch.as_tensor(np.asarray(ids, dtype=np.int64)), run.data.eval_tgt_len)
        text = np.asarray(ids, dtype=np.uint8).tobytes() if corpus.tokenizer.kind == "byte" else bytes(len(ids))
        chunks = chunk_statistics(text, starts, run.model.coarse_mem())  # where words begin: bytes only
        out["chunks"] = chunks
        out["train_flops_measured"] = train_flops_per_step(run, chunks["mean_length"]) * run.train.max_steps
    return out


CHUNK_TOKENS = 16384


def reads_memory_length(run: RunConfig) -> bool:
    """Whether the evaluation ``mem_len`` reaches the model: it has an attention layer (or an hourglass block)."""
    return any(m == "attention" for m in run.model.layer_mixers) or bool(run.model.hourglass.shorten_layers)


def share(model, run: RunConfig, corpus) -> dict | None:
    """Share of attention mass in the memory per (attention layer, head), 8 test segments of 4 streams (None: no
    memory, or no attention layer).  A hybrid stack's ssm, conv and rnn layers have no attention map, and an
    hourglass block's shortened layers are not read (:func:`longseq.diagnostics.report.attention_layers`)."""
    if not run.model.memory.mem_len or not attention_layers(model):
        return None
    return memory_attention_share(model, corpus.test, tgt_len=run.data.eval_tgt_len, batch_size=4, segments=8)


def share_history(out: str, corpus, device: str) -> list[tuple[int, float]]:
    """(step, memory share averaged over layers and heads) of every checkpoint kept under ``out/history`` (runs
    with ``--set keep_last=N``): attention dilution over the memory as training goes on."""
    history = os.path.join(out, "history")
    points = []
    for name in sorted(os.listdir(history)) if os.path.isdir(history) else []:
        model, _, run, _ = load_checkpoint(os.path.join(history, name), device=device)
        measured = share(model, run, corpus)
        if measured is not None:
            points.append((int(name.split("-")[-1]), float(np.mean(measured["memory_share"]))))
    return points


def scoring(args) -> dict:
    """The settings a finished run was scored with, beside its training config."""
    return {"test_segments": args.test_segments, "skip_segments": args.skip_segments, "contexts": list(args.contexts)}


def read_config(run: RunConfig) -> dict:
    """The run's config without the model options its architecture does not read (``unread_options``: an
    hourglass's options in a model without one, say), whose defaults may change between versions without changing
    what the run trains."""
    out = run.to_dict()
    for path in unread_options(run.model):
        *parents, leaf = path.split(".")
        section = out["model"]
        for parent in parents:
            section = section[parent]
        section.pop(leaf, None)
    return out


def reuse(path: str, name: str, seed: int, corpus, args, log) -> dict:
    """A finished run's result, refused when it was trained with another config than the variant's or scored
    otherwise.  Without a corpus (``--summarize``) the vocabulary size is the stored run's: the rest is checked."""
    with open(path, encoding="utf-8") as f:
        result = json.load(f)
    if corpus is not None:
        run = variant_setup(args, name, seed, corpus)[0]
    else:
        run = variant_run(args, name, seed, result["run"]["model"]["vocab_size"])
    stored = RunConfig.from_dict(result["run"])  # fields added since: defaults, or as the run ran
    if read_config(stored) != read_config(run):
        raise SystemExit(f"{path} was trained with another config; use another --out (--store) or remove it")
    if result.get("scoring", scoring(args)) != scoring(args):  # results from before the key: taken as they are
        raise SystemExit(
            f"{path} was scored with {result['scoring']}, not {scoring(args)}; use another --out (--store)"
        )
    log(f"{name} seed {seed}: finished, reused ({path})")
    return result


def keep(stored: str, result: dict) -> None:
    """Copy a finished run's result into the ``--store`` folder (:func:`store_copy`)."""
    os.makedirs(os.path.dirname(stored), exist_ok=True)
    write_json(stored, store_copy(result))


def store_copy(result: dict) -> dict:
    """What ``--store`` keeps of a run's result (the stores are committed): all of it but the loss at every position
    of the segment, of which it keeps the bands the summary reads (:func:`position_bands`, from every position) and
    the positions 0, 1, 2, 4, 8, ... and the last, for the figure; the validation curve's wall times to 0.1 s and the
    memory share's history to 4 decimals (the figures').  A summary reads every run in this form, stored or not."""
    positions, keys = result["per_position"], ("loss_memory", "loss_no_memory")
    if "bands" not in positions:
        last = len(positions["positions"]) - 1
        kept = [i for i, p in enumerate(positions["positions"]) if p & (p - 1) == 0 or i == last]
        thinned = {key: [positions[key][i] for i in kept] for key in ("positions", *keys)}
        rest = {key: value for key, value in positions.items() if key != "tokens"}
        positions = {**rest, **thinned, "bands": {key: position_bands(positions[key]) for key in keys}}
    out = {**result, "per_position": positions, "curve": [[s, round(t, 1), loss] for s, t, loss in result["curve"]]}
    if result.get("share_history"):
        out["share_history"] = [[step, round(share, 4)] for step, share in result["share_history"]]
    return out


def run_one(name: str, seed: int, corpus, args, log) -> dict | None:
    """Train (or resume, or reuse) one variant at one seed and score it (``--summarize``: reuse, or None)."""
    out = os.path.join(args.out, name, f"seed{seed}")
    result_path = os.path.join(out, "result.json")
    stored = os.path.join(args.store, name, f"seed{seed}", "result.json") if args.store else None
    for path in (result_path, stored):
        if path and os.path.exists(path):
            result = reuse(path, name, seed, corpus, args, log)
            if stored and not os.path.exists(stored):  # finished before this store was named: keep it there too
                keep(stored, result)
            return result
    if args.summarize:
        log(f"{name} seed {seed}: not finished, left out of the summary")
        return None
    run, corpus = variant_setup(args, name, seed, corpus)
    overrides = args.variant_overrides[name]["overrides"]
    config = run.to_dict()
    resume = os.path.isdir(os.path.join(out, "last"))
    if resume and not args.resume:
        raise SystemExit(f"{out} holds an unfinished run: pass --resume to continue it, or remove it")
    if resume and load_checkpoint_config(os.path.join(out, "last")).to_dict() != config:
        raise SystemExit(f"{out} holds a run of another config; use another --out or remove it")
    log(f"{name} seed {seed}: {'resuming' if resume else 'training'} ({' '.join(overrides)})")
    began, cpu = time.perf_counter(), time.process_time()
    # the study's files set the options (base.toml's mem_len serves attention and ssm stacks alike): one a stack
    # does not read is said in the log, not refused
    trained = train(run, out, resume=resume, corpus=corpus, progress=False, log=log, file_config=run)
    train_cpu = time.process_time() - cpu  # CPU seconds: what a run costs on one thread, whatever else ran
    model, _, saved, _ = load_checkpoint(os.path.join(out, "last"))
    model.to(args.device)
    result = {
        "variant": name, "seed": seed, "overrides": overrides, "run": config, "scoring": scoring(args),
        "params": model.num_parameters(), "step": trained.step, "session_train_s": time.perf_counter() - began,
        "session_train_cpu_s": train_cpu,
        "train_tokens_per_s": training_speed(trained, out), "curve": read_curve(out, args.corpus in TEXTS), **score(model, saved, corpus, args),
        "share_history": share_history(out, corpus, args.device), **spent(model, saved, corpus, args),
    }  # fmt: skip
    result["session_cpu_s"] = time.process_time() - cpu  # training and scoring
    if result["memory_share"] is not None and result["share_history"]:  # the last checkpoint closes the series
        result["share_history"].append((trained.step, float(np.mean(result["memory_share"]["memory_share"]))))
    write_json(result_path, result)
    if stored:
        keep(stored, result)
    bpb = f", bpb {result['test']['bpb']:.4f}" if "bpb" in result["test"] else ""
    log(
        f"{name} seed {seed}: test {bits_name(args.corpus)} {result['test']['bpc']:.4f}, ppl {result['test']['ppl']:.2f}{bpb}"
    )
    return result


def stats(values) -> dict:
    v = np.asarray(values, dtype=np.float64)
    return {
        "mean": float(v.mean()),
        "std": float(v.std(ddof=1)) if v.size > 1 else 0.0,
        "min": float(v.min()),
        "max": float(v.max()),
        "n": int(v.size),
    }


def apart(a: dict, b: dict) -> bool:
    """True when the seeds' ranges of two stats do not overlap (with one seed each: never claimed)."""
    return min(a["n"], b["n"]) > 1 and (a["max"] < b["min"] or b["max"] < a["min"])


BITS = 1 / math.log(2)
SPEED = ("eval_ms_per_token", "generate_tokens_per_s")


def position_bands(loss: list[float]) -> dict:
    """bpc at the first position, over the first eighth of the segment, its middle half and all of it."""
    n = len(loss)
    first, middle = loss[: max(1, n // 8)], loss[n // 4 : max(n // 4 + 1, 3 * n // 4)]
    return {
        "pos0": loss[0] * BITS,
        "first_eighth": float(np.mean(first)) * BITS,
        "middle_half": float(np.mean(middle)) * BITS,
        "all": float(np.mean(loss)) * BITS,
    }


def bits_name(corpus: str) -> str:
    """What the results' ``bpc`` key (loss / ln 2 per token) is for this corpus."""
    return "bpc" if CORPORA[corpus][1] in ("char", "byte") else "bits per word"


def summarize_variant(results: list[dict]) -> dict:
    """Mean, std and range over seeds of the test bpc, the per-position bands and the context curve (bpc)."""
    bands = {key: [r["per_position"]["bands"][key] for r in results] for key in ("loss_memory", "loss_no_memory")}
    curves = np.array([r["context_curve"]["loss"] for r in results]) * BITS  # (seeds, contexts)
    return {
        "seeds": [r["seed"] for r in results],
        "overrides": results[0]["overrides"],
        "params": results[0]["params"],
        "test_bpc": stats([r["test"]["bpc"] for r in results]),
        "test_ppl": stats([r["test"]["ppl"] for r in results]),
        "per_position_bpc": {
            key: {band: stats([b[band] for b in per_seed]) for band in per_seed[0]} for key, per_seed in bands.items()
        },
        "context_curve_bpc": {
            "contexts": results[0]["context_curve"]["contexts"],
            "by_context": [stats(curves[:, i]) for i in range(curves.shape[1])],
        },
        "train_tokens_per_s": stats([r["train_tokens_per_s"] for r in results]),
        **{key: stats([r["speed"][key] for r in results]) for key in SPEED if all("speed" in r for r in results)},
        "memory_share_by_layer": layer_shares(results),
        **(
            {"test_bpb": stats([r["test"]["bpb"] for r in results])} if all("bpb" in r["test"] for r in results) else {}
        ),
        **spent_summary(results),
    }


def spent_summary(results: list[dict]) -> dict:
    """With ``--flops``: steps, training FLOPs and, for learned or entropy chunks, the mean chunk length measured
    on the test text and the FLOPs at it, over the seeds."""
    if not all("train_flops" in r for r in results):
        return {}
    out = {"steps": stats([r["step"] for r in results]), "train_flops": stats([r["train_flops"] for r in results])}
    if all(r.get("chunks") for r in results):
        out["mean_chunk_length"] = stats([r["chunks"]["mean_length"] for r in results])
        out["train_flops_measured"] = stats([r["train_flops_measured"] for r in results])
    return out


def layer_shares(results: list[dict]) -> dict | None:
    """The memory share of every layer, mean over heads and seeds, and the uniform share (None: no memory)."""
    if results[0]["memory_share"] is None:
        return None
    shares = np.array([r["memory_share"]["memory_share"] for r in results])  # (seeds, L, H)
    return {
        "mean_over_heads": shares.mean(axis=(0, 2)).tolist(),
        "uniform_share": results[0]["memory_share"]["uniform_share"],
    }


def token_steps(result: dict) -> list[tuple[int, float, float]]:
    """A run's validation curve with its steps counted in one-segment steps, so that curves compare at equal
    tokens: a step of the mem-tokens variant reads 2 segments, so its step 750 stands at 1,500.  A run of a
    ``--flops`` study counts training FLOPs instead."""
    if "train_flops_per_step" in result:
        return [(step * result["train_flops_per_step"], elapsed, loss) for step, elapsed, loss in result["curve"]]
    window = RunConfig.from_dict(result["run"]).model.segments_per_step
    return [(step * window, elapsed, loss) for step, elapsed, loss in result["curve"]]


def curve_gaps(by_variant: dict[str, list[dict]], baseline: str) -> dict:
    """Per variant, at every validation step all its seeds and the baseline's logged (steps of one segment: equal
    tokens, :func:`token_steps`): the mean validation bpc of both, the relative gap (positive: the variant is
    better) and whether the seeds' ranges are apart."""
    if baseline not in by_variant:
        return {}

    def at_steps(results):
        table = {}
        for r in results:
            for step, _, loss in token_steps(r):
                table.setdefault(step, []).append(loss * BITS)
        return {s: v for s, v in table.items() if len(v) == len(results)}

    base = at_steps(by_variant[baseline])
    gaps = {}
    for name, results in by_variant.items():
        if name == baseline:
            continue
        rows = []
        for step, values in sorted(at_steps(results).items()):
            if step in base:
                a, b = stats(values), stats(base[step])
                rows.append({"step": step, "bpc": a["mean"], "baseline_bpc": b["mean"],
                             "gap_pct": 100 * (b["mean"] - a["mean"]) / b["mean"], "apart": apart(a, b)})  # fmt: skip
        gaps[name] = rows
    return gaps


def save_figure(fig, path: str) -> None:
    """A PNG in 64 colours (a quarter of the bytes of matplotlib's; the plots have a few line colours only), so that
    the plots kept under ``benchmarks/results`` stay small."""
    from PIL import Image

    buffer = io.BytesIO()
    fig.savefig(buffer, dpi=100, format="png")
    image = Image.open(buffer).convert("RGB")
    image.quantize(colors=64, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(path, optimize=True)


def plot_curves(by_variant: dict[str, list[dict]], path: str, unit: str = "bpc") -> None:
    """Validation bpc against step (left) and wall time (right): the mean over seeds, the range shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for name, results in by_variant.items():
        steps = sorted({s for r in results for s, _, _ in token_steps(r)})
        values = {s: [] for s in steps}
        times = {s: [] for s in steps}
        for r in results:
            for s, t, loss in token_steps(r):
                values[s].append(loss * BITS)
                times[s].append(t)
        full = [s for s in steps if len(values[s]) == len(results)]
        mean = [np.mean(values[s]) for s in full]
        low, high = [min(values[s]) for s in full], [max(values[s]) for s in full]
        clock = [np.nanmean(times[s]) for s in full]
        for ax, x in ((axes[0], full), (axes[1], clock)):
            line = ax.plot(x, mean, "o-", markersize=3, label=f"{name} ({len(results)} seeds)")[0]
            ax.fill_between(x, low, high, color=line.get_color(), alpha=0.2)
    flops = all("train_flops_per_step" in r for results in by_variant.values() for r in results)
    axes[0].set_xlabel("training FLOPs" if flops else "step (one segment a step: equal tokens)")
    axes[1].set_xlabel("wall time (s, mean over seeds; validation included)")
    axes[0].set_ylabel(f"validation {unit}")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def plot_final(by_variant: dict[str, list[dict]], out_dir: str, unit: str = "bpc") -> list[str]:
    """The per-position curves (with memory solid, memory cut dashed) and the context curves, mean over seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    fig2, ax2 = plt.subplots(figsize=(7, 4))
    for name, results in by_variant.items():
        positions = results[0]["per_position"]["positions"]
        memory = np.mean([r["per_position"]["loss_memory"] for r in results], 0) * BITS
        line = ax.plot(positions, memory, "-", label=f"{name}, with its memory")[0]
        if results[0]["run"]["model"]["memory"]["mem_len"]:
            cut = np.mean([r["per_position"]["loss_no_memory"] for r in results], 0) * BITS
            ax.plot(positions, cut, "--", color=line.get_color(), label=f"{name}, memory cut to 0")
        contexts = results[0]["context_curve"]["contexts"]
        ax2.plot(contexts, np.mean([r["context_curve"]["loss"] for r in results], 0) * BITS, "o-", label=name)
    _plot_share_history(plt, by_variant, out_dir)
    ax.set_xlabel("position inside the segment")
    ax.set_ylabel(f"test {unit} (mean over seeds)")
    ax2.set_xlabel("evaluation memory (same_length)")
    ax2.set_ylabel(f"test {unit} (mean over seeds)")
    names = []
    for figure, axis, file in ((fig, ax, "per_position.png"), (fig2, ax2, "context.png")):
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
        figure.tight_layout()
        save_figure(figure, os.path.join(out_dir, file))
        plt.close(figure)
        names.append(file)
    return names


def _plot_share_history(plt, by_variant: dict[str, list[dict]], out_dir: str) -> None:
    """memory_share.png: memory share against step, one line per run, when history checkpoints were kept."""
    runs = [(name, r) for name, results in by_variant.items() for r in results if r.get("share_history")]
    if not runs:
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, r in runs:
        steps, values = zip(*r["share_history"])
        ax.plot(steps, values, "o-", markersize=3, label=f"{name} seed {r['seed']}")
    ax.set_xlabel("step")
    ax.set_ylabel("attention mass in the memory")
    ax.set_title("share of attention mass in the memory (full memory; mean over layers and heads)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, os.path.join(out_dir, "memory_share.png"))
    plt.close(fig)


def markdown(summary: dict) -> str:
    """summary.md: test bpc, position bands, context curve, memory share, where the curves separate; speed."""
    fmt = lambda s: f"{s['mean']:.4f} ± {s['std']:.4f} [{s['min']:.4f}, {s['max']:.4f}]"  # noqa: E731
    key = f"test_{summary.get('metric', 'bpc')}"  # bpb on a byte corpus: models of different tokenizers compare
    unit = "bits per byte" if key == "test_bpb" else bits_name(summary["meta"]["corpus"])
    words = unit == "bits per word"  # and the perplexity that the word-level papers quote
    ppl_head = " test ppl mean ± std |" if words else ""
    lines = [f"| variant | overrides | seeds | test {unit} mean ± std [min, max] |{ppl_head} gap to baseline | ranges apart |",
             "|---|---|---:|---|" + ("---:|" if words else "") + "---:|---|"]  # fmt: skip
    variants = summary["variants"]
    base = variants.get(summary["baseline"])
    for name, v in variants.items():
        gap, sep = "", ""
        if base is not None and name != summary["baseline"]:
            gap = f"{100 * (base[key]['mean'] - v[key]['mean']) / base[key]['mean']:+.2f}%"
            sep = "yes" if apart(v[key], base[key]) else "no"
        ppl = f" {v['test_ppl']['mean']:.2f} ± {v['test_ppl']['std']:.2f} |" if words else ""
        lines.append(f"| {name} | {' '.join(v['overrides'])} | {v[key]['n']} | {fmt(v[key])} |{ppl} {gap} | {sep} |")
    lines += flops_lines(variants)
    lines += [
        "",
        "| variant | curve | position 0 | first eighth | middle half | all positions |",
        "|---|---|---|---|---|---|",
    ]
    for name, v in variants.items():
        for key, label in (("loss_memory", "with memory"), ("loss_no_memory", "memory cut to 0")):
            bands = v["per_position_bpc"][key]
            lines.append(
                f"| {name} | {label} | "
                + " | ".join(f"{bands[b]['mean']:.4f} ± {bands[b]['std']:.4f}" for b in bands)
                + " |"
            )
    contexts = next(iter(variants.values()))["context_curve_bpc"]["contexts"]
    lines += [
        "",
        "| variant | " + " | ".join(f"memory {c}" for c in contexts) + " |",
        "|---" * (len(contexts) + 1) + "|",
    ]
    for name, v in variants.items():
        cells = [f"{s['mean']:.4f} ± {s['std']:.4f}" for s in v["context_curve_bpc"]["by_context"]]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "| variant | memory share per layer (mean over heads and seeds) | uniform share |", "|---|---|---:|"]
    for name, v in variants.items():
        if v["memory_share_by_layer"]:
            per_layer = " / ".join(f"{x:.3f}" for x in v["memory_share_by_layer"]["mean_over_heads"])
            lines.append(f"| {name} | {per_layer} | {v['memory_share_by_layer']['uniform_share']:.3f} |")
    lines += gap_lines(summary) + speed_lines(variants) + recl_lines(summary)
    return "\n".join(lines) + "\n"


def gap_lines(summary: dict) -> list[str]:
    """Where the validation curves separate from the baseline's (none with ``--flops``: steps differ)."""
    if not summary["curve_gaps"]:
        return []
    lines = ["", "| variant | first step from which the ranges stay apart | gap there | gap at the last step |",
             "|---|---:|---:|---:|"]  # fmt: skip
    for name, rows in summary["curve_gaps"].items():
        first = next((i for i in range(len(rows)) if all(r["apart"] for r in rows[i:])), None)
        at = f"{rows[first]['step']}" if first is not None else "never"
        gap = f"{rows[first]['gap_pct']:+.2f}%" if first is not None else ""
        last = f"{rows[-1]['gap_pct']:+.2f}%" if rows else ""
        lines.append(f"| {name} | {at} | {gap} | {last} |")
    return lines


def flops_lines(variants: dict) -> list[str]:
    """With ``--flops``: each variant's steps and training FLOPs, and for learned or entropy chunks the mean chunk
    length on the test text with the FLOPs the run spent at it (the steps were set at the target length)."""
    if not all("train_flops" in v for v in variants.values()):
        return []
    lines = ["", "| variant | steps | training FLOPs | mean chunk length (test) | FLOPs at that length |",
             "|---|---:|---:|---:|---:|"]  # fmt: skip
    for name, v in variants.items():
        chunks = v.get("mean_chunk_length")
        length = f"{chunks['mean']:.2f} ± {chunks['std']:.2f}" if chunks else ""
        measured = f"{v['train_flops_measured']['mean']:.3g}" if chunks else ""
        lines.append(f"| {name} | {v['steps']['mean']:.0f} | {v['train_flops']['mean']:.3g} | {length} | {measured} |")
    return lines


def speed_lines(variants: dict) -> list[str]:
    """Parameters and speed per variant: means over the seeds, each timed inside its run (training tokens/s over
    the last session that trained it, the whole run when uninterrupted; the test pass; 128 generated tokens), so
    only as steady as the machine was meanwhile."""
    lines = [
        "",
        "| variant | parameters | train tokens/s | eval ms/token | generate tokens/s |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, v in variants.items():
        cells = [f"{v[key]['mean']:.3g}" if key in v else "" for key in ("train_tokens_per_s", *SPEED)]
        lines.append(f"| {name} | {v['params']:,} | " + " | ".join(cells) + " |")
    return lines


def recl_lines(summary: dict) -> list[str]:
    """RECL per variant and seed, shown only where the variant's test bpc is apart from the baseline's over the
    seeds (the issue: RECL only at budgets where the models differ by more than their seed spread)."""
    if not summary.get("recl"):
        return []
    variants, base = summary["variants"], summary["variants"].get(summary["baseline"])
    key = f"test_{summary.get('metric', 'bpc')}"
    separated = {
        name: base is not None and name != summary["baseline"] and apart(v[key], base[key])
        for name, v in variants.items()
    }
    separated[summary["baseline"]] = any(separated.values())  # the baseline is shown beside any separated variant
    lines = ["", "| variant | RECL r=0.1 / 0.5 / 1.0, per seed |", "|---|---|"]
    for name, by_r in summary["recl"]["by_variant"].items():
        if not by_r:  # another tokenizer: another token stream, outside the group
            lines.append(f"| {name} | not measured: its tokens are not the group's |")
            continue
        shown = separated.get(name, False)
        cells = " / ".join(str(by_r[k]) for k in ("r0.1", "r0.5", "r1"))
        lines.append(f"| {name} | {cells if shown else 'not reported: within the seed spread of the baseline'} |")
    return lines


def group_recl(args, corpus, log) -> dict:
    """RECL (r = 0.1, 0.5, 1) of the group of variants at every seed, on the first ``--recl-tokens`` test targets
    after the longest context: ``{variant: {r: [RECL at each seed]}}``."""
    contexts = sorted({16, 32, 64, 128, 256, 512})
    out: dict = {name: {} for name in args.variant_overrides}
    for seed in args.seeds:
        models = {}
        for name in args.variant_overrides:
            model, _, run, _ = load_checkpoint(os.path.join(args.out, name, f"seed{seed}", "last"), device=args.device)
            if run.data.tokenizer != CORPORA[args.corpus][1]:  # RECL compares losses token by token
                log(f"RECL: {name} reads another tokenizer's tokens ({run.data.tokenizer}), left out of the group")
                continue
            models[name] = (model, run)
        log(f"RECL of the group at seed {seed}")
        losses = group_losses(models, corpus.test, contexts, max_targets=args.recl_tokens)
        for r in (0.1, 0.5, 1.0):
            for name, value in recl(losses, r=r).items():
                out[name].setdefault(f"r{r:g}", []).append(value)
    return {"contexts": contexts, "tokens": args.recl_tokens, "by_variant": out}


def machine() -> dict:
    cpu = ""
    try:
        cpu = next(
            (
                line.split(":", 1)[1].strip()
                for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()
                if line.startswith("Model name")
            ),
            "",
        )
    except OSError:
        pass
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {"cpu": cpu or platform.processor(), "gpu": gpu, "torch": torch.__version__, "threads": torch.get_num_threads(),
            "date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv)}  # fmt: skip


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="directory of the runs and the summary")
    parser.add_argument("--corpus", default="ptb-char", choices=sorted(CORPORA))
    parser.add_argument("--data-root", help=f"the folder holding ptb/ and wikitext-2/ (default: ${DATA_ENV})")
    parser.add_argument("--base", default=BASE, help="the base run config file (TOML or JSON; may name a preset)")
    parser.add_argument("--variants", nargs="+", help=f"names among {sorted(VARIANTS)} (default: xl no-memory, unless "
                        "--variant defines the variants)")  # fmt: skip
    parser.add_argument("--variant", nargs="+", action="append", default=[], metavar=("NAME", "KEY=VALUE"),
                        help="define a variant: a name and its overrides (repeatable); it joins --variants")  # fmt: skip
    parser.add_argument("--baseline", default=BASELINE, help="the variant the others are compared with")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--eval-interval", type=int, default=250)
    parser.add_argument("--eval-segments", type=int, default=40, help="validation segments per evaluation (0: all)")
    parser.add_argument("--test-segments", type=int, default=0, help="test segments scored at the end (0: all)")
    parser.add_argument("--skip-segments", type=int, default=8, help="segments read before scoring the curves")
    parser.add_argument("--contexts", type=int, nargs="+", default=[0, 64, 128, 256, 512])
    parser.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE", help="override for every variant")
    parser.add_argument("--recl-tokens", type=int, default=0, help="RECL of the group on this many test targets")
    parser.add_argument("--flops", type=float, default=0.0, help="equal training FLOPs: every variant trains the "
                        "steps that spend this many (model_flops_per_token; --steps is then not read)")  # fmt: skip
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="for scoring")
    parser.add_argument("--resume", action="store_true", help="continue unfinished runs from their checkpoints")
    parser.add_argument("--summarize", action="store_true", help="train nothing: summarize the finished runs found "
                        "(under --out and --store), leaving out the others")  # fmt: skip
    parser.add_argument("--store", help="also keep every finished run's result.json under STORE/VARIANT/seedS (a "
                        "committed folder), and reuse the results found there: a fresh clone continues the table")  # fmt: skip
    args = parser.parse_args(argv)
    if args.variants is None:
        args.variants = [] if args.variant else ["xl", "no-memory"]
    variants = {name: VARIANTS[name] for name in args.variants if name in VARIANTS}
    unknown = [n for n in args.variants if n not in VARIANTS and n not in {v[0] for v in args.variant}]
    if unknown:
        parser.error(f"unknown variant(s) {unknown}; known: {sorted(VARIANTS)}, or define one with --variant")
    for name, *overrides in args.variant:
        variants[name] = {"overrides": overrides}
    args.variant_overrides = variants
    args.corpora = {}  # a byte corpus read with a variant's other tokenizer, loaded once (variant_corpus)
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    log = lambda message: print(message, file=sys.stderr, flush=True)  # noqa: E731
    os.makedirs(args.out, exist_ok=True)
    needs_corpus = not args.summarize or args.recl_tokens  # a summary reads the stored results only
    corpus = load_named_corpus(args.corpus, args.data_root, args.out) if needs_corpus else None
    by_variant = {name: [] for name in args.variant_overrides}
    try:
        for seed in args.seeds:  # every variant at one seed before the next seed: a partial run is already a comparison
            for name in args.variant_overrides:
                by_variant[name].append(run_one(name, seed, corpus, args, log))
    except Interrupted as exc:  # SIGINT, SIGTERM, SIGHUP: the run's checkpoint is saved
        raise SystemExit(f"{exc}; the same command with --resume continues") from None
    by_variant = {name: [store_copy(r) for r in results if r] for name, results in by_variant.items()}
    by_variant = {name: results for name, results in by_variant.items() if results}
    if not by_variant:
        raise SystemExit("no finished run to summarize")
    summary = {
        "meta": {
            **machine(),
            "corpus": args.corpus,
            "steps": args.steps,
            "seeds": args.seeds,
            "base_overrides": args.set,
            "test_segments": args.test_segments,
            "flops": args.flops,
        },  # fmt: skip
        "baseline": args.baseline,
        "metric": "bpb" if args.corpus in TEXTS else "bpc",
        "variants": {name: summarize_variant(results) for name, results in by_variant.items()},
        "curve_gaps": {} if args.flops else curve_gaps(by_variant, args.baseline),  # equal steps: not with --flops
        "recl": group_recl(args, corpus, log) if args.recl_tokens else None,
    }
    write_json(os.path.join(args.out, "summary.json"), summary)
    table = markdown(summary)
    with open(os.path.join(args.out, "summary.md"), "w", encoding="utf-8") as f:
        f.write(table)
    plot_curves(by_variant, os.path.join(args.out, "curves.png"), bits_name(args.corpus))
    plot_final(by_variant, args.out, bits_name(args.corpus))
    print(table)


if __name__ == "__main__":
    main()
