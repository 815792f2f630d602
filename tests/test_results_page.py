"""The results pages are drawn from the stored results: BENCHMARKS.md and every study's RESULTS.md must be what
``benchmarks/results/`` and the studies' declarations give, and a declaration must name only stored values.

Regenerates the pages in memory (JSON only: nothing is trained or timed) and compares them with the committed files;
after a change to the results or to a declaration, run ``python benchmarks/tools/results_page.py``.
"""

import glob
import importlib.util
import json
import os
import re
import sys

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..")
PAGE_LIMIT = 16 * 1024  # the index stays small (issue 56): the tables live on the studies' pages


def generator():
    path = os.path.join(ROOT, "benchmarks", "tools", "results_page.py")
    spec = importlib.util.spec_from_file_location("results_page", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # a dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


def test_every_page_is_what_the_stored_results_give():
    """Byte for byte, and no page is left over from a study that no longer declares tables."""
    pages = generator().render()
    for path, page in pages.items():
        with open(os.path.join(ROOT, path), encoding="utf-8") as f:
            assert f.read() == page, f"{path}: run `python benchmarks/tools/results_page.py` to regenerate"
    committed = {
        os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "benchmarks", "results", "*", "RESULTS.md"))
    }
    assert committed == set(pages) - {"BENCHMARKS.md"}


def test_the_index_stays_small():
    with open(os.path.join(ROOT, "BENCHMARKS.md"), "rb") as f:
        assert len(f.read()) <= PAGE_LIMIT


def test_every_link_on_the_pages_resolves():
    """The index's and the studies' links name files that exist, and their anchors headings of those files."""
    heading = lambda h: re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-")  # noqa: E731
    for path, page in generator().render().items():
        for target in re.findall(r"\]\(([^)\s]+)\)", page):
            file, _, anchor = target.partition("#")
            linked = (
                os.path.normpath(os.path.join(ROOT, os.path.dirname(path), file)) if file else os.path.join(ROOT, path)
            )
            assert os.path.exists(linked), f"{path}: link to {target}: no {linked}"
            if anchor:
                with open(linked, encoding="utf-8") as f:
                    headings = {heading(h) for h in re.findall(r"^#+\s+(.*?)\s*$", f.read(), re.MULTILINE)}
                assert anchor in headings, f"{path}: link to {target}: no such heading"


def test_spreads_are_the_runner_s():
    """The page computes mean ± std from per-seed files as the runner's summary does (sample std)."""
    page = generator()
    seeds = page.resolve("compaction-ptb-char-3000/xl/seed*/result.json#/test/bpc")
    summary = page.load("compaction-ptb-char-3000/summary.json")["variants"]["xl"]["test_bpc"]
    assert len(seeds) == 3 and page.as_stats(seeds) == summary


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """A results folder of one study: three seeds of a model and of its baseline, and the study's declaration."""
    page = generator()
    monkeypatch.setattr(page, "RESULTS", str(tmp_path))
    for variant, values in {"base": [2.0, 3.0, 4.0], "new": [1.0, 2.0, 3.0], "far": [0.5, 0.6, 0.7]}.items():
        for seed, value in enumerate(values, 1):
            os.makedirs(tmp_path / "toy" / variant / f"seed{seed}")
            run = {"test": {"bpc": value}, "params": 1000 * seed, "curve": [[10, 1.0, 3.0], [20, 2.0, value]]}
            (tmp_path / "toy" / variant / f"seed{seed}" / "result.json").write_text(json.dumps(run))
    bpc = {"ref": "toy/{row}/seed*/result.json#/test/bpc"}
    table = {
        "title": "Toy table",
        "columns": ["model", "params", {"head": "bpc ↓", "id": "bpc"}, "vs base", "last loss", "seed 3 / seed 1"],
        "align": "lrlrrr",
        "baseline": "base",
        "cells": ["{label}", {"ref": "toy/{row}/seed*/result.json#/params", "agg": "first", "fmt": "{:,}"},
                  {**bpc, "show": "spread"}, {"col": "bpc", "show": "versus"},
                  {"ref": "toy/{row}/seed1/result.json#/curve/-1/2", "fmt": "{:.1f}"},
                  {"ratio": [{"ref": "toy/{row}/seed3/result.json#/test/bpc"}, {"ref": "toy/{row}/seed1/result.json#/test/bpc"}],
                   "fmt": "{:.2f}x"}],
        "rows": [{"for": {"base": "the baseline", "new": "a new model", "far": "far better"}}],
    }  # fmt: skip
    study = {"title": "Toy", "question": "Does it work?", "machine": "a test", "date": "today", "tables": [table]}
    (tmp_path / "toy" / "study.json").write_text(json.dumps(study))
    return page, study, tmp_path


def test_a_declared_table_is_drawn_from_its_stored_values(toy):
    """Against values worked out by hand: means and sample std over the seeds, the gap to the baseline row (empty in
    that row) and whether the seeds' ranges are apart, a field of the first seed, the last item of a list, a ratio."""
    page, _, _ = toy
    drawn = page.study_page("toy")
    assert "## Toy table\n*a test, today*" in drawn
    assert "|model|params|bpc ↓|vs base|last loss|seed 3 / seed 1|\n|-|-:|-|-:|-:|-:|" in drawn
    assert "|the baseline|1,000|3.0000 ± 1.0000||2.0|2.00x|" in drawn
    assert (
        "|a new model|1,000|2.0000 ± 1.0000|+33.33% (overlap)|1.0|3.00x|" in drawn
    )  # (3 - 2) / 3; [1, 3] meets [2, 4]
    assert "|far better|1,000|0.6000 ± 0.1000|+80.00% (apart)|0.5|1.40x|" in drawn  # (3 - 0.6) / 3; [0.5, 0.7] < [2, 4]


@pytest.mark.parametrize(
    "cell, said",
    [
        ({"ref": "toy/{row}/seed*/result.json#/test/loss"}, "toy/new/seed*/result.json#/test/loss: nothing at 'loss'"),
        (
            {"ref": "toy/{row}/seed9/result.json#/test/bpc"},
            "no stored file benchmarks/results/toy/new/seed9/result.json",
        ),
        ({"ref": "tey/{row}/seed*/result.json#/test/bpc"}, "no stored file matches benchmarks/results/tey/new/seed*"),
        ({"ref": "toy/{row}/seed1/result.json#/curve/7/2"}, "nothing at '7'"),
    ],
)
def test_a_reference_to_nothing_stored_names_the_study_table_row_and_column(toy, cell, said):
    page, study, tmp_path = toy
    table = study["tables"][0]
    table["rows"] = [*table["rows"], {"for": {"new": "again"}, "cells": [*table["cells"][:4], cell, ""]}]
    (tmp_path / "toy" / "study.json").write_text(json.dumps(study))
    page.load.cache_clear()
    with pytest.raises(page.DeclarationError) as error:
        page.study_page("toy")
    message = str(error.value)
    assert (
        "benchmarks/results/toy/study.json, table 'Toy table'" in message and "row 'new', column 'last loss'" in message
    )
    assert said in message


def test_the_index_links_only_declared_tables(toy):
    page, _, tmp_path = toy
    (tmp_path / "index.json").write_text(json.dumps({"title": "I", "intro": [], "questions": [
        {"question": "Q?", "text": ["{gap}"], "see": ["toy#Toy tabel"],
         "values": {"gap": {"ref": "toy/new/seed*/result.json#/test/bpc", "show": "gain",
                            "base": {"ref": "toy/base/seed*/result.json#/test/bpc"}}}}]}))  # fmt: skip
    page.load.cache_clear()
    with pytest.raises(page.DeclarationError, match="no table 'Toy tabel' in toy/study.json"):
        page.index_page()


def test_the_recall_summary_is_what_the_stored_rows_give():
    """recall/summary.json (the ≥99% edge the page shows) is ``recall.py --summarize`` of the stored rows."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks", "studies"))
    try:
        import recall
    finally:
        sys.path.pop(0)
    store = os.path.join(ROOT, "benchmarks", "results", "recall")
    with open(os.path.join(store, "summary.json"), encoding="utf-8") as f:
        assert recall.summarize_store(store) == json.load(f)


def test_the_stored_results_stay_under_2_mb():
    """The bytes of benchmarks/results' files (issue 56): per-step detail is thinned, figures kept where a page names
    them."""
    files = glob.glob(os.path.join(ROOT, "benchmarks", "results", "**", "*"), recursive=True)
    assert sum(os.path.getsize(f) for f in files if os.path.isfile(f)) < 2_000_000
