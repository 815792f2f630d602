"""How deep the score matmul sits below the trainer: the Python frames and files from ``Trainer.step`` to the
first call of the attention-score function, in one training step of the default model (tiny-shakespeare preset).

    python benchmarks/tools/call_depth.py [--json]

Prints the frames (function, file) from Trainer.step down, their count and the number of distinct files.
PyTorch's own frames (torch/) are counted apart: they are the same for every library."""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

from longseq.config import get_preset
from longseq.data import CharTokenizer, Corpus
from longseq.train.trainer import Trainer

TARGET = ("_relative_scores", "shift.py")  # the score matmul of the rel_shift kernel


def capture(out_dir: str) -> list[tuple[str, str]]:
    rng = np.random.default_rng(0)
    text = "".join(rng.choice(list("abcdefgh \n"), size=20000))
    tok = CharTokenizer.build(text)
    ids = tok.encode(text)
    corpus = Corpus(ids[:18000], ids[18000:19000], ids[19000:], tok, "generated")
    run = get_preset("tiny-shakespeare")
    from longseq.tasks.lm import LanguageModeling

    task = LanguageModeling(run, corpus=corpus)
    trainer = Trainer(task, run, out_dir, progress=False)
    trainer.dir.open()
    trainer.build()
    stack: list = []

    def profile(frame, event, arg):
        if (
            event == "call"
            and not stack
            and frame.f_code.co_name == TARGET[0]
            and frame.f_code.co_filename.endswith(TARGET[1])
        ):
            chain, f = [], frame
            while f is not None:
                chain.append((f.f_code.co_name, f.f_code.co_filename))
                if f.f_code.co_name == "step" and f.f_code.co_filename.endswith("trainer.py"):
                    break
                f = f.f_back
            stack.extend(reversed(chain))

    sys.setprofile(profile)
    try:
        trainer.step()
    finally:
        sys.setprofile(None)
        trainer.dir.close()
    return stack


def measure(out_dir: str) -> dict:
    """The frames of longseq (``chain``, "function (file)"), their count, the distinct files and torch's frames
    between ``Trainer.step`` and the first call of the score function."""
    import shutil

    shutil.rmtree(out_dir, ignore_errors=True)
    chain = capture(out_dir)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__import__("longseq").__file__)))
    ours = [(name, os.path.relpath(path, root)) for name, path in chain if "/torch/" not in path]
    return {
        "frames": len(ours),
        "files": len({path for _, path in ours}),
        "torch_frames": len(chain) - len(ours),
        "chain": [f"{name} ({path})" for name, path in ours],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--out", default="/tmp/longseq-call-depth")
    args = parser.parse_args()
    result = measure(args.out)
    if args.json:
        print(json.dumps(result))
    else:
        print("\n".join(result["chain"]))
        print(f"{result['frames']} frames in {result['files']} files (and {result['torch_frames']} of torch)")


if __name__ == "__main__":
    main()
