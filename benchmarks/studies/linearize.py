"""Linearization on WikiText-2 words (issue 57, section 5): a teacher with the llama-xl block linearized at a ratio of
its layers into ``gla`` (stage 1 attention transfer, layer choice by measured KL, stage 2 distillation; ``longseq
linearize``), against the same students trained from scratch on the text for the same tokens.

* The teacher: ``base.toml``'s 4 layers of d_model 128 (the runner's WikiText-2 base: words, adaptive softmax with
  cutoffs 2000, 10000) with the llama-xl block (``variants/block.toml [llama-xl]``: rotary positions, RMSNorm,
  SwiGLU, 2 key/value heads of 4, QK-norm, no biases): 5.15M parameters, mostly the 33,278-word embedding.
* Each ratio and seed: ``api.linearize(teacher, ratio=R, select="kl")``, each stage at its own learning rate
  (``--transfer-lr``, ``--distill-lr``) warming up over a tenth of its steps, min_lr and the cosine the teacher's.  With ``--select kl`` stage 1 transfers
  every attention layer whatever the ratio, so the ratios of one seed share one transfer: the first ratio's, linked
  into the others' folders (``transfer`` -> ``lin-1-sS/transfer``), which they resume, finished.  The students share
  one cache of the teacher's top-k logits (``WORK/teacher-cache``).
* The same student (gla at the layers chosen for that seed) from scratch, as a language model with the teacher's
  recipe, for the tokens the linearized one read in both stages (a transfer step reads ``--step-segments``).
* Test bits per word (the whole test split, the teacher's evaluation segments and memory) of the teacher, of each
  student after stage 1 alone and after both stages, and of the scratch student; the validation curves against
  tokens read of both; generation at long context: the new tokens' speed after reading a prompt of L tokens, and
  the bytes the memory holds then (the teacher with its own memory and with all L tokens in it; each student).

Results under ``--out`` (one JSON per run, ``speed.json``), runs under ``--work``; ``--resume`` continues every run
where it stopped and reuses every stored result.  The full study (the lead's; hours on 2 CPU cores)::

    python benchmarks/studies/linearize.py --work runs/linearize --out benchmarks/results/linearize-wt2 \\
        --teacher-steps 3000 --transfer-steps 300 --distill-steps 900 --ratios 1 0.5 0.25 --seeds 1 2 3 \\
        --lengths 8192 16384 32768 65536

and the short check of the pipeline (``--out benchmarks/results/linearize-wt2-short``; README.md there)::

    python benchmarks/studies/linearize.py --work /tmp/lin-short --out benchmarks/results/linearize-wt2-short \\
        --teacher-steps 200 --transfer-steps 20 --distill-steps 60 --ratios 0.5 --seeds 1 --lengths 2048 \\
        --test-segments 40 --set eval_max_segments=20 eval_interval=100
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import torch

TREE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, TREE)  # this tree's longseq, not an installed one (a study run from another worktree)

from longseq.api import linearize, train  # noqa: E402
from longseq.config import RunConfig, apply_overrides, load_run_config  # noqa: E402
from longseq.config.base import apply_values  # noqa: E402
from longseq.data.corpus import load_corpus  # noqa: E402
from longseq.eval.evaluate import evaluate  # noqa: E402
from longseq.generation import read_prompt  # noqa: E402
from longseq.train.checkpoint import load_checkpoint  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
BLOCK = [
    "pos=rope",
    "norm=rmsnorm",
    "ff=swiglu",
    "d_inner=429",
    "bias=false",
    "pre_lnorm=true",
    "final_norm=true",
    "n_kv_head=2",
    "qk_norm=true",
]  # fmt: skip  (variants/block.toml [llama-xl])
WORDS = ["data.tokenizer=word", "cutoffs=2000,10000"]  # runner.py's wt2


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", required=True, help="the runs' folder")
    p.add_argument("--out", required=True, help="the results' folder")
    p.add_argument("--data", default=os.environ.get("LONGSEQ_DATA", "/work/shared/data"), help="the data root")
    p.add_argument("--teacher-steps", type=int, default=3000)
    p.add_argument("--transfer-steps", type=int, default=300)
    p.add_argument("--distill-steps", type=int, default=900)
    p.add_argument("--ratios", type=float, nargs="+", default=[1.0, 0.5, 0.25])
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--mixer", default="gla")
    p.add_argument("--step-segments", type=int, default=4, help="segments a transfer step reads")
    p.add_argument("--transfer-lr", type=float, default=1e-3)
    p.add_argument("--distill-lr", type=float, default=5e-4)
    p.add_argument("--top-k", type=int, default=8, help="the teacher's logits kept a position")
    p.add_argument("--alpha", type=float, default=0.5)
    p.add_argument("--lengths", type=int, nargs="*", default=[8192, 16384, 32768, 65536])
    p.add_argument("--new-tokens", type=int, default=64, help="tokens generated after each prompt, timed")
    p.add_argument("--test-segments", type=int, default=0, help="test segments scored (0: the whole split)")
    p.add_argument("--set", nargs="*", default=[], help="run config keys of every run (key=value)")
    p.add_argument("--resume", action="store_true", help="continue the runs and reuse the stored results")
    return p.parse_args(argv)


def teacher_run(args, vocab: int) -> RunConfig:
    run = load_run_config(os.path.join(HERE, "base.toml"))
    run = RunConfig(**apply_values(run.sections(), [("model.vocab_size", vocab)]))
    items = [f"data.path={os.path.join(args.data, 'wikitext-2')}", *WORDS, *BLOCK, f"max_steps={args.teacher_steps}",
             "eval_interval=250", "eval_max_segments=80", "seed=1", *args.set]  # fmt: skip
    return RunConfig(**apply_overrides(run.sections(), items))


def write_json(path: str, data) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, separators=(",", ":"))
    os.replace(tmp, path)


def stored(path: str, args):
    """The result at ``path`` when ``--resume`` may reuse it, else None."""
    if args.resume and os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    return None


def test_bits(checkpoint: str, corpus, args) -> dict:
    """Test bits per word of a checkpoint at its run's evaluation segments and memory."""
    model, _, run, _ = load_checkpoint(checkpoint)
    d = run.data
    out = evaluate(model, corpus.test, batch_size=d.eval_batch_size, tgt_len=d.eval_tgt_len,
                   max_segments=args.test_segments)  # fmt: skip
    return {"bits_per_word": out["loss"] / math.log(2), "tokens": out.get("tokens"), "params": model.num_parameters()}


def curve(run_dir: str, tokens_per_step: int, offset: int = 0) -> list[list[float]]:
    """[tokens read, validation bits per word] at each validation of a run (``offset``: tokens read before it)."""
    points = []
    with open(os.path.join(run_dir, "metrics.jsonl"), encoding="utf-8") as f:
        for line in f:
            record = json.loads(line)
            if "valid_loss" in record:
                points.append([offset + record["step"] * tokens_per_step, round(record["valid_loss"] / math.log(2), 5)])
    return points


def linearized(args, corpus, teacher: str, ratio: float, seed: int) -> dict:
    """One ratio and seed through ``longseq linearize``, scored."""
    name = f"lin-{ratio:g}-s{seed}"
    out = os.path.join(args.work, name)
    first = os.path.join(args.work, f"lin-{args.ratios[0]:g}-s{seed}", "transfer")
    if ratio != args.ratios[0] and os.path.isdir(first) and not os.path.exists(os.path.join(out, "transfer")):
        os.makedirs(out, exist_ok=True)
        os.symlink(os.path.abspath(first), os.path.join(out, "transfer"))  # every layer's transfer, shared
    settings = [f"seed={seed}", *args.set]  # each stage warms up over a tenth of its steps
    # no dropout in the transfer: no noise on the MSE's targets
    transfer = [f"step_segments={args.step_segments}", f"lr={args.transfer_lr}", "dropout=0",
                f"warmup_steps={max(1, args.transfer_steps // 10)}"]  # fmt: skip
    distill = [f"cache={os.path.join(args.work, 'teacher-cache')}", f"top_k={args.top_k}", f"alpha={args.alpha}",
               f"lr={args.distill_lr}", f"warmup_steps={max(1, args.distill_steps // 10)}"]  # fmt: skip
    start = time.perf_counter()
    report = linearize(teacher, out, args.mixer, ratio=ratio, select="kl", transfer_steps=args.transfer_steps,
                       distill_steps=args.distill_steps, settings=settings, transfer_settings=transfer,
                       distill_settings=distill, resume=True, log=print, corpus=corpus)  # fmt: skip
    seconds = time.perf_counter() - start
    d = load_checkpoint(report["student"])[2].data
    step_tokens = d.batch_size * d.tgt_len
    transfer_tokens = args.transfer_steps * args.step_segments * step_tokens
    return {
        "ratio": ratio, "seed": seed, "layers": report["layers"], "layer_kl": report["layer_kl"], "seconds": seconds,
        "transfer": {**report["transfer"], "tokens": transfer_tokens},
        "transfer_only": test_bits(report["student"], corpus, args),
        "test": test_bits(report["checkpoint"], corpus, args),
        "tokens": transfer_tokens + args.distill_steps * step_tokens,
        "curve": curve(os.path.join(out, "distill"), step_tokens, transfer_tokens),
    }  # fmt: skip


def scratch(args, corpus, teacher_run_config: RunConfig, student: str, tokens: int, seed: int, name: str) -> dict:
    """The student's architecture from scratch, as a language model, for ``tokens`` tokens."""
    model = load_checkpoint(student)[2].model
    d = teacher_run_config.data
    steps = max(1, tokens // (d.batch_size * d.tgt_len))
    run = RunConfig(model, d, teacher_run_config.train.replace(max_steps=steps, seed=seed))
    out = os.path.join(args.work, name)
    train(run, out, resume=os.path.exists(out), corpus=corpus, log=print, base=run)
    return {"steps": steps, "tokens": steps * d.batch_size * d.tgt_len, "test": test_bits(os.path.join(out, "best"),
            corpus, args), "curve": curve(out, d.batch_size * d.tgt_len)}  # fmt: skip


def memory_bytes(memory) -> int:
    return sum(t.numel() * t.element_size() for layer in memory.layers for t in layer.all_tensors())


@torch.no_grad()
def long_context(checkpoint: str, length: int, new_tokens: int, mem_len: int | None = None) -> dict:
    """Read a prompt of ``length`` random tokens in segments of 128 (``mem_len``: the memory's length, None: the
    model's own), then generate ``new_tokens`` greedily: the prompt's and the new tokens' speed, the memory's bytes."""
    model = load_checkpoint(checkpoint)[0].eval()
    recurrence = model.config.recurrence(mem_len=mem_len) if mem_len is not None else None
    prompt = torch.randint(0, model.config.vocab_size, (1, length), generator=torch.Generator().manual_seed(0))
    start = time.perf_counter()
    mems = read_prompt(model, prompt[:, :-1], 128, recurrence)  # a ring of the memory's length
    read = time.perf_counter() - start
    token, start = prompt[:, -1:], time.perf_counter()
    for _ in range(new_tokens):
        scores, mems = model.next_token_scores(token, mems, recurrence=recurrence)
        token = scores.argmax(-1, keepdim=True)
    new = time.perf_counter() - start
    return {"length": length, "prompt_tokens_per_s": (length - 1) / read, "new_tokens_per_s": new_tokens / new,
            "memory_mb": memory_bytes(mems) / 2**20}  # fmt: skip


def speed_rows(args, teacher: str, students: dict[str, str]) -> list[dict]:
    rows = []
    for length in args.lengths:
        rows.append({"model": "teacher", **long_context(teacher, length, args.new_tokens)})
        rows.append({"model": "teacher, every token in memory", **long_context(teacher, length, args.new_tokens,
                                                                                mem_len=length)})  # fmt: skip
        for name, path in students.items():
            rows.append({"model": name, **long_context(path, length, args.new_tokens)})
        print(json.dumps(rows[-1]))
    return rows


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    if os.path.isdir(args.work) and os.listdir(args.work) and not args.resume:
        raise SystemExit(f"{args.work} holds runs: continue them with --resume, or choose another --work")
    corpus = load_corpus(os.path.join(args.data, "wikitext-2"), "word")
    run = teacher_run(args, corpus.tokenizer.vocab_size)
    folder = os.path.join(args.work, "teacher")
    train(run, folder, resume=os.path.exists(folder), corpus=corpus, log=print, base=run)
    teacher = os.path.join(args.work, "teacher", "best")
    result = stored(os.path.join(args.out, "teacher.json"), args) or {
        "test": test_bits(teacher, corpus, args), "steps": args.teacher_steps,
        "curve": curve(os.path.join(args.work, "teacher"), run.data.batch_size * run.data.tgt_len)}  # fmt: skip
    write_json(os.path.join(args.out, "teacher.json"), result)
    students = {}
    for seed in args.seeds:
        for ratio in args.ratios:
            path = os.path.join(args.out, f"ratio-{ratio:g}", f"seed{seed}", "result.json")
            row = stored(path, args) or linearized(args, corpus, teacher, ratio, seed)
            if "scratch" not in row:
                student = os.path.join(args.work, f"lin-{ratio:g}-s{seed}", "student")
                row["scratch"] = scratch(args, corpus, run, student, row["tokens"], seed, f"scratch-{ratio:g}-s{seed}")
            write_json(path, row)
            students.setdefault(
                f"{ratio:.0%} {args.mixer}", os.path.join(args.work, f"lin-{ratio:g}-s{seed}", "distill", "best")
            )
    if args.lengths and not stored(os.path.join(args.out, "speed.json"), args):
        write_json(os.path.join(args.out, "speed.json"), {"rows": speed_rows(args, teacher, students)})


if __name__ == "__main__":
    main()
