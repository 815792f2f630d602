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
