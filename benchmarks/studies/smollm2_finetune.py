"""SmolLM2-135M-Instruct fine-tuned on tiny-shakespeare with one command (issue 57, part 3), killed by SIGTERM
halfway and resumed: does it continue exactly where the uninterrupted run goes?

    python benchmarks/studies/smollm2_finetune.py --checkpoint runs/smollm2 \\
        --data $LONGSEQ_DATA/tinyshakespeare/input.txt --work /tmp/smollm2-ft \\
        --out benchmarks/results/pretrained/finetune.json

Both runs are ``longseq finetune --task clm`` with the settings below (LoRA adapters of rank 8 on attention, the
memory carried and back-propagated through 2 segments, layer-wise decay 0.8): one uninterrupted, one sent SIGTERM
once step ``--kill-after`` is logged, then ``--resume``-d.  The JSON holds both runs' losses by step, whether they
are equal bit for bit, whether the final weights and training states are, the exit code of the killed run, and the
seconds each took.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", required=True, help="longseq's checkpoint of SmolLM2 (longseq convert)")
    p.add_argument("--data", required=True, help="tinyshakespeare/input.txt")
    p.add_argument("--work", required=True, help="the two run directories go here (checkpoints: ~1 GB each)")
    p.add_argument("--out", help="write the figures as JSON here")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--kill-after", type=int, default=4, help="SIGTERM once this step is logged")
    return p.parse_args(argv)


def command(args, out: str, *extra: str) -> list[str]:
    """The one command a user runs (docs/pretrained.md), with this study's steps."""
    return [sys.executable, "-m", "longseq", "finetune", "--task", "clm", "--data", args.data,
            "--checkpoint", args.checkpoint, "--out", out, "--lora-rank", "8", "--lr", "1e-3",
            "--steps", str(args.steps), "--batch-size", "1", "--segment-len", "256",
            "--set", "mem_len=512", "mem_bptt=2", "eval_max_segments=4", "--quiet", *extra]  # fmt: skip


def losses(run_dir: str) -> list[list]:
    with open(os.path.join(run_dir, "metrics.jsonl"), encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [[r["step"], r["loss"]] for r in rows if "loss" in r and "step" in r]


def killed_and_resumed(args, out: str) -> dict:
    """The run, sent SIGTERM once step ``kill_after`` is in its log, then resumed."""
    start = time.perf_counter()
    proc = subprocess.Popen(command(args, out), cwd=ROOT)
    while proc.poll() is None:
        time.sleep(2)
        if os.path.exists(os.path.join(out, "metrics.jsonl")) and any(
            step >= args.kill_after for step, _ in losses(out)
        ):
            proc.send_signal(signal.SIGTERM)
            break
    code = proc.wait()
    logged = [step for step, _ in losses(out)]
    subprocess.run(command(args, out, "--resume"), cwd=ROOT, check=True)
    return {"exit_code": code, "logged_before_resume": logged, "seconds": time.perf_counter() - start}


def same_tensors(a: str, b: str) -> bool:
    from safetensors.torch import load_file

    x, y = load_file(a), load_file(b)
    return x.keys() == y.keys() and all(bool((x[k] == y[k]).all()) for k in x)


def main(argv=None) -> dict:
    args = parse_args(argv)
    whole, cut = os.path.join(args.work, "whole"), os.path.join(args.work, "cut")
    start = time.perf_counter()
    if not os.path.exists(os.path.join(whole, "last")):
        subprocess.run(command(args, whole), cwd=ROOT, check=True)
    seconds = time.perf_counter() - start
    killed = killed_and_resumed(args, cut)
    result = {
        "command": " ".join(command(args, "OUT")[1:]),
        "whole": {"losses": losses(whole), "seconds": seconds},
        "killed": {**killed, "losses": losses(cut)},
        "losses_equal": losses(whole) == losses(cut),
        "same_weights": same_tensors(os.path.join(whole, "last", "model.safetensors"),
                                     os.path.join(cut, "last", "model.safetensors")),
        "same_training_state": same_tensors(os.path.join(whole, "last", "trainer.safetensors"),
                                            os.path.join(cut, "last", "trainer.safetensors")),
    }  # fmt: skip
    print(json.dumps(result, indent=1))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
    return result


if __name__ == "__main__":
    main()
