"""The package map of docs/ARCHITECTURE.md is a claim about imports: a package imports only those listed below it.

The order is read from the map itself, so the test fails if the code imports upward or if the map and the code
drift apart (a package missing from the map, or listed in another order than the imports allow)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "longseq"


def map_order() -> list[str]:
    """The top-level entries of the map's code block, top to bottom (``cli/`` -> ``cli``, ``runtime.py`` ->
    ``runtime``)."""
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    block = text.split("```", 2)[1]
    return re.findall(r"^([a-z_]+)(?:/|\.py)\s", block, flags=re.MULTILINE)


def top_level(path: Path) -> str:
    return path.relative_to(PACKAGE).parts[0].removesuffix(".py")


def imported_packages(path: Path, package: tuple[str, ...] = ()) -> set[str]:
    """The ``longseq`` packages ``path`` imports; relative imports are resolved against ``package`` (the module's
    package, e.g. ``("longseq", "diagnostics")``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = list(package[: len(package) - node.level + 1]) if node.level else []
            modules = [".".join([*base, *([node.module] if node.module else [])])]
        elif isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        else:
            continue
        for module in modules:
            parts = module.split(".")
            if parts[0] == "longseq" and len(parts) > 1:
                found.add(parts[1])
    return found


def package_of(path: Path) -> tuple[str, ...]:
    return ("longseq", *path.relative_to(PACKAGE).parts[:-1])


def imported_modules(path: Path) -> set[str]:
    """Every ``longseq`` module ``path`` imports, by its dotted name (``from longseq.tasks.base import Task`` ->
    ``longseq.tasks.base``; ``from longseq.tasks import task_for`` -> ``longseq.tasks``, the registry)."""
    package = package_of(path)
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = list(package[: len(package) - node.level + 1]) if node.level else []
            found.add(".".join([*base, *([node.module] if node.module else [])]))
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
    return {m for m in found if m.split(".")[0] == "longseq"}


def test_every_package_is_on_the_map():
    entries = {top_level(p) for p in PACKAGE.rglob("*.py")} - {"__init__", "__main__"}
    missing = entries - set(map_order())
    assert not missing, f"not on docs/ARCHITECTURE.md's map: {sorted(missing)}"


def test_no_package_imports_one_listed_above_it():
    order = map_order()
    upward = []
    for path in PACKAGE.rglob("*.py"):
        source = top_level(path)
        if source not in order:
            continue
        for target in imported_packages(path, package_of(path)) - {source}:
            if target in order and order.index(target) < order.index(source):
                upward.append(f"{path.relative_to(ROOT)} imports longseq.{target}")
    assert not upward, "imports against the map's order: " + "; ".join(sorted(upward))


def test_the_trainer_knows_tasks_by_their_interface_only():
    """``train/`` imports no task (``tasks/lm.py``, ``classify.py`` ...), only their interface (``tasks/base.py``):
    choosing the task a run names and giving it to the Trainer is the entry points' (``longseq/api.py``).  The one
    module that reads the registry is ``checkpoint.py``, whose ``load_checkpoint`` builds the model a saved run
    config names (a language model or a task's)."""
    tasks = {}
    for path in (PACKAGE / "train").rglob("*.py"):
        for module in imported_modules(path):
            if module.startswith("longseq.tasks") and module != "longseq.tasks.base":
                tasks.setdefault(module, set()).add(path.name)
    assert tasks == {"longseq.tasks": {"checkpoint.py"}}


def test_the_check_sees_an_upward_import(tmp_path):
    """The scan itself: an import of ``longseq.cli`` is found where it is written, absolute or relative."""
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from longseq.cli import common\n")
    assert imported_packages(module) == {"cli"}
    module.write_text("from ..eval import context\nfrom . import plots\n")
    assert imported_packages(module, ("longseq", "diagnostics")) == {"eval", "diagnostics"}


def test_the_optional_integrations_are_imported_only_when_asked_for():
    """``import longseq``, the command line's parser and the modules that mention the extras (the trainer, the
    corpus readers, predict) import none of lm_eval, datasets and wandb: the core install does not need them."""
    import subprocess
    import sys

    code = (
        "import sys, longseq, longseq.cli, longseq.api, longseq.train.trainer, longseq.data.corpus, longseq.data.tables, "
        "longseq.cli.predict, longseq.integrations\n"
        "longseq.cli.build_parser()\n"
        "print(sorted(m for m in ('lm_eval', 'datasets', 'wandb') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


def test_an_absent_extra_is_named_with_its_install_line(tmp_path, monkeypatch):
    """Asking for W&B or a table without the package installed is one error that says what to install."""
    import sys

    import pytest

    from longseq.config import ConfigError
    from longseq.data.sources import CorpusError
    from longseq.data.tables import open_table
    from longseq.train.tracking import WandbTracker

    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb now raises ImportError
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(ConfigError, match=r'pip install "longseq\[wandb\]"'):
        WandbTracker(str(tmp_path), "p", {})
    (tmp_path / "t.parquet").write_bytes(b"")
    with pytest.raises(
        CorpusError, match=r'reading it needs the datasets library \(pip install "longseq\[datasets\]"\)'
    ):
        open_table(str(tmp_path / "t.parquet"), ["text"])


def test_the_memory_steps_and_the_layers_keep_their_declared_interfaces():
    """Every memory step defines each method of :class:`MemoryStep` with its parameters; every kind of layer the
    stack builds says by a bool ``attends`` how it reads its context and takes the :class:`StackLayer` call."""
    import inspect

    from longseq.model.hourglass import Hourglass
    from longseq.model.layers import StackLayer
    from longseq.model.memory.cache import KeyValueStep
    from longseq.model.memory.policy import MemoryStep
    from longseq.model.memory.step import HiddenStep
    from longseq.model.mixers import MixerLayer
    from longseq.model.stack import DecoderLayer

    def parameters(function) -> list[str]:
        return list(inspect.signature(function).parameters)

    declared = {n: parameters(f) for n, f in vars(MemoryStep).items() if inspect.isfunction(f) and n[0] != "_"}
    assert len(declared) == 9
    for step in (HiddenStep, KeyValueStep):
        assert {n: parameters(getattr(step, n, None) or (lambda: 0)) for n in declared} == declared, step
    call = parameters(StackLayer.__call__)
    for layer in (DecoderLayer, MixerLayer, Hourglass):
        assert isinstance(layer.attends, bool), layer
        assert parameters(layer.forward) == call, layer
