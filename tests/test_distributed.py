"""Data-parallel training under torchrun (gloo on CPU) against one process on the same global batch."""

import json
import os
import subprocess
import sys

from test_train import corpus_file

from longseq.train.checkpoint import load_training_state


def losses(path):
    with open(path / "metrics.jsonl") as f:
        return {r["step"]: r["loss"] for r in map(json.loads, f) if "loss" in r}


def test_two_ranks_match_one_process_on_the_same_global_batch(tmp_path):
    data = corpus_file(tmp_path)
    settings = ["--data", str(data), "--tokenizer", "char", "--quiet", "--set", "max_steps=20", "batch_size=4",
                "tgt_len=8", "mem_len=8", "dropout=0", "dropatt=0", "n_layer=2", "d_model=16", "n_head=2",
                "d_head=8", "d_inner=32", "eval_interval=10", "eval_max_segments=2", "log_interval=1"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    one = [sys.executable, "-m", "longseq", "train", "--out", str(tmp_path / "one"), *settings]
    subprocess.run(one, check=True, capture_output=True, env=env)
    two = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "longseq", "train", "--out", str(tmp_path / "two"), *settings]  # fmt: skip
    done = subprocess.run(two, capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    single, ddp = losses(tmp_path / "one"), losses(tmp_path / "two")
    assert sorted(ddp) == list(range(1, 21))
    for step in range(1, 21):
        assert abs(ddp[step] - single[step]) < 1e-5, (step, ddp[step], single[step])
    # rank 0 saved the memory of every rank: the whole batch of 4 streams
    mems = load_training_state(str(tmp_path / "two" / "last")).mems
    assert mems[0].shape[0] == 4
    assert done.stdout.count('"step"') <= 1  # only rank 0 reports


def test_ddp_resume_continues_bit_for_bit(tmp_path):
    """Two ranks stopped after 6 steps and resumed give the uninterrupted two-rank run's losses exactly."""
    data = corpus_file(tmp_path)
    common = ["--data", str(data), "--tokenizer", "char", "--quiet", "--set", "batch_size=4", "tgt_len=8",
              "mem_len=8", "n_layer=2", "d_model=16", "n_head=2", "d_head=8", "d_inner=32", "eval_interval=1000",
              "eval_max_segments=2", "log_interval=1", "schedule=constant", "warmup_steps=0", "dropout=0.1"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "longseq"]

    def run(out, steps, *extra):
        cmd = [*launch, "train", "--out", str(out), *extra, *common, f"max_steps={steps}"]
        done = subprocess.run(cmd, capture_output=True, text=True, env=env)
        assert done.returncode == 0, done.stderr[-2000:]

    run(tmp_path / "whole", 12)
    run(tmp_path / "split", 6)
    run(tmp_path / "split", 12, "--resume")
    whole, split = losses(tmp_path / "whole"), losses(tmp_path / "split")
    assert len(whole) == 12 and split == whole  # bit for bit, dropout included
