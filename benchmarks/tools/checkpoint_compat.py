"""Do checkpoints written by one tree load, score and resume the same in another?  Run it twice, once per tree:

    PYTHONPATH=OLD_TREE python benchmarks/tools/checkpoint_compat.py save DIR   # train, stop, resume; record
    PYTHONPATH=NEW_TREE python benchmarks/tools/checkpoint_compat.py check DIR  # load, score, resume; compare

``save`` trains each tiny model of :data:`MODELS` (plain XL, 8-bit + compressed memory, memory tokens, a hybrid of
every mixer, an hourglass, the LSTM baseline) for 4 steps on a generated corpus and stops, keeps a copy of that
run, resumes it to 7 steps, and records the validation loss of the 4-step checkpoint and the losses of steps 5-7.
``check`` loads each 4-step checkpoint (``best/`` for the score, ``last/`` with its memory and trainer state for
the resume) and resumes the copy to 7 steps: the score and every loss must equal the recorded ones to the bit.
Prints one line per model and exits 1 when any differs.  Set ``git worktree add /tmp/old BASE`` for the old tree.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import torch

from longseq.config import DataConfig, ModelConfig, RunConfig, TrainConfig
from longseq.data import CharTokenizer, Corpus

BASE = dict(n_layer=2, d_model=16, n_head=2, d_head=8, d_inner=32, dropout=0.1, dropatt=0.0, mem_len=8)
MODELS = {
    "xl": {},
    "int8-compressed": {"cmem_len": 4, "cmem_rate": 2, "mem_quant": "int8", "cmem_fn": "conv"},
    "tokens": {"mem_tokens": 2},
    "hybrid": {"n_layer": 4, "mixer": ["ssm", "attention", "conv", "rnn"], "head_dim": 8},
    "hourglass": {"n_layer": 4, "shorten_layers": [1, 3], "shorten_factor": 2},
    "lstm": "lstm",
}


def corpus() -> Corpus:
    rng = np.random.default_rng(0)
    text = " ".join(rng.choice(["abc", "defg", "hh", "gfe", "cab\n"], size=2000))[:6000]
    tok = CharTokenizer.build(text)
    ids = tok.encode(text)
    return Corpus(ids[:5000], ids[5000:5500], ids[5500:], tok, "generated")


def run_config(name: str, max_steps: int) -> RunConfig:
    extra = MODELS[name]
    if extra == "lstm":
        model = ModelConfig(arch="lstm", vocab_size=10, n_layer=2, d_model=16, dropout=0.1)
    else:
        model = ModelConfig(vocab_size=10, **{**BASE, **extra})
    data = DataConfig(tgt_len=8, batch_size=4, eval_tgt_len=8, eval_batch_size=2)
    train = TrainConfig(max_steps=max_steps, lr=3e-3, warmup_steps=2, eval_interval=4, log_interval=1, device="cpu")
    return RunConfig(model=model, data=data, train=train)


def score(path: Path) -> float:
    from longseq.eval import evaluate
    from longseq.train import load_checkpoint

    model, _, run, _ = load_checkpoint(str(path))
    return float(evaluate(model, corpus().valid, tgt_len=8, batch_size=2)["loss"])


def _train():
    """``train`` of the tree on PYTHONPATH: ``longseq.api`` today, ``longseq.train`` before issue 41 (move 3)."""
    try:
        from longseq.api import train
    except ImportError:
        from longseq.train import train
    return train


def resume(out: Path, name: str) -> list[float]:
    train = _train()
    return [float(x) for x in train(run_config(name, 7), str(out), corpus=corpus(), resume=True, progress=False).losses]


def save(root: Path) -> None:
    train = _train()

    record = {}
    for name in MODELS:
        torch.manual_seed(0)
        out = root / name
        train(run_config(name, 4), str(out), corpus=corpus(), progress=False)
        shutil.copytree(out, root / f"{name}.stopped")
        record[name] = {"score": score(out / "best"), "resumed": resume(out, name)}
        print(f"{name}: saved, valid loss {record[name]['score']:.6f}")
    (root / "record.json").write_text(json.dumps(record, indent=1))


def check(root: Path) -> bool:
    record, same = json.loads((root / "record.json").read_text()), True
    for name, want in record.items():
        stopped = root / f"{name}.stopped"
        out = root / f"{name}.check"
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(stopped, out)
        got = {"score": score(stopped / "best"), "resumed": resume(out, name)}
        ok = got == want
        same &= ok
        print(
            f"{name}: {'same' if ok else 'DIFFERENT'} (valid loss {got['score']:.6f}, resumed losses {got['resumed']})"
        )
    return same


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["save", "check"])
    parser.add_argument("dir")
    args = parser.parse_args()
    root = Path(args.dir)
    if args.action == "save":
        root.mkdir(parents=True, exist_ok=False)
        save(root)
    else:
        sys.exit(0 if check(root) else 1)


if __name__ == "__main__":
    main()
