"""Which fine-tuning defaults learn a label carried at the start of a multi-segment document (issue 31, item 7).

The task: 3 classes; a document is its label word (``red``, ``green`` or ``blue``) followed by noise words (drawn
from letters no label word uses), 3 to 4 segments long; nothing but the first word tells the class.  A tiny
character LM (2 layers, d_model 32, segments of 16, mem_len 16) is trained briefly on such text, then fine-tuned
with the settings of ``longseq finetune`` (200 steps, batch 8, lr 1e-3, layer_lr_decay 0.8) and one option changed
(results and their reading: ``benchmarks/results/finetune-defaults/README.md``):

* ``last``: pooling=last, stop-gradient memory (the default before this study);
* ``mean``: pooling=mean (the final segment);
* ``document``: pooling=document (the mean over the whole document: every segment trains);
* ``last+bptt4``: pooling=last, ``mem_bptt`` 4 (the gradient through the memory over the whole document);
* ``last+lm``: pooling=last, ``lm_weight`` 0.5 (every segment trains, on the LM loss).

Validation accuracy (300 documents) after ``--steps`` steps, for ``--seeds`` seeds, CPU::

    python benchmarks/studies/finetune_defaults.py --work /tmp/ft-defaults --out benchmarks/results/finetune-defaults
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

TREE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, TREE)  # this tree's longseq, not an installed one (a study run from another worktree)

from longseq.api import train  # noqa: E402
from longseq.config import DataConfig, ModelConfig, RunConfig, TrainConfig  # noqa: E402
from longseq.data.corpus import Corpus  # noqa: E402
from longseq.data.tokenizers import CharTokenizer  # noqa: E402
from longseq.tasks import task_for  # noqa: E402
from longseq.train.checkpoint import load_checkpoint  # noqa: E402
from longseq.train.finetune import finetune_run  # noqa: E402
from longseq.train.trainer import Trainer  # noqa: E402

LABELS = ("red", "green", "blue")
NOISE = ("mox", "vik", "tuz", "pwq", "jol", "hyk", "sux", "zap", "ki", "lo")
SEGMENT = 16
OPTIONS = {
    "last": ({"pooling": "last"}, 1),
    "mean": ({"pooling": "mean"}, 1),
    "document": ({"pooling": "document"}, 1),
    "last+bptt4": ({"pooling": "last"}, 4),
    "last+lm": ({"pooling": "last", "lm_weight": 0.5}, 1),
}


def document(rng, label: int) -> str:
    """The label word, then noise words up to 3-4 segments of characters."""
    length = int(rng.integers(3 * SEGMENT - 4, 4 * SEGMENT))
    words = [LABELS[label]]
    while len(" ".join(words)) < length:
        words.append(str(rng.choice(NOISE)))
    return " ".join(words)[:length]


def write_task(work: str, seed: int = 0) -> tuple[str, str, str]:
    rng = np.random.default_rng(seed)
    paths = {}
    for split, n in (("train", 600), ("valid", 300)):
        labels = rng.integers(0, len(LABELS), n)
        paths[split] = os.path.join(work, f"{split}.jsonl")
        with open(paths[split], "w", encoding="utf-8") as f:
            f.writelines(json.dumps({"text": document(rng, int(c)), "label": LABELS[c]}) + "\n" for c in labels)
    text = "\n".join(document(rng, int(c)) for c in rng.integers(0, len(LABELS), 400))
    return paths["train"], paths["valid"], text


def make_lm(work: str, text: str, steps: int) -> str:
    tokenizer = CharTokenizer.build(text)
    ids = tokenizer.encode(text)
    cut = int(len(ids) * 0.9)
    corpus = Corpus(ids[:cut], ids[cut:], ids[cut:], tokenizer, "finetune-defaults")
    model = ModelConfig(vocab_size=tokenizer.vocab_size, n_layer=2, d_model=32, n_head=2, d_head=16, d_inner=64,
                           dropout=0.0, mem_len=SEGMENT)  # fmt: skip
    run = RunConfig(model, DataConfig(tgt_len=SEGMENT, batch_size=8, eval_tgt_len=SEGMENT, eval_batch_size=4),
                    TrainConfig(max_steps=steps, lr=3e-3, warmup_steps=10, eval_interval=steps, device="cpu"))  # fmt: skip
    train(run, os.path.join(work, "lm"), corpus=corpus, progress=False, overwrite=True)
    return os.path.join(work, "lm", "best")


def fine_tune(lm: str, work: str, name: str, data: tuple[str, str], seed: int, steps: int) -> float:
    options, bptt = OPTIONS[name]
    base, tokenizer, base_run, _ = load_checkpoint(lm)
    run = finetune_run(base_run, lm, "classify", {"train": data[0], "valid": data[1], **options}, steps=steps,
                       seed=seed, device="cpu")  # fmt: skip
    memory = run.model.memory.replace(mem_bptt=bptt)
    run = RunConfig(run.model.replace(memory=memory), run.data, run.train, run.task)
    task = task_for(run, tokenizer, None, base=base)
    Trainer(task, run, os.path.join(work, f"{name}-{seed}"), overwrite=True, progress=False).fit()
    return task.validate(task_model(work, name, seed))["accuracy"]


def task_model(work: str, name: str, seed: int):
    return load_checkpoint(os.path.join(work, f"{name}-{seed}", "last"))[0]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", required=True)
    p.add_argument("--out", help="directory for results.json and README.md")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--lm-steps", type=int, default=150)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--options", default=",".join(OPTIONS))
    args = p.parse_args()
    os.makedirs(args.work, exist_ok=True)
    train_path, valid_path, text = write_task(args.work)
    lm = make_lm(args.work, text, args.lm_steps)
    results = {}
    for name in args.options.split(","):
        start = time.perf_counter()
        accuracies = [fine_tune(lm, args.work, name, (train_path, valid_path), seed, args.steps)
                      for seed in range(args.seeds)]  # fmt: skip
        results[name] = {"accuracy": accuracies, "mean": statistics.mean(accuracies),
                         "seconds_per_run": (time.perf_counter() - start) / args.seeds}  # fmt: skip
        print(name, json.dumps(results[name]), flush=True)
    summary = {"steps": args.steps, "lm_steps": args.lm_steps, "seeds": args.seeds, "chance": 1 / len(LABELS),
               "segment_len": SEGMENT, "documents": "3-4 segments, label word first", "results": results}  # fmt: skip
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "results.json"), "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=1)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
