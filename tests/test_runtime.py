"""Importing longseq makes glibc keep freed memory: once a loop of large allocations (a training step's tensors)
has run a few times, its tensors come from pages already mapped (no page faults), where glibc's defaults map and
fault them in afresh every time."""

import os
import platform
import subprocess
import sys

import pytest
from support import tiny_run

REALLOCATE = """
import resource, torch
import longseq, longseq.runtime
for step in range(4):  # tensors of 64 and 32 MiB, above glibc's largest mmap threshold (32 MiB)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    activations, scores = torch.ones(2**24), torch.ones(2**23)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    del activations, scores
print(faults, longseq.runtime.allocator())
"""


def reallocation_faults(malloc: str | None) -> tuple[int, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "LONGSEQ_MALLOC"}
    if malloc:
        env["LONGSEQ_MALLOC"] = malloc
    done = subprocess.run([sys.executable, "-c", REALLOCATE], capture_output=True, text=True, env=env, check=True)
    faults, allocator = done.stdout.strip().split(" ", 1)
    return int(faults), allocator


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the allocator settings are glibc's")
def test_freed_memory_is_reused_without_page_faults():
    kept, how = reallocation_faults(None)
    system, default = reallocation_faults("system")
    assert how.startswith("glibc, freed memory kept") and default == "system"
    assert kept < 16 < system, (kept, system)  # 96 MiB is 24,576 pages of 4 KiB (48 of 2 MiB)


def test_tensorfloat32_is_set_on_cuda_only_and_the_trainer_passes_its_setting(tmp_path, monkeypatch):
    """``matmul_precision`` reaches torch on a CUDA device string and leaves a CPU run's float32 alone."""
    import torch

    import longseq.runtime
    import longseq.train.trainer
    from longseq.api import train

    calls = []
    monkeypatch.setattr(torch, "set_float32_matmul_precision", calls.append)
    longseq.runtime.set_matmul_precision("cpu", "high")
    assert calls == []
    longseq.runtime.set_matmul_precision("cuda:1", "medium")
    longseq.runtime.set_matmul_precision(torch.device("cuda"), "highest")
    assert calls == ["medium", "highest"]
    seen = []
    monkeypatch.setattr(longseq.train.trainer, "set_matmul_precision", lambda device, p: seen.append((str(device), p)))
    train(tiny_run(max_steps=1, matmul_precision="medium"), str(tmp_path / "run"), progress=False)
    assert seen == [("cpu", "medium")]
