"""Genomes as long sequences (issue 58, section 4): bits per base on the held-out tail of human chrX for XL,
``llama-xl``, ssm, a gla/delta hybrid and learned chunks at contexts of 1k, 8k and 32k with the memory carried, at
equal training FLOPs, over seeds; the count models of 0-11 bases of context; training tokens/s against the context;
and a protein masked-LM row against the amino-acid unigram.  What it found: ``benchmarks/results/genomes-chrx/``.

The data (never committed; the commands are in docs/genomes.md): ``hs37chrXtrunc.fa.gz`` of Debian's
``smalt-examples`` (the first 70 Mb of chrX, GRCh37) and ``DB.fasta.gz`` of ``mmseqs2-examples`` (20,000 UniProt
proteins).  Steps, each resumable (a cell with a checkpoint and no result continues with ``--resume``; a cell with a
stored result is skipped)::

    W=runs/genomes S=benchmarks/results/genomes-chrx D=/path/to/unpacked/usr/share/doc
    python benchmarks/studies/genomes.py prepare --work $W --fasta $D/smalt/test/data/hs37chrXtrunc.fa.gz \\
        --proteins $D/mmseqs2/example-data/DB.fasta.gz
    python benchmarks/studies/genomes.py baselines --work $W --store $S     # count models, protein unigram
    python benchmarks/studies/genomes.py train --work $W --store $S --resume \\
        --models xl llama-xl ssm gla-delta learned --contexts 1024 8192 32768 --seeds 1 2 3
    python benchmarks/studies/genomes.py protein --work $W --store $S --resume --seeds 1 2 3
    python benchmarks/studies/genomes.py summarize --store $S              # summary.json, summary.md

What a context is.  Attention models (``xl``, ``llama-xl``, ``learned``) read segments of ``--segment`` (512)
tokens with a memory of C - 512 carried (stop-gradient), so a query reaches C tokens back; learned chunks keep
(C - 512) / 4 chunks in their shortened layers.  Recurrent models (``ssm``, the ``gla-delta`` hybrid: gla, attention
with a window of 512, delta, attention) read segments of C tokens, their states carried beyond.  Every cell takes
the training steps that spend ``--flops`` (:func:`train_flops_per_token`: longseq's count for attention stacks; for
stacks with mixers, 6 x their matrix parameters plus the attention pairs and the chunked scans).  A step reads 4,096
tokens (8 rows of 512; recurrent: 4 rows of 1k, one row of 8k or 32k).  Every cell is scored on the same positions:
8 streams of the test split (its last 5%: no test base is trained on), each read from its start, the first
``--warmup`` (32,768) bases unscored so that every context is full, then ``--test-tokens`` per stream scored, in
segments of at most 1,024 (a recurrent model's state and a windowed layer's memory carry the rest exactly: 8
streams of 32k at once would hold 11 GB).

``--pilot`` shrinks everything (a 1-layer model, contexts of 64 and 128, a few steps) to check the pipeline.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time

import numpy as np
import torch

TREE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, TREE)  # this tree's longseq, not an installed one (a study run from another worktree)

from longseq.api import train  # noqa: E402
from longseq.config import DataConfig, ModelConfig, RunConfig, TrainConfig  # noqa: E402
from longseq.config.task import TaskConfig  # noqa: E402
from longseq.data.corpus import load_corpus  # noqa: E402
from longseq.data.prepared import prepare_corpus  # noqa: E402
from longseq.data.readers.fasta import records  # noqa: E402
from longseq.data.sources import file_sha256, is_prepared  # noqa: E402
from longseq.data.tokenizers import NucleotideTokenizer, ProteinTokenizer  # noqa: E402
from longseq.eval import evaluate  # noqa: E402
from longseq.eval.speed import keys_per_query, model_flops_per_token  # noqa: E402
from longseq.model import build_model  # noqa: E402
from longseq.tasks import task_for  # noqa: E402
from longseq.train import load_checkpoint  # noqa: E402
from longseq.train.checkpoint import load_checkpoint_config  # noqa: E402
from longseq.train.rundir import has_checkpoint  # noqa: E402

BASE = dict(n_layer=4, d_model=128, n_head=4, d_head=32, d_inner=512, dropout=0.0)  # 858k parameters (XL)
LLAMA = dict(pre_lnorm=True, final_norm=True, norm="rmsnorm", ff="swiglu", bias=False, n_kv_head=2, qk_norm=True,
             pos="rope")  # fmt: skip
MODELS = {  # name -> (kind, model options): d_inner brings each to XL's parameters (within 0.3%)
    "xl": ("attention", {}),
    "llama-xl": ("attention", {**LLAMA, "d_inner": 429}),
    "ssm": ("recurrent", {"mixer": ["ssm"], "d_inner": 420, "head_dim": 32}),
    "gla-delta": (
        "recurrent",
        {"mixer": ["gla", "attention", "delta", "attention"], "attention": ["window"], "window": 512, "d_inner": 520},
    ),  # fmt: skip
    "learned": ("attention", {"shorten_layers": [1, 3], "shorten_factor": 4, "boundaries": "learned", "d_inner": 464}),
}
TOKENS_PER_STEP = 4096
SCORED_ROWS = 8
EVAL_SEGMENT = 1024  # validation and scoring read at most this many tokens a segment (8 streams of 32k: 11 GB)
DEFAULT_FLOPS = 3.0e13  # XL at 1k: about 15 minutes on 2 shared CPU cores (the pilot's measure, summary.md)


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def write_json(path: str, data) -> None:
    """Atomically: a killed run never leaves half a result."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_json(path: str):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=TREE, capture_output=True, text=True, check=True)
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def machine() -> dict:
    return {"platform": platform.platform(), "cpus": os.cpu_count(), "threads": torch.get_num_threads(),
            "torch": torch.__version__, "commit": commit()}  # fmt: skip


# --- prepare ---------------------------------------------------------------------------------------------------------


def prepare(args) -> None:
    """chrX as a prepared corpus (nucleotide ids, 90/5/5 by position) and the proteins split 90/5/5 by record."""
    chrx = os.path.join(args.work, "chrx")
    if not is_prepared(chrx):
        say(f"preparing {args.fasta} -> {chrx}")
        prepare_corpus(args.fasta, "nucleotide", chrx, progress=False)
    sources = {"chrx": {"path": os.path.abspath(args.fasta), "sha256": file_sha256(args.fasta)}}
    if args.proteins:
        folder = os.path.join(args.work, "proteins")
        if not os.path.isfile(os.path.join(folder, "test.faa")):
            split_proteins(args.proteins, folder)
        sources["proteins"] = {"path": os.path.abspath(args.proteins), "sha256": file_sha256(args.proteins)}
    write_json(os.path.join(args.work, "sources.json"), sources)
    say(f"prepared: {json.dumps(sources)}")


def split_proteins(path: str, folder: str) -> None:
    """The records of ``path`` in file order: the first 90% to train.faa, the next 5% to valid.faa, the rest to
    test.faa."""
    with open(path, "rb") as f:
        found = list(records(path, f))
    cuts = [0, int(len(found) * 0.9), int(len(found) * 0.95), len(found)]
    os.makedirs(folder, exist_ok=True)
    for split, (a, b) in zip(("train", "valid", "test"), zip(cuts[:-1], cuts[1:])):
        with open(os.path.join(folder, f"{split}.faa.tmp"), "w", encoding="utf-8") as out:
            out.writelines(f">{title}\n{seq}\n" for title, seq in found[a:b])
        os.replace(os.path.join(folder, f"{split}.faa.tmp"), os.path.join(folder, f"{split}.faa"))


# --- the count models ------------------------------------------------------------------------------------------------


def bases_of(ids: np.ndarray) -> np.ndarray:
    """Nucleotide ids as bases 0-3 (A, C, G, T), 4 for anything else (N, the separator): int8."""
    ids = np.asarray(ids, dtype=np.int64)
    out = ids - NucleotideTokenizer().symbols.index("A")
    return np.where((out >= 0) & (out < 4), out, 4).astype(np.int8)


def context_codes(bases: np.ndarray, order: int) -> tuple[np.ndarray, np.ndarray]:
    """For every position t >= ``order``: the code of its ``order`` previous bases (base-4 digits, the nearest
    lowest) and whether the window [t - order, t] holds only bases.  Arrays of len(bases) - order."""
    n = len(bases) - order
    code = np.zeros(n, dtype=np.int64)
    for j in range(order, 0, -1):  # the base j positions back
        code = code * 4 + np.minimum(bases[order - j : order - j + n], 3)
    bad = np.concatenate([[0], np.cumsum(bases == 4)])
    valid = bad[order + 1 : order + 1 + n] - bad[:n] == 0
    return code, valid


def count_table(bases: np.ndarray, order: int) -> np.ndarray:
    """How often each base follows each context of ``order`` bases in ``bases``: (4**order, 4)."""
    code, valid = context_codes(bases, order)
    target = bases[order:].astype(np.int64)
    joint = code[valid] * 4 + target[valid]
    return np.bincount(joint, minlength=4 ** (order + 1)).reshape(4**order, 4)


def count_bits(table: np.ndarray, bases: np.ndarray, order: int, alpha: float, score: np.ndarray | None = None):
    """Bits per base of the add-``alpha`` count model ``table`` on the positions of ``bases`` whose window holds only
    bases (and that ``score`` marks, a bool array over positions >= ``order``): (bits, positions scored)."""
    code, valid = context_codes(bases, order)
    keep = valid if score is None else valid & score
    target = bases[order:].astype(np.int64)[keep]
    rows = table[code[keep]]
    p = (rows[np.arange(len(target)), target] + alpha) / (rows.sum(1) + 4 * alpha)
    return float(-np.log2(p).mean()), int(keep.sum())


def scored_positions(n: int, warmup: int, per_row: int) -> np.ndarray:
    """Which of ``n`` test positions the neural models score: ``SCORED_ROWS`` streams of n // rows tokens, in each the
    targets ``warmup`` + 1 .. ``warmup`` + ``per_row`` (a stream's first label is its second token)."""
    mask = np.zeros(n, dtype=bool)
    row = n // SCORED_ROWS
    for r in range(SCORED_ROWS):
        mask[r * row + warmup + 1 : r * row + warmup + 1 + per_row] = True
    return mask


def baselines(args) -> None:
    """Count models of 0-11 bases of context (add-alpha, alpha chosen on the validation split) and the protein
    amino-acid unigram."""
    corpus = load_corpus(os.path.join(args.work, "chrx"), "nucleotide")
    train_b, valid_b, test_b = (bases_of(corpus.split(s)) for s in ("train", "valid", "test"))
    rows = []
    for order in range(0, args.max_order + 1):
        table = count_table(train_b, order)
        alphas = {a: count_bits(table, valid_b, order, a)[0] for a in (0.01, 0.1, 0.5, 1.0)}
        alpha = min(alphas, key=alphas.get)
        same = scored_positions(len(test_b), args.warmup, args.test_tokens)[order:]
        bits, n = count_bits(table, test_b, order, alpha)
        bits_same, n_same = count_bits(table, test_b, order, alpha, same)
        rows.append({"order": order, "alpha": alpha, "valid_bits": alphas[alpha], "test_bits_per_base": bits,
                     "test_ppl": 2**bits, "test_positions": n, "scored_bits_per_base": bits_same,
                     "scored_positions": n_same, "laplace_test_bits": count_bits(table, test_b, order, 1.0)[0]})  # fmt: skip
        say(f"count model, {order} bases of context: test {bits:.4f} bits/base (ppl {2**bits:.3f}), alpha {alpha}")
    n_bases = [int((b < 4).sum()) for b in (train_b, valid_b, test_b)]
    out = {"count_models": rows, "bases": dict(zip(("train", "valid", "test"), n_bases)),
           "test_N": int((test_b == 4).sum()), "proteins": protein_unigram(args.work), "machine": machine()}  # fmt: skip
    write_json(os.path.join(args.store, "baselines.json"), out)


def protein_unigram(work: str) -> dict | None:
    """Perplexity of the amino-acid unigram: fitted on the training records, on the test records; and fitted and
    scored on the whole set (the issue's 18.13)."""
    folder = os.path.join(work, "proteins")
    if not os.path.isdir(folder):
        return None
    t = ProteinTokenizer()
    counts = {}
    for split in ("train", "valid", "test"):
        with open(os.path.join(folder, f"{split}.faa"), "rb") as f:
            ids = np.concatenate([t.encode(seq) for _, seq in records(f.name, f)])
        counts[split] = np.bincount(ids, minlength=t.vocab_size).astype(np.float64)
    residues = slice(2, None)  # the letters (no separator, no mask)

    def ppl(fit: np.ndarray, scored: np.ndarray) -> float:
        p = (fit[residues] + 1) / (fit[residues] + 1).sum()
        return float(np.exp(-(scored[residues] * np.log(p)).sum() / scored[residues].sum()))

    whole = sum(counts.values())
    return {"test_ppl": ppl(counts["train"], counts["test"]), "whole_set_ppl": ppl(whole, whole),
            "residues": {k: int(v[residues].sum()) for k, v in counts.items()}}  # fmt: skip


# --- the cells -------------------------------------------------------------------------------------------------------


def cell_run(args, model: str, context: int, seed: int) -> RunConfig:
    """The run of ``model`` at ``context`` (see the module docstring), its steps not yet set."""
    kind, options = MODELS[model]
    base = {**BASE, "vocab_size": NucleotideTokenizer().vocab_size, **options, **args.base_overrides}
    if "window" in base:
        base["window"] = args.segment  # a hybrid's attention layers: a window of the attention models' segment
    if kind == "attention":
        segment, memory = min(args.segment, context), max(0, context - args.segment)
        base.update(mem_len=memory)
        if base.get("shorten_layers"):  # the shortened layers keep chunks: as many positions' worth
            base.update(coarse_mem_len=max(1, memory // base["shorten_factor"]))
    elif "attention" in base["mixer"]:
        segment = context
        base.update(mem_len=base["window"])  # a hybrid's windowed attention: its window carried
    else:  # no attention: no heads, no memory length (the options check refuses what a stack does not read)
        segment = context
        base = {k: v for k, v in base.items() if k not in ("n_head", "d_head")}
    rows = max(1, args.tokens_per_step // segment)
    accum = grad_accum(rows, segment + base.get("mem_len", 0), args.keys_per_chunk)
    data = DataConfig(path=os.path.join(args.work, "chrx"), tokenizer="nucleotide", tgt_len=segment,
                      batch_size=rows, eval_tgt_len=min(segment, EVAL_SEGMENT), eval_batch_size=SCORED_ROWS)  # fmt: skip
    train_config = TrainConfig(lr=args.lr, min_lr=args.lr / 20, seed=seed, grad_accum=accum, eval_max_segments=8,
                               save_every_s=300.0, log_interval=10)  # fmt: skip
    return RunConfig(ModelConfig(**base), data, train_config)


def grad_accum(rows: int, keys: int, budget: int) -> int:
    """Chunks of rows such that a chunk holds at most ``budget`` (row, key) pairs of a query (the score tensors):
    a power of two dividing ``rows``."""
    accum = 1
    while accum < rows and rows // accum * keys > budget and rows % (accum * 2) == 0:
        accum *= 2
    return accum


def matrix_parameters(model: torch.nn.Module) -> int:
    """The weights of every matrix multiply but the embedding and the softmax layer (2-D weights of the stack)."""
    return sum(p.numel() for name, p in model.named_parameters() if p.dim() == 2 and ".stack." in f".{name}")


def train_flops_per_token(run: RunConfig) -> float:
    """Training FLOPs a token (3 x the forward): longseq's count (:func:`longseq.eval.speed.model_flops_per_token`,
    the pattern's keys) for attention stacks and hourglasses; for a stack with mixers, 6 x the stack's matrix
    parameters, the softmax layer, the attention pairs of its attention layers and the chunked scans (ssm:
    intra-chunk C B^T and its product with x, the states written and read; gla and delta: q k^T and its product with
    v in a chunk, the state read and written)."""
    m, d = run.model, run.data
    mixers = m.layer_mixers
    if set(mixers) == {"attention"}:
        keys = None if m.hourglass.shorten_layers else keys_per_query(m, d.tgt_len, m.memory.mem_len)
        return model_flops_per_token(m, d.tgt_len, m.memory.mem_len, d.batch_size, keys_per_query=keys)["train"]
    forward = 2 * matrix_parameters(build_model(m)) + 2 * m.d_model * m.vocab_size
    attention = [mx for mx in mixers if mx == "attention"]
    if attention:
        forward += len(attention) * 2 * 2 * m.n_head * m.d_head * keys_per_query(m, d.tgt_len, m.memory.mem_len)
    c, width = m.mixers.chunk, m.n_head * m.d_head
    for mixer in mixers:
        if mixer == "ssm":
            inner, n = m.mixers.expand * m.d_model, m.mixers.d_state
            forward += 2 * c * n + 2 * c * inner + 4 * n * inner
        elif mixer in ("gla", "delta"):
            forward += 4 * c * width + 4 * m.d_head * width
    return 3 * forward


def with_steps(run: RunConfig, steps: int) -> RunConfig:
    """``run`` for ``steps`` optimizer steps: warm-up a tenth of them (at most 200), validation four times."""
    schedule = run.train.replace(max_steps=steps, warmup_steps=max(1, min(200, steps // 10)),
                                 eval_interval=max(1, steps // 4))  # fmt: skip
    return RunConfig(run.model, run.data, schedule, run.task)


def cell_dir(args, model: str, context: int, seed: int) -> str:
    return os.path.join(args.work, "runs", model, f"ctx{context}", f"seed{seed}")


def stored_path(store: str, model: str, context: int, seed: int) -> str:
    return os.path.join(store, "cells", model, f"ctx{context}", f"seed{seed}.json")


def train_cell(args, model: str, context: int, seed: int) -> dict | None:
    """Train and score one cell, or reuse its stored result."""
    stored = stored_path(args.store, model, context, seed)
    if os.path.isfile(stored):
        say(f"{model} ctx {context} seed {seed}: stored, skipped")
        return read_json(stored)
    run = cell_run(args, model, context, seed)
    per_token = train_flops_per_token(run)
    tokens_per_step = run.data.batch_size * run.data.tgt_len
    steps = max(1, round(args.flops / (per_token * tokens_per_step)))
    run = with_steps(run, steps)
    out = cell_dir(args, model, context, seed)
    resume = resumable(out, run, args)
    say(f"{model} ctx {context} seed {seed}: {steps} steps of {tokens_per_step} tokens, {per_token:.3g} FLOPs a token"
        f"{' (resumed)' if resume else ''}")  # fmt: skip
    trained = train(run, out, resume=resume, progress=False, log=say)
    model_, _, saved, _ = load_checkpoint(os.path.join(out, "last"))
    result = {"model": model, "context": context, "seed": seed, "steps": trained.step,
              "parameters": sum(p.numel() for p in model_.parameters()), "train_flops_per_token": per_token,
              "train_flops": per_token * tokens_per_step * trained.step, "tokens": trained.tokens,
              "train_tokens_per_s": logged_speed(out, trained), "valid": trained.valid,
              "test": score_chrx(args, model_, saved), "config": saved.to_dict(), "machine": machine()}  # fmt: skip
    write_json(os.path.join(out, "result.json"), result)
    write_json(stored, result)
    say(f"{model} ctx {context} seed {seed}: test {result['test']['bits_per_base']:.4f} bits/base")
    return result


def resumable(out: str, run: RunConfig, args) -> bool:
    """Whether the cell in ``out`` continues a run: one without a result continues with ``--resume``, and only one of
    this budget (another ``--flops`` would mix two schedules in one cell)."""
    if not has_checkpoint(out):
        return False
    if not args.resume:
        raise SystemExit(f"{out} holds a run without a result: continue it with --resume")
    stored = load_checkpoint_config(os.path.join(out, "last")).train.max_steps
    if stored != run.train.max_steps:
        raise SystemExit(f"{out} holds a run of {stored} steps, this budget gives {run.train.max_steps}: move it away")
    return True


def logged_speed(out: str, trained) -> float:
    """Training tokens/s: the trainer's figure for this session, else the last one logged (a resumed run whose
    steps were all done)."""
    if trained.tokens_per_s > 0:
        return trained.tokens_per_s
    with open(os.path.join(out, "metrics.jsonl"), encoding="utf-8") as f:
        logged = [r["tokens_per_s"] for r in map(json.loads, f) if r.get("tokens_per_s")]
    return logged[-1] if logged else math.nan


@torch.no_grad()
def score_chrx(args, model, run: RunConfig) -> dict:
    """Bits per base on the scored positions of the test split (see the module docstring), the memory carried."""
    corpus = load_corpus(run.data.path, "nucleotide")
    segment = run.data.eval_tgt_len  # a recurrent model's state is carried: 1k segments read as one of 32k
    skip = -(-args.warmup // segment)
    scored = max(1, args.test_tokens // segment)
    return evaluate(model.eval(), corpus.test, batch_size=SCORED_ROWS, tgt_len=segment, skip_segments=skip,
                    max_segments=skip + scored, bits_unit="bits_per_base")  # fmt: skip


def train_all(args) -> None:
    for seed in args.seeds:
        for context in args.contexts:
            for model in args.models:
                train_cell(args, model, context, seed)


# --- the protein masked LM -------------------------------------------------------------------------------------------


def protein_run(args, seed: int) -> RunConfig:
    folder = os.path.join(args.work, "proteins")
    model = ModelConfig(**{**BASE, **args.base_overrides, "vocab_size": ProteinTokenizer().vocab_size,
                           "mem_len": args.segment, "bidirectional": True})  # fmt: skip
    data = DataConfig(tokenizer="protein", tgt_len=args.segment, batch_size=args.protein_batch,
                      eval_tgt_len=args.segment, eval_batch_size=args.protein_batch)  # fmt: skip
    task = TaskConfig(name="mlm", train=os.path.join(folder, "train.faa"), valid=os.path.join(folder, "valid.faa"))
    train_config = TrainConfig(lr=args.lr, min_lr=args.lr / 20, seed=seed, save_every_s=300.0, log_interval=10)
    return RunConfig(model, data, train_config, task)


def protein_cell(args, seed: int) -> dict:
    stored = os.path.join(args.store, "protein", f"seed{seed}.json")
    if os.path.isfile(stored):
        return read_json(stored)
    run = protein_run(args, seed)
    probe = task_for(run)
    probe.prepare()
    padded = np.mean([-(-len(d) // args.segment) * args.segment for d in probe.train_docs])  # tokens a document
    keys = args.segment * 2  # a segment both ways, and the memory
    per_token = model_flops_per_token(run.model, args.segment, args.segment, keys_per_query=keys)["train"]
    steps = max(1, round(args.flops / (per_token * padded * args.protein_batch)))
    run = with_steps(run, steps)
    out = os.path.join(args.work, "runs", "protein-mlm", f"seed{seed}")
    resume = resumable(out, run, args)
    say(f"protein MLM seed {seed}: {steps} steps of {args.protein_batch} proteins")
    trained = train(run, out, resume=resume, progress=False, log=say)
    model, tokenizer, saved, _ = load_checkpoint(os.path.join(out, "last"))
    scorer = task_for(saved, tokenizer)
    scorer.prepare()
    metrics = scorer.metrics(model, scorer.encode(os.path.join(args.work, "proteins", "test.faa")))
    result = {"seed": seed, "steps": trained.step, "train_flops": per_token * padded * args.protein_batch * trained.step,
              "parameters": sum(p.numel() for p in model.parameters()), "valid": trained.valid, "test": metrics,
              "train_tokens_per_s": logged_speed(out, trained), "machine": machine()}  # fmt: skip
    write_json(stored, result)
    say(f"protein MLM seed {seed}: test masked perplexity {metrics['ppl']:.3f}")
    return result


def protein_all(args) -> None:
    for seed in args.seeds:
        protein_cell(args, seed)


# --- the summary -----------------------------------------------------------------------------------------------------


def stats(values: list[float]) -> dict:
    values = [v for v in values if v is not None and math.isfinite(v)]
    if not values:
        return {"mean": None, "std": None, "n": 0, "values": []}
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0
    return {"mean": mean, "std": std, "n": len(values), "values": values}


def gather(store: str) -> dict:
    """The stored cells: model -> context -> [result, ...] (by seed)."""
    cells: dict = {}
    root = os.path.join(store, "cells")
    for model in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        for context_dir in sorted(os.listdir(os.path.join(root, model)), key=lambda c: int(c[3:])):
            folder = os.path.join(root, model, context_dir)
            found = [read_json(os.path.join(folder, f)) for f in sorted(os.listdir(folder)) if f.endswith(".json")]
            cells.setdefault(model, {})[int(context_dir[3:])] = found
    return cells


def summarize(args) -> None:
    cells = gather(args.store)
    base_path = os.path.join(args.store, "baselines.json")
    baseline = read_json(base_path) if os.path.isfile(base_path) else None
    count8 = next((r for r in (baseline or {}).get("count_models", []) if r["order"] == 8), None)
    table = {}
    for model, by_context in cells.items():
        for context, results in by_context.items():
            bits = stats([r["test"]["bits_per_base"] for r in results])
            row = {"bits_per_base": bits, "ppl": 2 ** bits["mean"] if bits["mean"] is not None else None,
                   "tokens_per_s": stats([r["train_tokens_per_s"] for r in results]),
                   "steps": [r["steps"] for r in results], "parameters": results[0]["parameters"],
                   "train_flops": [r["train_flops"] for r in results]}  # fmt: skip
            if count8 and bits["mean"] is not None:
                row["vs_count8"] = 1 - bits["mean"] / count8["scored_bits_per_base"]
            table.setdefault(model, {})[context] = row
    protein_dir = os.path.join(args.store, "protein")
    protein = [read_json(os.path.join(protein_dir, f)) for f in sorted(os.listdir(protein_dir))] if os.path.isdir(
        protein_dir) else []  # fmt: skip
    summary = {"table": table, "count_models": baseline, "protein_mlm": {
        "test_ppl": stats([r["test"]["ppl"] for r in protein]), "accuracy": stats([r["test"]["masked_accuracy"]
                                                                                   for r in protein])}}  # fmt: skip
    write_json(os.path.join(args.store, "summary.json"), summary)
    with open(os.path.join(args.store, "summary.md"), "w", encoding="utf-8") as f:
        f.write(markdown(summary))
    say(f"wrote {args.store}/summary.json and summary.md")


def fmt(s: dict, digits: int = 4) -> str:
    if s["mean"] is None:
        return "-"
    return f"{s['mean']:.{digits}f} ± {s['std']:.{digits}f} (n={s['n']})"


def markdown(summary: dict) -> str:
    table, base = summary["table"], summary["count_models"]
    contexts = sorted({c for rows in table.values() for c in rows})
    lines = ["# chrX bits per base (the test tail, scored positions), mean ± std over seeds", ""]
    if not table:
        lines.append("No cell is stored yet.")
    else:
        lines += ["| model | " + " | ".join(f"{c:,}" for c in contexts) + " |", "|-|" + "-|" * len(contexts)]
    for model, rows in table.items():
        cells = [fmt(rows[c]["bits_per_base"]) if c in rows else "" for c in contexts]
        lines.append(f"| {model} | " + " | ".join(cells) + " |")
    if any("vs_count8" in row for rows in table.values() for row in rows.values()):
        lines += ["", "Against the 8-base count model on the same positions (its bits per base less the model's, over "
                  "its own):", "", "| model | " + " | ".join(f"{c:,}" for c in contexts) + " |",
                  "|-|" + "-|" * len(contexts)]  # fmt: skip
        for model, rows in table.items():
            gains = [f"{rows[c]['vs_count8']:+.1%}" if "vs_count8" in rows.get(c, {}) else "" for c in contexts]
            lines.append(f"| {model} | " + " | ".join(gains) + " |")
    if base:
        lines += ["", "Count models (add-alpha, alpha chosen on valid), the same scored positions / the whole test:", "",
                  "| bases of context | bits/base (scored) | bits/base (whole test) | perplexity (whole test) |", "|-:|-:|-:|-:|"]  # fmt: skip
        lines += [f"| {r['order']} | {r['scored_bits_per_base']:.4f} | {r['test_bits_per_base']:.4f} | "
                  f"{r['test_ppl']:.3f} |" for r in base["count_models"]]  # fmt: skip
    if table:
        lines += ["", "Training tokens/s (mean over seeds) against the context:", "",
                  "| model | " + " | ".join(f"{c:,}" for c in contexts) + " |", "|-|" + "-|" * len(contexts)]  # fmt: skip
    for model, rows in table.items():
        speeds = [f"{rows[c]['tokens_per_s']['mean']:,.0f}" if c in rows and rows[c]["tokens_per_s"]["n"] else ""
                  for c in contexts]  # fmt: skip
        lines.append(f"| {model} | " + " | ".join(speeds) + " |")
    protein = summary["protein_mlm"]
    unigram = (base or {}).get("proteins") or {}
    lines += ["", f"Protein masked LM: test perplexity of the masked residues {fmt(protein['test_ppl'], 3)}, accuracy "
              f"{fmt(protein['accuracy'], 3)}; the amino-acid unigram: {unigram.get('test_ppl', float('nan')):.3f} on "
              f"the test records ({unigram.get('whole_set_ppl', float('nan')):.3f} fitted and scored on the whole "
              "set).", ""]  # fmt: skip
    return "\n".join(lines)


# --- the command line ------------------------------------------------------------------------------------------------


PILOT = dict(contexts=[64, 128], segment=32, warmup=128, test_tokens=256, tokens_per_step=256, flops=2e8,
             max_order=4, protein_batch=4, base_overrides={"n_layer": 4, "d_model": 16, "n_head": 2, "d_head": 8,
                                                           "d_inner": 32})  # fmt: skip


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("step", choices=["prepare", "baselines", "train", "protein", "summarize"])
    p.add_argument("--work", default="runs/genomes", help="prepared data and runs (not committed)")
    p.add_argument("--store", default=os.path.join(TREE, "benchmarks", "results", "genomes-chrx"))
    p.add_argument("--fasta", help="prepare: hs37chrXtrunc.fa.gz")
    p.add_argument("--proteins", help="prepare: DB.fasta.gz")
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--contexts", nargs="+", type=int, default=[1024, 8192, 32768])
    p.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    p.add_argument("--flops", type=float, default=DEFAULT_FLOPS, help="training FLOPs of every cell")
    p.add_argument("--segment", type=int, default=512, help="attention models' segment (and the protein MLM's)")
    p.add_argument("--tokens-per-step", type=int, default=TOKENS_PER_STEP)
    p.add_argument("--keys-per-chunk", type=int, default=16384, help="rows x keys a gradient-accumulation chunk holds")
    p.add_argument("--warmup", type=int, default=32768, help="unscored test tokens a stream reads first")
    p.add_argument("--test-tokens", type=int, default=16384, help="scored test tokens a stream (8 streams)")
    p.add_argument("--max-order", type=int, default=11, help="count models up to this many bases of context")
    p.add_argument("--protein-batch", type=int, default=16)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--resume", action="store_true", help="continue cells that hold a checkpoint and no result")
    p.add_argument("--pilot", action="store_true", help="tiny sizes: the pipeline end to end in about a minute")
    args = p.parse_args(argv)
    args.base_overrides = {}
    if args.pilot:
        for key, value in PILOT.items():
            setattr(args, key, value)
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.step == "prepare" and not args.fasta:
        raise SystemExit("prepare needs --fasta (and --proteins for the protein row)")
    steps = {"prepare": prepare, "baselines": baselines, "train": train_all, "protein": protein_all,
             "summarize": summarize}  # fmt: skip
    steps[args.step](args)
    if args.step in ("train", "protein", "baselines"):
        summarize(args)


if __name__ == "__main__":
    main()
