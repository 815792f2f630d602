"""The same benchmarks on two source trees of longseq, alternating, in one sitting: before and after a change.

Each round runs every command once on tree A, then once on tree B (the order flips every round, so a trend in
the machine's load falls on both), each in a fresh process with ``PYTHONPATH`` set to its tree.  The figures of
every ``--json`` result are collected and the medians and the B/A ratios reported.

    git worktree add /tmp/before b15639a
    python benchmarks/tools/compare_trees.py --a /tmp/before --b . --rounds 3 [--json]

Commands: ``longseq bench train`` (tokens/s, and MFU), the same with ``--compile`` (the whole model compiled),
``longseq bench eval`` (ms per token), ``longseq bench generate``
(tokens/s) and each tree's own ``benchmarks/speed/vs_hf.py train eval generate`` (``benchmarks/vs_hf.py`` in trees
from before the benchmarks were laid out by purpose; longseq against HF TransfoXL in the same process pool: the HF
figures are the same code on both trees, a check that the machine stayed the same).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys

COMMANDS = {
    "bench train": ["-m", "longseq", "bench", "train", "--json", "--threads", "2", "--steps", "4"],
    "bench train compiled": [
        "-m",
        "longseq",
        "bench",
        "train",
        "--json",
        "--threads",
        "2",
        "--steps",
        "4",
        "--compile",
    ],
    "bench eval": ["-m", "longseq", "bench", "eval", "--json", "--threads", "2", "--steps", "4"],
    "bench generate": ["-m", "longseq", "bench", "generate", "--json", "--threads", "2"],
    "vs_hf": ["{vs_hf}", "train", "eval", "generate", "--rounds", "1", "--json"],
}


def vs_hf_script(tree: str) -> str:
    """The tree's vs_hf.py: under benchmarks/speed/, or in benchmarks/ in older trees."""
    for path in ("benchmarks/speed/vs_hf.py", "benchmarks/vs_hf.py"):
        if os.path.exists(os.path.join(tree, path)):
            return os.path.join(tree, path)
    raise SystemExit(f"{tree} has no benchmarks/speed/vs_hf.py (nor benchmarks/vs_hf.py)")


def run(tree: str, name: str) -> dict:
    args = [a.format(vs_hf=vs_hf_script(tree)) if a == "{vs_hf}" else a for a in COMMANDS[name]]
    env = {**os.environ, "PYTHONPATH": os.path.abspath(tree), "OMP_NUM_THREADS": "2"}
    done = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, cwd=tree)
    if done.returncode:
        raise RuntimeError(f"{name} on {tree} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def numbers(result, prefix: str = "") -> dict[str, float]:
    """Every numeric leaf of a JSON result, by dotted path (lists by index)."""
    out: dict[str, float] = {}
    items = result.items() if isinstance(result, dict) else enumerate(result)
    for key, value in items:
        path = f"{prefix}{key}"
        if isinstance(value, (dict, list)):
            out.update(numbers(value, path + "."))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[path] = float(value)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--a", required=True, help="the first tree (before)")
    parser.add_argument("--b", required=True, help="the second tree (after)")
    parser.add_argument("--commands", nargs="+", default=list(COMMANDS), choices=list(COMMANDS))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    samples: dict[str, dict[str, list[float]]] = {"a": {}, "b": {}}
    for r in range(args.rounds):
        order = [("a", args.a), ("b", args.b)] if r % 2 == 0 else [("b", args.b), ("a", args.a)]
        for name in args.commands:
            for side, tree in order:
                for key, value in numbers(run(tree, name)).items():
                    samples[side].setdefault(f"{name}: {key}", []).append(value)
            print(f"round {r + 1}: {name} done", file=sys.stderr, flush=True)
    rows = []
    for key in samples["a"]:
        if key not in samples["b"]:
            continue
        a, b = statistics.median(samples["a"][key]), statistics.median(samples["b"][key])
        rows.append({"figure": key, "a": a, "b": b, "b_over_a": b / a if a else None})
    result = {"a": args.a, "b": args.b, "rounds": args.rounds, "cpu": platform.processor(), "rows": rows}
    if args.json:
        print(json.dumps(result))
        return
    for row in rows:
        ratio = "" if row["b_over_a"] is None else f"{row['b_over_a']:.3f}"
        print(f"{row['figure']:<60} {row['a']:>14.4f} {row['b']:>14.4f} {ratio:>8}")


if __name__ == "__main__":
    main()
