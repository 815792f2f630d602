"""benchmarks/tools/gpu_check.py runs end to end on CPU in --quick mode and records every section (the GPU run is for a
session with a GPU): the sections that check equalities pass here too."""

import json
import os
import subprocess
import sys

import pytest

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "tools", "gpu_check.py")


@pytest.mark.slow
def test_gpu_check_quick_on_cpu_records_every_section(tmp_path):
    out = tmp_path / "check.json"
    sections = ["env", "recompiles", "ddp_smoke", "exact_resume"]
    cmd = [sys.executable, SCRIPT, "--device", "cpu", "--quick", "--out", str(out), "--sections", *sections]
    subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=tmp_path)
    report = json.loads(out.read_text())["sections"]
    assert list(report) == sections and not any("error" in s for s in report.values())
    assert report["ddp_smoke"]["ok"] and report["exact_resume"]["bit_identical"]


@pytest.mark.slow
def test_gpu_check_torchrun_stops_and_resumes_bit_identical_on_cpu(tmp_path):
    """The torchrun section launches two gloo ranks of `longseq train` under DDP and FSDP, stops them and resumes."""
    out = tmp_path / "check.json"
    cmd = [sys.executable, SCRIPT, "--device", "cpu", "--quick", "--out", str(out), "--sections", "torchrun"]
    subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=tmp_path)
    report = json.loads(out.read_text())["sections"]["torchrun"]
    assert report["processes"] == 2
    assert report["ddp"]["bit_identical"] and report["fsdp"]["bit_identical"]


def test_gpu_check_writes_where_the_environment_says_and_prints_it(tmp_path):
    """gpu_check wrote its JSON only into the working directory (lost on a machine whose tree is discarded) and printed
    section timings only; hf_ratio needed TransfoXL, which transformers 5 does not have."""
    out = tmp_path / "out"
    out.mkdir()
    sections = ["exact_resume", "env", "hf_ratio"]
    cmd = [sys.executable, SCRIPT, "--device", "cpu", "--quick", "--sections", *sections]
    done = subprocess.run(
        cmd, check=True, capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "OUT": str(out)}
    )
    written = json.loads((out / "gpu_check.json").read_text())
    assert not (tmp_path / "gpu_check.json").exists()
    printed = json.loads(done.stdout.split(f"wrote {out / 'gpu_check.json'}:\n", 1)[1])
    assert printed == written and written["sections"]["exact_resume"]["bit_identical"]
    import transformers

    if int(transformers.__version__.split(".")[0]) >= 5:
        assert "transformers 4" in written["sections"]["hf_ratio"]["skipped"]


def test_the_exact_resume_section_puts_the_matmul_precision_back(monkeypatch):
    """The Trainer of exact_resume set TF32 (matmul precision high) on CUDA for the process: every later section
    (host_syncs, compiled_speed, torchrun) measured with it.  The CUDA setting is made here on CPU too."""
    import argparse
    import importlib.util

    import torch

    import longseq.train.trainer as trainer

    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    monkeypatch.setattr(trainer, "set_matmul_precision", lambda device, p="high": torch.set_float32_matmul_precision(p))
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        result = gpu_check.section_exact_resume(argparse.Namespace(device="cpu", quick=True), None)
        assert result["bit_identical"] and torch.get_float32_matmul_precision() == "highest"
    finally:
        torch.set_float32_matmul_precision(before)
