"""docs/transformers.md is tested: its Python example runs (with transformers 5) and its command lines parse with
longseq's own parser."""

import re
import shlex
from pathlib import Path

import pytest

from longseq.cli import build_parser

PAGE = (Path(__file__).resolve().parent.parent / "docs" / "transformers.md").read_text()


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", PAGE, flags=re.S)


def test_command_lines_parse():
    lines = [line for block in blocks("bash") for line in block.splitlines() if line.startswith("longseq ")]
    assert len(lines) == 4
    for line in lines:
        args = build_parser().parse_args(shlex.split(line.split("#")[0])[1:])
        assert args.command == "convert", line


def test_python_example_runs():
    transformers = pytest.importorskip("transformers")
    if int(transformers.__version__.split(".")[0]) < 5:
        pytest.skip(f"the example needs transformers 5, this is {transformers.__version__}")
    runnable = [b for b in blocks("python") if not b.startswith("# transformers 4.x only")]
    assert len(runnable) == 1
    exec(compile(runnable[0], "docs/transformers.md", "exec"), {})  # asserts longseq's tokens inside
