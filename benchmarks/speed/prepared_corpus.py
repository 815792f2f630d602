"""Preparing a 300 MB corpus, and training start-up on it prepared against read in RAM.

    python benchmarks/speed/prepared_corpus.py [--mb 300] [--tokenizers bpe word byte] [--vocab-size 4096] \
        [--work /tmp/longseq-bench] [--old-src DIR]

The corpus is built in ``--work`` (never committed) by repeating WikiText-2, PTB and tiny-shakespeare from
the data root (``--data-root``, default ``$LONGSEQ_DATA``) until it has ``--mb`` MB.  For every tokenizer, each
measurement is its own process, so peak RSS (``ru_maxrss`` from ``wait4``) is that measurement's alone:

* ``longseq data prepare --data BIG --tokenizer T --out DIR``: wall time, encoding tokens/s, peak RSS;
* ``longseq train --data DIR`` (prepared) and ``longseq train --data BIG --tokenizer T`` (in RAM): seconds from
  process start to the end of the first backward pass, and peak RSS by then.  The first backward is caught by
  wrapping the training loop's ``after_backward`` hook; nothing else of the run is changed (the default preset's
  model, batch 16 x 64).
* ``--old-src DIR`` (a checkout of the code before prepared corpora, e.g. ``git archive 3f192df | tar -x -C DIR``)
  adds the in-RAM start-up of that code, which also copied the whole token stream into a (B, N) tensor.

Start-up is the median of ``--rounds`` processes on a prepared corpus, of ``--ram-rounds`` in RAM.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

DATA_ENV = "LONGSEQ_DATA"


def data_root(given: str | None) -> str:
    """The folder of the corpora: ``--data-root``, else ``$LONGSEQ_DATA``; an error names both when neither is set."""
    root = given or os.environ.get(DATA_ENV)
    if not root:
        raise SystemExit(f"the corpora are read from disk: pass --data-root DIR or set {DATA_ENV}=DIR (a folder "
                         "holding ptb/ and wikitext-2/)")  # fmt: skip
    if not os.path.isdir(root):
        raise SystemExit(f"the data root {root} (from --data-root or {DATA_ENV}) is not a folder")
    return root


PARTS = ["wikitext-2/wiki.train.tokens", "ptb/ptb.train.txt", "tinyshakespeare/input.txt"]


def build_corpus(path: str, megabytes: int, root: str) -> None:
    if os.path.exists(path) and os.path.getsize(path) >= megabytes * 1_000_000:
        return
    texts = []
    for part in PARTS:
        with open(os.path.join(root, part), "rb") as f:
            texts.append(f.read())
    with open(path, "wb") as f:
        written = 0
        while written < megabytes * 1_000_000:
            for text in texts:
                f.write(text)
                written += len(text)


def run_measured(cmd: list[str], env: dict | None = None) -> tuple[float, int, str]:
    """Wall seconds, peak RSS (bytes) and stdout of one child process."""
    with tempfile.TemporaryFile() as stdout, tempfile.TemporaryFile() as stderr:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=stdout, stderr=stderr, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        elapsed = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        stdout.seek(0)
        stderr.seek(0)
        out, err = stdout.read().decode(), stderr.read().decode()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{err[-3000:]}")
    return elapsed, usage.ru_maxrss * 1024, out


STARTUP_CHILD = """
import json, sys, time
t0 = float(sys.argv[1])
try:
    import longseq.train.trainer as loop  # today's layout
except ImportError:
    import longseq.train.loop as loop  # the layout before the Trainer (--old-src)
class FirstStep(BaseException):
    pass
def stop(step, model):
    raise FirstStep
real = loop.train
loop.train = lambda *a, **k: real(*a, **{**k, "after_backward": stop})
from longseq.cli import main
try:
    main(sys.argv[2:])
except FirstStep:
    print(json.dumps({"startup_s": time.time() - t0}))
"""


def startup(argv: list[str], src: str, rounds: int = 1) -> dict:
    """Median seconds from process start to the first backward pass, and the largest peak RSS, over ``rounds``."""
    env = {**os.environ, "PYTHONPATH": src}
    seconds, peaks = [], []
    for _ in range(rounds):
        _, rss, out = run_measured([sys.executable, "-c", STARTUP_CHILD, repr(time.time()), "train", *argv], env)
        seconds.append(json.loads(out.strip().splitlines()[-1])["startup_s"])
        peaks.append(rss / 2**30)
    return {"startup_s": statistics.median(seconds), "rounds": rounds, "peak_rss_gib": max(peaks)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=300)
    parser.add_argument("--data-root", help=f"the folder of wikitext-2/, ptb/, tinyshakespeare/ (default: ${DATA_ENV})")
    parser.add_argument("--tokenizers", nargs="+", default=["bpe", "word", "byte"])
    parser.add_argument("--vocab-size", type=int, default=4096)
    parser.add_argument("--work", default="/tmp/longseq-bench")
    parser.add_argument("--old-src", help="source tree of the code before prepared corpora, for its in-RAM start-up")
    parser.add_argument("--rounds", type=int, default=3, help="start-ups on each prepared corpus (median)")
    parser.add_argument("--ram-rounds", type=int, default=1, help="start-ups in RAM (median)")
    parser.add_argument("--startup-only", action="store_true", help="reuse prepared directories already in --work")
    parser.add_argument("--skip-in-ram", nargs="*", default=[], help="tokenizers whose in-RAM start-up to skip")
    args = parser.parse_args()
    src = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository
    os.makedirs(args.work, exist_ok=True)
    big = os.path.join(args.work, f"corpus-{args.mb}mb.txt")
    build_corpus(big, args.mb, data_root(args.data_root))
    print(json.dumps({"corpus": big, "bytes": os.path.getsize(big)}), flush=True)
    for spec in args.tokenizers:
        out = os.path.join(args.work, f"prepared-{spec}")
        if not (args.startup_only and os.path.isdir(out)):
            subprocess.run(["rm", "-rf", out], check=True)
            cmd = [sys.executable, "-m", "longseq", "data", "prepare", "--data", big, "--tokenizer", spec,
                   "--vocab-size", str(args.vocab_size), "--out", out, "--json", "--quiet"]  # fmt: skip
            wall, rss, stdout = run_measured(cmd, {**os.environ, "PYTHONPATH": src})
            summary = json.loads(stdout.strip().splitlines()[-1])
            record = {"tokenizer": spec, "prepare_wall_s": wall, "prepare_peak_rss_gib": rss / 2**30, **summary}
            print(json.dumps(record), flush=True)
        run_dir = os.path.join(args.work, "runs")
        train_args = ["--out", os.path.join(run_dir, f"{spec}-prepared"), "--quiet"]
        record = {"tokenizer": spec, "prepared": startup(["--data", out, *train_args], src, args.rounds)}
        if spec not in args.skip_in_ram:
            ram_args = ["--data", big, "--tokenizer", spec, "--out", os.path.join(run_dir, f"{spec}-ram"), "--quiet"]
            bpe = ["--vocab-size", str(args.vocab_size)] if spec == "bpe" else []
            record["in_ram"] = startup([*ram_args, *bpe], src, args.ram_rounds)
            if args.old_src and spec in ("byte", "char", "word"):
                record["in_ram_before"] = startup(ram_args, args.old_src, args.ram_rounds)
        print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
