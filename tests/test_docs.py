"""The documents cannot drift from the code: every Python block of README.md and docs/*.md runs as pasted alone
(each in a fresh namespace and a fresh directory), and every ``longseq ...`` command line in them is parsed by the
real command-line parser.  A block that needs an optional package says so on its first line, ``# requires:
transformers>=5`` (or ``<5``), and runs only where that holds; a page whose every block needs an optional module
says ``<!-- requires: MODULE -->`` and its blocks run where that module imports."""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import pytest

from longseq.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)


def blocks(page: Path, language: str) -> list[str]:
    return blocks_of(page.read_text(encoding="utf-8"), language)


def blocks_of(text: str, language: str) -> list[str]:
    return [body for lang, body in FENCE.findall(text) if lang == language]


REQUIRES = re.compile(r"# requires: ([\w-]+)\s*(>=|<)\s*(\d+)")


def unmet_requirement(body: str) -> str | None:
    """What a block's ``# requires:`` line asks that this environment lacks (by major version), or None."""
    from importlib.metadata import PackageNotFoundError, version

    wanted = REQUIRES.match(body)
    if wanted is None:
        return None
    package, op, major = wanted.group(1), wanted.group(2), int(wanted.group(3))
    try:
        have = int(version(package).split(".")[0])
    except PackageNotFoundError:
        return f"{package} is not installed"
    ok = have >= major if op == ">=" else have < major
    return None if ok else f"{package} {version(package)} is installed"


PAGE_REQUIRES = re.compile(r"<!-- requires: ([\w.]+) -->")


def missing_modules(page: Path) -> list[str]:
    """The modules a page's ``<!-- requires: MODULE -->`` names that cannot be found here."""
    from importlib.util import find_spec

    return [m for m in PAGE_REQUIRES.findall(page.read_text(encoding="utf-8")) if find_spec(m) is None]


def command_lines(page: Path) -> list[str]:
    """The ``longseq`` invocations of a page's shell blocks (continued lines joined; ``torchrun ... -m longseq``
    and ``python -m longseq`` included), without comments."""
    found = []
    for body in blocks(page, "bash"):
        for line in body.replace("\\\n", " ").splitlines():
            line = line.split(" #")[0].strip()
            for part in re.split(r"\s*(?:&&|\|\||;)\s*", line):
                words = shlex.split(part) if part else []
                if "longseq" in words:
                    at = words.index("longseq")
                    if at == 0 or words[at - 1] == "-m":
                        found.append(" ".join(shlex.quote(w) for w in words[at:]))
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_command_line_in_the_documents_parses(page):
    parser = build_parser()
    for line in command_lines(page):
        try:
            parser.parse_args(shlex.split(line)[1:])
        except SystemExit as stop:
            raise AssertionError(f"{page.name}: `{line}` does not parse") from stop


PYTHON_BLOCKS = [(page, number) for page in PAGES for number in range(1, len(blocks(page, "python")) + 1)]


@pytest.mark.parametrize("page, number", PYTHON_BLOCKS, ids=[f"{p.name}-{n}" for p, n in PYTHON_BLOCKS])
def test_every_python_block_in_the_documents_runs_as_pasted_alone(page, number, tmp_path, monkeypatch):
    """Each block in a fresh namespace and a fresh directory: a reader pastes one block, not the page."""
    if missing_modules(page):
        pytest.skip(f"{page.name} needs {', '.join(missing_modules(page))} (an optional extra)")
    body = blocks(page, "python")[number - 1]
    if unmet_requirement(body):
        pytest.skip(f"{page.name}, python block {number}: {unmet_requirement(body)}")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LONGSEQ_DOCS_TEST", "1")
    try:
        exec(compile(body, f"{page.name}, python block {number}", "exec"), {"__name__": "__docs__"})
    except Exception as exc:
        raise AssertionError(f"{page.name}, python block {number} fails when pasted alone: {exc!r}") from exc


LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives a page's headings: lowercased, punctuation dropped, spaces made hyphens."""
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    headings = re.findall(r"^#+\s+(.*?)\s*$", text, re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_link_in_the_documents_resolves(page):
    """A relative link names a file (or a folder) that exists, and its #anchor a heading of that file (BENCHMARKS.md is
    generated: a renamed section breaks the links to it here, not silently on GitHub)."""
    for target in LINK.findall(FENCE.sub("", page.read_text(encoding="utf-8"))):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        assert linked.is_file() or (linked.is_dir() and not anchor), f"{page.name}: link to {target}: no file {linked}"
        if anchor:
            assert anchor in anchors(linked), f"{page.name}: link to {target}: no such heading in {linked.name}"


def test_the_readme_is_short():
    assert len((ROOT / "README.md").read_bytes()) <= 10 * 1024


def test_the_quickstart_is_two_commands_and_ci_runs_the_second_verbatim():
    """A fresh machine needs two command lines from the README: one installs longseq and runs ``longseq train``, one
    installs the test extra and runs the tests, which is exactly what ``.ci/run`` runs after its CPU torch line.
    The README says how to get the small CPU build of torch instead of PyPI's CUDA one."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    quickstart = readme.partition("## Quickstart\n")[2].split("\n## ")[0]
    commands = [line for line in blocks_of(quickstart, "bash")[0].splitlines() if line.strip()]
    assert len(commands) == 2, commands
    assert commands[0].startswith("pip install . ") and commands[0].endswith("&& longseq train"), commands[0]
    assert commands[1].startswith('pip install ".[test]" &&'), commands[1]
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    torch_line = next(i for i, line in enumerate(ci) if line.startswith("pip install torch"))
    assert [line for line in ci[torch_line + 1 :] if line.strip() and not line.startswith("#")] == [commands[1]]
    assert "pip install torch --index-url https://download.pytorch.org/whl/cpu" in quickstart


def test_the_gpu_page_reports_the_gpu_sessions_the_results_hold():
    """docs/gpu.md said "What has been run on a GPU: nothing yet" and then reported the H200 session's findings:
    while benchmarks/results/gpu holds a session, the page says it ran, links to its results and names no nothing."""
    page = (ROOT / "docs" / "gpu.md").read_text(encoding="utf-8")
    session = (ROOT / "benchmarks" / "results" / "gpu" / "README.md").read_text(encoding="utf-8").splitlines()[0]
    date = re.search(r"\d{4}-\d\d-\d\d", session).group(0)
    said = page.partition("**What has been run on a GPU:")[2].split("\n\n")[0]
    assert said and "nothing" not in said.split(".")[0] and date in said and "gpu/RESULTS.md#on-an-h200" in said


def test_the_command_reference_lists_every_command_and_flag():
    """docs/cli.md has a section for every command and names every flag of its parser."""
    import argparse

    reference = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    for name, parser in commands.items():
        section = reference.partition(f"## longseq {name}\n")[2].split("\n## ")[0]
        assert section, f"docs/cli.md has no section '## longseq {name}'"
        for action in parser._actions:
            for flag in action.option_strings:
                if flag not in ("-h", "--help"):
                    assert f"`{flag}" in section, f"docs/cli.md, longseq {name}: {flag} is not described"


def test_the_documents_are_found():
    """The tests above read something: the README has both kinds of block, and docs/ has its pages."""
    assert blocks(ROOT / "README.md", "python") and command_lines(ROOT / "README.md")
    assert len(PAGES) >= 2 and os.path.isdir(ROOT / "docs")
