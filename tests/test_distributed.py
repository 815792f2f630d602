"""Data-parallel (DDP) and sharded (FSDP) training under torchrun (gloo on CPU) against one process on the same
global batch, an exact two-rank resume, the configurations refused, and every collective handed tensors on the
process group's device (NCCL moves CUDA tensors only; PyTorch's ``meta`` device stands in for a GPU)."""

import json
import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
from safetensors import safe_open
from support import raises_naming

from longseq.config import ConfigError, ModelConfig, RunConfig, TrainConfig, get_preset
from longseq.config.checks import check_run
from longseq.data.corpus import load_corpus
from longseq.eval.evaluate import evaluate
from longseq.model import TransformerXLLM
from longseq.train.checkpoint import load_checkpoint, load_training_state
from longseq.train.distributed import World


def losses(path):
    with open(path / "metrics.jsonl") as f:
        return {r["step"]: r["loss"] for r in map(json.loads, f) if "loss" in r}


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_two_ranks_match_one_process_on_the_same_global_batch(tmp_path, text_corpus, parallel):
    data = text_corpus
    settings = ["--data", str(data), "--tokenizer", "char", "--quiet", "--set", "max_steps=20", "batch_size=4",
                "tgt_len=8", "mem_len=8", "dropout=0", "dropatt=0", "n_layer=2", "d_model=16", "n_head=2",
                "d_head=8", "d_inner=32", "eval_interval=10", "eval_max_segments=2", "log_interval=1"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    one = [sys.executable, "-m", "longseq", "train", "--out", str(tmp_path / "one"), *settings]
    subprocess.run(one, check=True, capture_output=True, env=env)
    two = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "longseq", "train", "--out", str(tmp_path / "two"), *settings, f"parallel={parallel}"]  # fmt: skip
    done = subprocess.run(two, capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[:4000] + "\n...\n" + done.stderr[-1500:]
    single, ddp = losses(tmp_path / "one"), losses(tmp_path / "two")
    assert sorted(ddp) == list(range(1, 21))
    for step in range(1, 21):
        assert abs(ddp[step] - single[step]) < 1e-5, (step, ddp[step], single[step])
    # rank 0 saved the memory of every rank: the whole batch of 4 streams
    mems = load_training_state(str(tmp_path / "two" / "last")).memory
    assert mems[0].shape[0] == 4
    assert done.stdout.count('"step"') <= 1  # only rank 0 reports
    # the checkpoint holds whole tensors in the one-process format: one process reads it and scores the
    # validation loss the two ranks logged
    with (
        safe_open(tmp_path / "one" / "last" / "model.safetensors", "pt") as one,
        safe_open(tmp_path / "two" / "last" / "model.safetensors", "pt") as two,
    ):
        assert set(one.keys()) == set(two.keys())
        assert all(one.get_slice(k).get_shape() == two.get_slice(k).get_shape() for k in one.keys())
    model, tokenizer, run, _ = load_checkpoint(str(tmp_path / "two" / "last"))
    valid = load_corpus(str(data), "char", tokenizer=tokenizer).valid
    size = min(run.data.eval_batch_size, len(valid) // 2)
    loss = evaluate(model, valid, batch_size=size, tgt_len=run.data.eval_tgt_len, max_segments=2)["loss"]
    logged = [r["valid_loss"] for r in map(json.loads, open(tmp_path / "two" / "metrics.jsonl")) if "valid_loss" in r]
    assert abs(loss - logged[-1]) < 1e-6


def test_two_ranks_train_a_stack_without_attention_as_one_process(tmp_path, text_corpus):
    """DDP needs a gradient for every parameter at every step: a stack of ssm, gla and delta layers (no attention,
    so no u and v) trains on two ranks past step 2, with the one-process run's losses."""
    settings = ["--data", str(text_corpus), "--tokenizer", "char", "--quiet", "--set", "max_steps=3",
                "batch_size=4", "tgt_len=8", "dropout=0", "n_layer=3", "mixer=ssm,gla,delta", "d_model=16",
                "n_head=2", "d_head=8", "d_inner=32", "eval_interval=1000", "log_interval=1"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    one = [sys.executable, "-m", "longseq", "train", "--out", str(tmp_path / "one"), *settings]
    subprocess.run(one, check=True, capture_output=True, env=env)
    two = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "longseq", "train", "--out", str(tmp_path / "two"), *settings, "parallel=ddp"]  # fmt: skip
    done = subprocess.run(two, capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    single, ddp = losses(tmp_path / "one"), losses(tmp_path / "two")
    assert sorted(ddp) == [1, 2, 3]
    assert all(abs(ddp[step] - single[step]) < 1e-5 for step in ddp), (ddp, single)


@pytest.mark.parametrize(
    "options",
    [
        ["parallel=ddp"],
        pytest.param(
            ["parallel=fsdp", "optimizer=lamb", "layer_lr_decay=0.8", "activation_checkpointing=1"],
            marks=pytest.mark.slow,
        ),
    ],
)
def test_two_rank_resume_continues_bit_for_bit(tmp_path, text_corpus, options):
    """Two ranks stopped after 6 steps and resumed give the uninterrupted two-rank run's losses exactly
    (with FSDP the optimizer moments are gathered into the checkpoint and cut into shards again)."""
    data = text_corpus
    common = ["--data", str(data), "--tokenizer", "char", "--quiet", "--set", "batch_size=4", "tgt_len=8",
              "mem_len=8", "n_layer=2", "d_model=16", "n_head=2", "d_head=8", "d_inner=32", "eval_interval=1000",
              "eval_max_segments=2", "log_interval=1", "schedule=constant", "warmup_steps=0", "dropout=0.1",
              "mem_len_start=-1"]  # the split run's max_steps changes: no schedule (lr, memory) may depend on it  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "longseq"]

    def run(out, steps, *extra):
        cmd = [*launch, "train", "--out", str(out), *extra, *common, *options, f"max_steps={steps}"]
        done = subprocess.run(cmd, capture_output=True, text=True, env=env)
        assert done.returncode == 0, done.stderr[:4000] + "\n...\n" + done.stderr[-1500:]

    run(tmp_path / "whole", 12)
    run(tmp_path / "split", 6)
    run(tmp_path / "split", 12, "--resume")
    whole, split = losses(tmp_path / "whole"), losses(tmp_path / "split")
    assert len(whole) == 12 and split == whole  # bit for bit, dropout included


def test_fsdp_configuration_errors():
    with pytest.raises(ConfigError, match="parallel must be ddp or fsdp"):
        TrainConfig(parallel="zero3")
    run = get_preset("tiny-shakespeare")
    lstm = RunConfig(ModelConfig(arch="lstm", vocab_size=11, d_model=8, n_layer=1), run.data,
                     run.train.replace(parallel="fsdp"))  # fmt: skip
    with raises_naming(ConfigError, "parallel=ddp", "arch=lstm"):
        check_run(lstm, world_size=2)
    check_run(lstm, world_size=1)  # one process ignores parallel


def test_every_collective_gets_tensors_on_the_worlds_device(monkeypatch):
    seen = []

    def spy(tensor_or_list, *args, **kwargs):
        tensors = tensor_or_list if isinstance(tensor_or_list, list) else [tensor_or_list]
        seen.extend(t.device for t in tensors)

    for name in ("all_reduce", "all_gather"):
        monkeypatch.setattr(dist, name, lambda out, *args, _spy=spy, **kwargs: _spy(out) or _spy(list(args[:1])))
    for device in ("meta", "cpu"):
        world = World(rank=0, size=2, device=torch.device(device))
        seen.clear()
        for collective in (lambda world=world: world.mean(1.5), lambda world=world: world.any(True)):
            try:
                collective()
            except RuntimeError:  # the result of a meta tensor cannot be read: only what was handed over counts
                pass
        memory = TransformerXLLM(ModelConfig(vocab_size=9, n_layer=2, d_model=8, n_head=2, d_head=4, d_inner=8,
                                             mem_len=3))(torch.randint(0, 9, (2, 4))).mems  # fmt: skip
        try:
            world.gather_memory(memory)
        except Exception:  # the spy gathers nothing back: only what was handed over is checked
            pass
        assert seen and all(d.type == device for d in seen), (device, seen)
