"""The results pages, drawn from declarations: ``BENCHMARKS.md`` (headline figures by question) and a ``RESULTS.md``
beside every study that declares tables.  Nothing here knows a study: ``benchmarks/results/index.json`` declares the
index, each ``STUDY/study.json`` its tables, and ``benchmarks/results/README.md`` says how.  Reads JSON only.

    python benchmarks/tools/results_page.py            # writes BENCHMARKS.md and every RESULTS.md
    python benchmarks/tools/results_page.py --check    # exit 1 when a page is not what the stored results give
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import glob
import json
import math
import os
import re
import statistics
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join(ROOT, "benchmarks", "results")
BITS = 1 / math.log(2)  # nats to bits
UNANCHORED = re.compile(r"[^\w\- ]")  # what GitHub drops from a heading to make its anchor


class DeclarationError(ValueError):
    """A declaration that does not resolve to stored values."""


@contextlib.contextmanager
def where(place: str):
    """Name ``place`` (the study, the table, the row, the column) in any error raised inside."""
    try:
        yield
    except (LookupError, TypeError, ValueError, ArithmeticError) as error:
        raise DeclarationError(f"{place}: {error}") from None


@functools.cache
def load(path: str):
    """A stored JSON file, by its path under benchmarks/results."""
    if not os.path.isfile(full := os.path.join(RESULTS, path)):
        raise DeclarationError(f"no stored file benchmarks/results/{path}")
    with open(full, encoding="utf-8") as f:
        return json.load(f)


def resolve(ref: str, item=None):
    """``FILE#/POINTER``: into a stored file (a list over a glob's files), or into ``item`` (no FILE)."""
    path, _, pointer = ref.partition("#")
    if not path or not re.search(r"[*?[]", path):
        return walk(load(path) if path else item, pointer.split("/")[1:], ref)
    if not (found := sorted(glob.glob(os.path.join(RESULTS, path)))):
        raise DeclarationError(f"{ref}: no stored file matches benchmarks/results/{path}")
    return [walk(load(os.path.relpath(p, RESULTS)), pointer.split("/")[1:], ref) for p in found]


def walk(node, parts: list[str], ref: str):
    """Follow a pointer's parts; ``*`` maps the rest over every item, ``FIELD=VALUE`` picks a list's first match."""
    for i, part in enumerate(parts):
        part = part.replace("~1", "/").replace("~0", "~")
        if part == "*":
            return [walk(v, parts[i + 1 :], ref) for v in (node.values() if isinstance(node, dict) else node)]
        if isinstance(node, list) and "=" in part:
            field, _, wanted = part.partition("=")
            node = next((x for x in node if str(x.get(field)) == wanted), KeyError)
        elif isinstance(node, list) and re.fullmatch(r"-?\d+", part) and -len(node) <= int(part) < len(node):
            node = node[int(part)]
        else:
            node = node.get(part, KeyError) if isinstance(node, dict) else KeyError
        if node is KeyError:
            raise DeclarationError(f"{ref}: nothing at {part!r}")
    return node


def as_stats(value) -> dict:
    """A runner summary's statistics, or the values' mean, sample std and range as the runner computes them."""
    if isinstance(value, dict):
        return value
    values = value if isinstance(value, list) else [value]
    n, mean = len(values), sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0
    return {"mean": mean, "std": std, "min": min(values), "max": max(values), "n": n}


def spread(s: dict, digits: int) -> str:
    """``mean ± std`` over seeds (their number where it is not 3), or the one value."""
    seeds = {1: " (1 seed)", 3: ""}.get(s["n"], f" ({s['n']} seeds)")
    return f"{s['mean']:.{digits}f}" + (f" ± {s['std']:.{digits}f}" if s["n"] > 1 else "") + seeds


def compare(show: str, base: dict, other: dict) -> str:
    """``gain``: how much lower ``other``'s mean is than ``base``'s, in percent (positive: better); ``apart``: whether
    the seeds' ranges are apart (never claimed with one seed); ``versus``: both."""
    gain = f"{100 * (base['mean'] - other['mean']) / base['mean']:+.2f}%"
    apart = "yes" if base["max"] < other["min"] or other["max"] < base["min"] else "no"
    apart = "(1 seed)" if min(base["n"], other["n"]) < 2 else apart
    versus = f"{gain} {({'yes': '(apart)', 'no': '(overlap)'}).get(apart, apart)}"
    return {"gain": gain, "apart": apart, "versus": versus}[show]


OPS = {"ratio": lambda a, b: a / b, "diff": lambda a, b: a - b, "sum": lambda *v: sum(v), "product": lambda *v: math.prod(v)}  # fmt: skip
AGG = {"mean": lambda v: sum(v) / len(v), "median": statistics.median, "first": lambda v: v[0], "count": len}


@dataclasses.dataclass
class Row:
    """A table row: its key (for the baseline), the names its text templates read, its item, its cells."""

    key: str | None = None
    names: dict = dataclasses.field(default_factory=dict)
    item: object = None
    cells: list = dataclasses.field(default_factory=list)
    is_base: bool = False
    raw: dict = dataclasses.field(default_factory=dict)  # the cells' values, by column id


def raw(cell, row: Row):
    """A cell's value before it is shown."""
    if not isinstance(cell, dict):
        return cell.format_map(row.names) if isinstance(cell, str) else cell
    if "ref" in cell:
        value = resolve(cell["ref"].format_map(row.names), row.item)
    elif "col" in cell:
        value = row.raw[cell["col"]]
    elif "args" in cell:
        return cell["fmt"].format(*(shown(c, row, raw(c, row)) for c in cell["args"]))
    elif op := next((k for k in OPS if k in cell), None):
        args = [raw(c, row) for c in cell[op]]
        value = None if None in args else OPS[op](*args)
    else:
        raise DeclarationError(f"a cell needs ref, col, args or one of {', '.join(OPS)}: {cell}")
    if cell.get("bits"):
        value = [v * BITS for v in value] if isinstance(value, list) else value * BITS
    value = AGG[cell["agg"]](value) if "agg" in cell else value
    return value * cell["scale"] if "scale" in cell and value is not None else value


def shown(cell, row: Row, value, base=None) -> str:
    """A cell's text (``base``: the baseline row's value of the same cell)."""
    if not isinstance(cell, dict):
        return "" if value is None else str(value)
    show = cell.get("show")
    if show in ("versus", "gain", "apart"):
        if "base" in cell:
            base = raw(cell["base"], row)
        elif row.is_base:
            return ""
        elif base is None:
            raise DeclarationError(f"show {show!r} needs a base, or a baseline row in the table")
        text = compare(show, as_stats(base), as_stats(value))
    elif value is None:
        return cell.get("none", "")
    elif show == "spread":
        text = spread(as_stats(value), cell.get("digits", 4))
    elif show == "pct":  # an accuracy as a percentage without trailing zeros: 0.369 -> 36.9%
        text = f"{100 * value:.{cell.get('digits', 2)}f}".rstrip("0").rstrip(".") + "%"
    elif show == "join":
        return cell.get("sep", ", ").join(formatted(cell, v) for v in value)
    elif show is None:
        return formatted(cell, value)
    else:
        raise DeclarationError(f"unknown show {show!r}")
    return cell.get("fmt", "{}").format(text)


def formatted(cell: dict, value) -> str:
    """A value's text: ``none`` for a null, ``map`` by value, or ``fmt``."""
    if value is None or str(value) in cell.get("map", {}):
        return cell.get("none", "") if value is None else cell["map"][str(value)]
    return str(value) if isinstance(value, str) or "fmt" not in cell else cell["fmt"].format(value)


def value_texts(values: dict) -> dict:
    """The named values a caption, a note or a question's text reads, as text."""
    return {name: shown(cell, Row(), raw(cell, Row())) for name, cell in values.items()}


def there(ref: str, item) -> bool:
    """Whether a reference names a true value (``where``: the items kept)."""
    with contextlib.suppress(DeclarationError):
        return bool(resolve(ref, item))
    return False


def rows_of(table: dict, ids: list[str]):
    """The table's rows, group by group (``for``, ``each``, or one row), each with the cells of its columns."""
    for group in table["rows"]:
        cells, names = group.get("cells", table.get("cells")), group.get("bind", {})
        if "for" in group:
            for key, spec in group["for"].items():
                spec = spec if isinstance(spec, dict) else {"label": spec}
                own = [spec.get("cells", {}).get(i, cell) for i, cell in zip(ids, cells)]
                yield Row(key, {**names, "row": key, "label": spec.get("label", key)}, None, own)
        elif "each" in group:
            items = resolve(group["each"].format_map(names))
            for key, item in items.items() if isinstance(items, dict) else enumerate(items):
                fields = {**(item if isinstance(item, dict) else {}), **names, "key": key}
                if "where" not in group or there(group["where"].format_map(fields), item):
                    yield Row(str(key), fields, item, cells)
        else:
            item = resolve(group["item"].format_map(names)) if "item" in group else None
            yield Row(names.get("key"), {**(item if isinstance(item, dict) else {}), **names}, item, cells)


def draw(table: dict) -> list[str]:
    """The markdown table: every row's values first, then their text beside the baseline row's."""
    heads = [c if isinstance(c, str) else c["head"] for c in table["columns"]]
    ids = [c if isinstance(c, str) else c.get("id", c["head"]) for c in table["columns"]]
    rows = list(rows_of(table, ids))
    for row in rows:
        row.is_base = row.key is not None and row.key == table.get("baseline")
        for i, cell in zip(ids, row.cells):
            with where(f"row {row.key!r}, column {i!r}"):
                row.raw[i] = raw(cell, row)
    base = next((row for row in rows if row.is_base), None)
    if "baseline" in table and base is None:
        raise DeclarationError(f"no row {table['baseline']!r} to be the baseline")
    align = table.get("align", "").ljust(len(heads), "l")
    lines = ["|" + "|".join(heads) + "|", "|" + "|".join("-:" if a == "r" else "-" for a in align[: len(heads)]) + "|"]
    for row in rows:
        with where(f"row {row.key!r}"):
            texts = [shown(cell, row, row.raw[i], base.raw[i] if base else None) for i, cell in zip(ids, row.cells)]
        lines.append("|" + "|".join(texts) + "|")
    return lines


def section(study: dict, table: dict) -> list[str]:
    """Heading, machine, date, commands, caption, table and notes; then the ``then`` tables (no heading)."""
    meta, named = (load(table["meta"]) if "meta" in table else study), value_texts(table.get("values", {}))
    commands = [raw(c, Row()) for c in table.get("commands", meta.get("commands", []) if "title" in table else [])]
    code = ["```bash", *commands, "```", ""] if commands else []
    caption = [*(line.format_map(named) for line in table.get("caption", [])), ""] if "caption" in table else []
    lines = [*caption, *code]
    if "title" in table:
        said = ", ".join(filter(None, [table.get("machine", meta["machine"]), table.get("date", meta.get("date"))]))
        place = f"; `{table['where']}`" if "where" in table else ""
        lines = [f"## {table['title']}", f"*{said}{place}*", "", *code, *caption]
    lines += [*draw(table), ""] if "columns" in table else []
    lines += [line for note in table.get("notes", []) for line in (note.format_map(named), "")]
    return lines + [line for more in table.get("then", []) for line in section(study, more)]


def study_page(name: str) -> str:
    study = load(f"{name}/study.json")
    lines = [f"# {study['title']}", "", study["question"], ""]
    lines += ["How the study went, what each file holds and what the figures mean: [README.md](README.md).", ""]
    for table in study["tables"]:
        with where(f"benchmarks/results/{name}/study.json, table {table.get('title')!r}"):
            lines += section(study, table)
    return "\n".join(lines).rstrip("\n") + "\n"


def link(target: str) -> str:
    """``STUDY#Table title``: that table on the study's page; otherwise a path under benchmarks/results."""
    name, _, title = target.partition("#")
    titles = [t.get("title") for t in load(f"{name}/study.json").get("tables", [])] if title else []
    if title not in [*titles, ""] or not os.path.exists(os.path.join(RESULTS, name)):
        raise DeclarationError(f"no table {title!r} in {name}/study.json" if title else f"no benchmarks/results/{name}")
    if not title:
        return f"[`{name}`](benchmarks/results/{name})"
    return f"[{title}](benchmarks/results/{name}/RESULTS.md#{UNANCHORED.sub('', title.lower()).replace(' ', '-')})"


def index_page() -> str:
    index = load("index.json")
    lines = [f"# {index['title']}", "", *index["intro"], ""]
    for question in index["questions"]:
        with where(f"benchmarks/results/index.json, question {question['question']!r}"):
            named = value_texts(question.get("values", {}))
            lines += [f"## {question['question']}", "", *(line.format_map(named) for line in question["text"]), ""]
            lines += ["More: " + " · ".join(link(t) for t in question["see"]) + ".", ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def render() -> dict[str, str]:
    """Every page, by its path under the repository: the index, and the page of every study that declares tables."""
    found = [os.path.relpath(p, RESULTS) for p in sorted(glob.glob(os.path.join(RESULTS, "*", "study.json")))]
    studies = [os.path.dirname(p) for p in found if "tables" in load(p)]
    return {"BENCHMARKS.md": index_page()} | {f"benchmarks/results/{n}/RESULTS.md": study_page(n) for n in studies}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a page differs from the stored results")
    check, pages = parser.parse_args(argv).check, render()
    stale = [p for p, page in pages.items() if not Path(ROOT, p).is_file() or Path(ROOT, p).read_text("utf-8") != page]
    if check and stale:
        raise SystemExit(f"{', '.join(stale)}: not what the stored results give; run benchmarks/tools/results_page.py")
    for path in [] if check else stale:
        Path(ROOT, path).write_text(pages[path], encoding="utf-8")
        print(f"wrote {path} ({len(pages[path].encode())} bytes)")


if __name__ == "__main__":
    main()
