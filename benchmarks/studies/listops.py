"""LRA ListOps with a small memory model, from scratch, through the command line; resumable; checks the reload.

Steps, each skipped when its output is already there (so the same command continues an interrupted run):

1. data: ``longseq data listops`` (LRA's sizes by default: 96,000 / 2,000 / 2,000 examples of 500-2,000 tokens);
2. an "LM checkpoint" to start from: fine-tuning starts from one, so ``longseq train`` runs ``--lm-steps`` steps on
   the training texts (1 step at lr 1e-7 by default: the weights stay at their initialisation, i.e. from scratch;
   more steps pretrain as an LM first);
3. ``longseq finetune --task classify``: 2 layers, d_model 64, the memory reading 256-token segments, the window
   pattern, batch 32, 5,000 steps, lr 1e-3 with a linear warmup over 500 steps and a linear decay to 0 (published
   LRA configurations decay linearly; the run of 2026-12-01 held 1e-3 and wandered at 28-33%), batches grouped by
   length (a batch of random documents pads nearly all of them to 2,000 tokens), mean pooling over the final
   segment (``--pooling document``: over the whole document, as LRA's published models pool), no layer-wise
   decay (a model from scratch has nothing to protect in its lower layers).  An interrupted run continues from its
   checkpoint (``longseq finetune --resume``);
4. the reload check, in this process, on the saved files alone (independent of the fine-tuning code's own
   evaluation): the reloaded classifier must reproduce the validation accuracy that fine-tuning reported at the
   end of training exactly (LRA's own code had a reload that scored ~17%); then the test accuracy.

Reach: a query of the final segment sees the whole document only if ``mem_len`` + 256 covers it and the window
stacks to it (n_layer x window >= the document's length); the defaults (mem_len 2048, window 1024, 2 layers)
cover 2,000 tokens; ``--window 2304`` is full causal attention over the document.  Gradient: with the paper's
stop-gradient memory only the final segment's computation trains; ``--mem-bptt 8`` back-propagates through the
memory over the whole document (ModelConfig ``mem_bptt``), as a model reading it in one segment would.

Usage::

    python benchmarks/studies/listops.py --work runs/listops                      # the issue's run (GPU: see --device)
    python benchmarks/studies/listops.py --work runs/listops                      # again: continues where it stopped
    # the results, metrics and settings kept in the repository after every stop (checkpoints stay in --work)
    python benchmarks/studies/listops.py --work runs/listops --store benchmarks/results/listops/stop-gradient
    python benchmarks/studies/listops.py --work /tmp/listops-pilot --train 64 --valid 16 --test 16 --min-length 100 \\
        --max-length 300 --steps 4 --batch-size 4 --mem-len 256 --window 128   # pilot, a minute on a CPU
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
TREE = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, TREE)  # this tree's longseq, not an installed one (a study run from another worktree)
# ``python -m longseq`` with this tree first on its path (``-m`` would put the working directory first)
LONGSEQ = [sys.executable, "-c", f"import runpy, sys; sys.path.insert(0, {TREE!r}); runpy.run_module('longseq', "
           "run_name='__main__', alter_sys=True)"]  # fmt: skip
TARGET = 0.37  # the target; LRA: Transformer 36.4%, BigBird 36.1%
LENGTH_BUCKET = 500  # accuracy is also reported by document length in tokens, in buckets of this many


def longseq(*argv: str, log) -> dict:
    """Run one ``longseq`` command in a child process (the same interpreter, this tree first); its JSON result.  A
    SIGINT, SIGTERM or SIGHUP sent to this script is passed on to the child, which saves its checkpoint and exits;
    this script then exits too (without this, a scheduler's SIGTERM left the child training on, orphaned)."""
    command = [*LONGSEQ, *argv]
    log("$ longseq " + " ".join(argv))
    child = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    forward = lambda signum, frame: child.send_signal(signum)  # noqa: E731
    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        out, _ = child.communicate()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if child.returncode:
        raise SystemExit(f"longseq {argv[0]} stopped with exit status {child.returncode}; the same command continues")
    return json.loads(out.strip().splitlines()[-1])


def count_lines(path: str) -> int:
    with open(path, encoding="utf-8") as f:
        return sum(1 for line in f if line.strip())


def make_data(args, log) -> str:
    data = os.path.join(args.work, "data")
    sizes = {"train": args.train, "valid": args.valid, "test": args.test}
    paths = {split: os.path.join(data, f"{split}.jsonl") for split in sizes}
    if all(os.path.exists(p) and count_lines(p) == sizes[s] for s, p in paths.items()):
        log(f"data: {data} is there")
    else:
        longseq("data", "listops", "--out", data, "--seed", str(args.seed), "--train", str(args.train),
                "--valid", str(args.valid), "--test", str(args.test), "--min-length", str(args.min_length),
                "--max-length", str(args.max_length), "--json", log=log)  # fmt: skip
    text = os.path.join(data, "lm.txt")
    if not os.path.exists(text):
        with open(paths["train"], encoding="utf-8") as f, open(text + ".tmp", "w", encoding="utf-8") as out:
            out.writelines(json.loads(line)["text"] + "\n" for line in f if line.strip())
        os.replace(text + ".tmp", text)
    return data


def model_settings(args) -> list[str]:
    return [
        "n_layer=2", "d_model=64", f"n_head={args.heads}", f"d_head={64 // args.heads}", f"d_inner={args.d_inner}",
        "dropout=0.1", "tgt_len=256", "eval_tgt_len=256", f"mem_len={args.mem_len}", "attention=window",
        f"window={args.window}", f"seed={args.seed}", f"mem_bptt={args.mem_bptt}",
    ]  # fmt: skip


def make_lm(args, data: str, log) -> str:
    """The checkpoint fine-tuning starts from."""
    lm = os.path.join(args.work, "lm")
    state = os.path.join(lm, "last", "trainer_state.json")
    if os.path.exists(state):
        with open(state, encoding="utf-8") as f:
            if json.load(f)["step"] >= args.lm_steps:
                log(f"LM checkpoint: {lm}/last is there")
                return os.path.join(lm, "last")
    schedule = ["lr=1e-7", "min_lr=0", "warmup_steps=0"] if args.lm_steps == 1 else ["lr=1e-3", "warmup_steps=100"]
    longseq("train", "--data", os.path.join(data, "lm.txt"), "--tokenizer", "word", "--out", lm, "--quiet", "--json",
            "--set", *model_settings(args), f"max_steps={args.lm_steps}", "batch_size=8",
            f"eval_interval={args.lm_steps}", "eval_max_segments=2", *schedule, log=log)  # fmt: skip
    return os.path.join(lm, "last")


def finetune_flags() -> str:
    return subprocess.run([*LONGSEQ, "finetune", "--help"], capture_output=True, text=True).stdout


def finetune(args, data: str, lm: str, log) -> dict:
    out = os.path.join(args.work, "classifier")
    done = os.path.join(args.work, "finetune_result.json")
    if os.path.exists(done):
        log(f"fine-tuning: finished, {done}")
        with open(done, encoding="utf-8") as f:
            return json.load(f)
    flags = ["--task", "classify", "--data", os.path.join(data, "train.jsonl"), "--valid",
             os.path.join(data, "valid.jsonl"), "--checkpoint", lm, "--out", out, "--steps", str(args.steps),
             "--batch-size", str(args.batch_size), "--segment-len", "256", "--lr", str(args.lr),
             "--layer-lr-decay", "1.0", "--pooling", args.pooling, "--seed", str(args.seed), "--device", args.device,
             "--eval-interval", "500", "--save-interval", "100", "--schedule", args.schedule, "--json"]  # fmt: skip
    if args.group_by_length:
        flags.append("--group-by-length")
    if os.path.isdir(out):
        if "--resume" not in finetune_flags():
            raise SystemExit(
                f"{out} holds an unfinished fine-tuning run and this longseq finetune cannot resume; remove it"
            )
        at = flags.index("--checkpoint")  # a resume needs no base; one made again elsewhere may differ in its last bits
        flags = [*flags[:at], *flags[at + 2 :], "--resume"]
    began = time.perf_counter()
    try:
        result = longseq("finetune", *flags, log=log)
    finally:  # finished or stopped: the metrics go to the store either way
        keep(args, ["classifier"], log)
    result["session_s"] = time.perf_counter() - began
    with open(done + ".tmp", "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    os.replace(done + ".tmp", done)
    keep(args, ["finetune_result.json"], log)
    return result


STORED = ("settings.json", "finetune_result.json", "result.json", "classifier/metrics.jsonl", "classifier/run.toml")


def keep(args, names: list[str], log) -> None:
    """Copy what of ``names`` is in the work directory into ``--store`` (a folder under ``benchmarks/results``):
    the settings, the results, the fine-tuning run's metrics and its run config.  Checkpoints stay in ``--work``:
    none is committed, so an interrupted run continues from its work directory only."""
    if not args.store:
        return
    kept = []
    for name in names:
        for path in [p for p in STORED if p == name or p.startswith(name + "/")]:
            source, target = os.path.join(args.work, path), os.path.join(args.store, path)
            if os.path.isfile(source):
                os.makedirs(os.path.dirname(target), exist_ok=True)
                shutil.copy2(source, target)
                kept.append(path)
    log(f"kept {', '.join(kept) or 'nothing'} in {args.store}")


def load_classifier(work: str, lm_dir: str, device: str):
    """The fine-tuned classifier rebuilt from its saved files alone, without the fine-tuning code: the model config,
    the task options (label set, pooling) and the weights of ``classifier/best``."""
    from safetensors.torch import load_model

    from longseq.config import ModelConfig
    from longseq.data.tokenizers import load_tokenizer
    from longseq.model import TransformerXLLM
    from longseq.model.heads import DocumentClassifier

    where = os.path.join(work, "classifier", "best")
    with open(os.path.join(where, "config.json"), encoding="utf-8") as f:
        info = json.load(f)
    from longseq.config.stored import stored_run

    options = {k: v for k, v in stored_run(info["run"])["task"].items() if k != "name"}  # any checkpoint format
    options["segment_len"] = options.get("segment_len") or info["run"]["data"]["tgt_len"]
    labels = options["labels"]
    model = DocumentClassifier(
        TransformerXLLM(ModelConfig.from_dict(info["run"]["model"])), len(labels), options["pooling"]
    )
    load_model(model, os.path.join(where, "model.safetensors"), strict=True, device=device)
    return model.to(device).eval(), load_tokenizer(os.path.join(where, "tokenizer.json")), labels, options


@torch.no_grad()
def accuracy(model, tokenizer, labels, path: str, segment_len: int, batch_size: int, device: str) -> dict:
    """Accuracy of ``model`` on a JSONL file, in all and by document length (buckets of ``LENGTH_BUCKET`` tokens);
    batches in file order, each document left-padded with token 0 to a whole number of segments and its filler
    masked (the fine-tuning convention)."""
    from longseq.tasks.classify import label_name

    index = {label: i for i, label in enumerate(labels)}
    with open(path, encoding="utf-8") as f:
        records = [json.loads(line) for line in f if line.strip()]
    correct, counts, buckets = 0, {}, {}
    for start in range(0, len(records), batch_size):
        batch = records[start : start + batch_size]
        ids = [tokenizer.encode(r["text"]).tolist() for r in batch]
        length = -(-max(map(len, ids)) // segment_len) * segment_len
        inputs = torch.zeros(len(ids), length, dtype=torch.long)
        padding = torch.ones(len(ids), length, dtype=torch.bool)
        for row, seq in enumerate(ids):
            inputs[row, length - len(seq) :] = torch.as_tensor(seq)
            padding[row, length - len(seq) :] = False
        logits = model(inputs.to(device), segment_len, padding=padding.to(device))["logits"]  # (B, C)
        for r, seq, predicted in zip(batch, ids, logits.argmax(-1).tolist()):
            right = int(index.get(label_name(r["label"]), -1) == predicted)  # labels are names: 0 and "0" alike
            correct += right
            counts[r["label"]] = counts.get(r["label"], 0) + 1
            bucket = buckets.setdefault(len(seq) // LENGTH_BUCKET * LENGTH_BUCKET, [0, 0])
            bucket[0], bucket[1] = bucket[0] + right, bucket[1] + 1
    by_length = {f"{low}-{low + LENGTH_BUCKET - 1}": {"accuracy": c / n, "examples": n}
                 for low, (c, n) in sorted(buckets.items())}  # fmt: skip
    return {"accuracy": correct / len(records), "examples": len(records),
            "majority_class": max(counts.values()) / len(records), "by_length": by_length}  # fmt: skip


def check_settings(args) -> None:
    """The first run's settings are kept in ``settings.json``; a later run with other settings is refused (it would
    reuse outputs made with the old ones)."""
    path = os.path.join(args.work, "settings.json")
    settings = {k: v for k, v in vars(args).items() if k not in ("work", "device", "store")}
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            before = json.load(f)
        before.setdefault("mem_bptt", 1)  # runs made before these options: the stop-gradient memory,
        before.setdefault("pooling", "mean")  # the mean of the final segment
        if before != settings:
            changed = sorted(k for k in settings if before.get(k) != settings[k])
            raise SystemExit(f"{args.work} was made with other settings ({', '.join(changed)}); use another --work")
        return
    with open(path, "w", encoding="utf-8") as f:
        json.dump(settings, f, indent=1)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", required=True, help="directory of the data, the checkpoints and result.json")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--train", type=int, default=96_000)
    p.add_argument("--valid", type=int, default=2_000)
    p.add_argument("--test", type=int, default=2_000)
    p.add_argument("--min-length", type=int, default=500)
    p.add_argument("--max-length", type=int, default=2_000)
    p.add_argument("--lm-steps", type=int, default=1, help="LM steps before fine-tuning (1: from scratch)")
    p.add_argument("--steps", type=int, default=5_000)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--schedule", default="linear", choices=["constant", "linear", "cosine"],
                   help="after the warmup (a tenth of the steps); linear decays to 0 at the last step")  # fmt: skip
    p.add_argument("--group-by-length", action=argparse.BooleanOptionalAction, default=True,
                   help="training batches of documents of similar length (fewer filler segments)")  # fmt: skip
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--d-inner", type=int, default=128)
    p.add_argument("--mem-len", type=int, default=2048)
    p.add_argument("--window", type=int, default=1024)
    p.add_argument("--mem-bptt", type=int, default=1,
                   help="segments the gradient flows back through the memory (1: stop-gradient, only the final "
                   "segment trains; 8: the whole document of up to 2,000 tokens in 256-token segments)")  # fmt: skip
    p.add_argument(
        "--pooling",
        default="mean",
        choices=["last", "mean", "document"],
        help="the classified summary: the mean of the final segment, or of the whole document (LRA's)",
    )
    p.add_argument("--store", help="a folder under benchmarks/results that keeps the settings, the results and the "
                   "fine-tuning metrics (copied after every stop); checkpoints stay in --work")  # fmt: skip
    p.add_argument("--device", default="cpu", help="where fine-tuning and the reload check run (cpu, cuda)")
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    log = lambda message: print(message, file=sys.stderr, flush=True)  # noqa: E731
    os.makedirs(args.work, exist_ok=True)
    check_settings(args)
    keep(args, ["settings.json"], log)
    data = make_data(args, log)
    lm = make_lm(args, data, log)
    reported = finetune(args, data, lm, log)
    # the reload check on the CPU, where fine-tuning scored best/ for its report: equal arithmetic, exact equality
    model, tokenizer, labels, info = load_classifier(args.work, lm, "cpu")
    segment_len = info["segment_len"]
    valid = accuracy(model, tokenizer, labels, os.path.join(data, "valid.jsonl"), segment_len, args.batch_size, "cpu")
    if args.device != "cpu":
        model = load_classifier(args.work, lm, args.device)[0]
    test = accuracy(model, tokenizer, labels, os.path.join(data, "test.jsonl"), segment_len, args.batch_size,
                    args.device)  # fmt: skip
    end_of_training = reported["valid"]["accuracy"]
    result = {
        "settings": vars(args), "torch": torch.__version__, "finetune": reported,
        "reload": {"valid_accuracy_end_of_training": end_of_training, "valid_accuracy_reloaded": valid["accuracy"],
                   "same": valid["accuracy"] == end_of_training},
        "test": test, "target": TARGET, "reached": test["accuracy"] >= TARGET,
    }  # fmt: skip
    with open(os.path.join(args.work, "result.json"), "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    keep(args, ["result.json"], log)
    print(json.dumps({"test_accuracy": test["accuracy"], "majority_class": test["majority_class"],
                      "valid_end_of_training": end_of_training, "valid_reloaded": valid["accuracy"],
                      "reload_same": result["reload"]["same"], "reached_37": result["reached"]}))  # fmt: skip
    if not result["reload"]["same"]:
        raise SystemExit("the reloaded classifier does not reproduce the end-of-training validation accuracy")


if __name__ == "__main__":
    main()
