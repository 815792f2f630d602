"""The configuration's surface and the code that says an option has no effect, counted from the source tree that
``longseq`` imports from (run it with ``PYTHONPATH`` at another checkout to count that one).

    python benchmarks/tools/config_surface.py [--json]

Prints, for every config class, its own fields (sections counted as fields) and its leaves; the ``--set`` leaves of a
run (the model, data and train sections, and the task section each task has); the leaves of each preset's model
config as it is built (the fields of the components it chose); and the lines of the reads/unread machinery: the
functions that refuse or list an option nothing reads (``MACHINERY``) and the declarations of what a choice reads (a
class's or an entry's ``reads``, ``unread`` or ``shares``, and the module tuples they are built from).  Then the
constructors of ``longseq/model``: the widest ``__init__`` (parameters after ``self``, ``*args`` and ``**kwargs``
counted once each) and ``RelativeMultiHeadAttention``'s; and the trips between the model registry and the config
package from ``api.train`` to the built model (:func:`trips`).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json
from pathlib import Path

import longseq
from longseq.config.base import CONFIG_CLASSES, leaf_paths

MACHINERY = (  # the functions that compute or refuse what nothing reads
    "ignored_options",
    "unread_options",
    "unread_hourglass",
    "check_options_apply",
    "check_task_options",
)
DECLARATIONS = ("reads", "unread", "shares")  # a choice's declaration of the options it reads (or not)
DECLARED_TUPLES = (
    "FINETUNE_OPTIONS",
    "RECALL_OPTIONS",
    "COMMON_UNREAD",
    "UV",
    "UNFORGETTING",
    "HEADS",
)  # module tuples they are built from


def config_classes() -> dict[str, dict]:
    """Every config class: its own fields and its leaves (the fields below its sections)."""
    out = {}
    for cls in CONFIG_CLASSES:
        if not dataclasses.is_dataclass(cls):
            continue
        out[cls.__name__] = {"fields": len(dataclasses.fields(cls)), "leaves": len(leaf_paths(cls))}
    return out


def set_leaves() -> dict[str, int]:
    """The ``--set`` leaves of a run by section: model, data and train, and the task section of each task."""
    from longseq.config import DataConfig, ModelConfig, TaskConfig, TrainConfig
    from longseq.config.run import RECALL_TASKS

    out = {name: len(leaf_paths(cls)) for name, cls in (("model", ModelConfig), ("data", DataConfig))}
    out["train"] = len(leaf_paths(TrainConfig))
    for name in ("lm", "classify", "span", "mlm", *RECALL_TASKS):
        task = TaskConfig(name=name, **({"train": "x.jsonl"} if name in ("classify", "span", "mlm") else {}))
        out[f"task ({name})"] = len(leaf_paths(type(task)))
    return out


def machinery() -> dict:
    """Lines of the functions in MACHINERY and of the declarations (class attributes and module tuples), by file,
    and the registry entries that declare what they read."""
    root = Path(longseq.__file__).parent
    functions, declarations = {}, {}
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text())
        where = str(path.relative_to(root.parent))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in MACHINERY:
                functions[f"{where}:{node.name}"] = node.end_lineno - node.lineno + 1
        scopes = [tree.body] + [n.body for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]
        for statement in (s for body in scopes for s in body):
            for name in _declared(statement):
                declarations[f"{where}:{statement.lineno}:{name}"] = statement.end_lineno - statement.lineno + 1
    return {
        "functions": functions,
        "function_lines": sum(functions.values()),
        "declarations": declarations,
        "declaration_lines": sum(declarations.values()),
        "registry_entries_declaring_reads": _entries(),
    }


def _declared(statement) -> list[str]:
    """The declarations a module's or a class's statement makes: ``reads = ...``, ``unread: ... = ...``, or one of
    the module tuples they are built from."""
    if isinstance(statement, ast.Assign):
        names = [t.id for t in statement.targets if isinstance(t, ast.Name)]
    elif isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name) and statement.value:
        names = [statement.target.id]
    else:
        return []
    return [n for n in names if n in DECLARATIONS or n in DECLARED_TUPLES]


def _entries() -> int:
    """The registry entries with a ``reads`` field (mixers, patterns)."""
    from longseq.model.attention.patterns import PATTERNS
    from longseq.model.mixers import MIXERS

    return sum(hasattr(entry, "reads") for entry in (*MIXERS.values(), *PATTERNS.values()))


def preset_leaves() -> dict[str, int]:
    """The leaves of each LM preset's model config as built (``leaves`` of its dict: the fields of the components it
    chose, a section left unset counted as one)."""
    from longseq.config import get_preset
    from longseq.config.base import leaves
    from longseq.config.files import preset_names

    return {name: len(leaves(get_preset(name).model.to_dict())) for name in preset_names() if name != "finetune"}


def constructors() -> dict:
    """The ``__init__`` of every class under ``longseq/model`` with its number of parameters (after ``self``): the
    widest ones, and ``RelativeMultiHeadAttention``'s."""
    root = Path(longseq.__file__).parent
    widths = {}
    for path in sorted((root / "model").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ClassDef):
                continue
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                    a = item.args
                    n = len(a.posonlyargs) + len(a.args) - 1 + len(a.kwonlyargs) + bool(a.vararg) + bool(a.kwarg)
                    widths[f"{path.relative_to(root.parent)}:{node.name}"] = n
    ranked = sorted(widths.items(), key=lambda kv: -kv[1])
    attention = [n for name, n in widths.items() if name.endswith(":RelativeMultiHeadAttention")]
    return {"widest": dict(ranked[:5]), "relative_attention": attention[0] if attention else None}


def trips(out_dir: str = "/tmp/longseq-config-trips") -> dict:
    """Calls between ``longseq/model/registry.py`` and the ``longseq/config`` package (either way) from
    ``api.train`` until the language model is built (the first return of a model class's ``__init__`` called from
    the trainer's build), in a new run of a tiny default model: each is one trip of the run config between the
    registry and the config."""
    import shutil
    import sys

    import numpy as np

    from longseq.api import train
    from longseq.config import RunConfig, get_preset
    from longseq.data import CharTokenizer, Corpus

    shutil.rmtree(out_dir, ignore_errors=True)
    text = "".join(np.random.default_rng(0).choice(list("abcdefgh \n"), size=4000))
    tok = CharTokenizer.build(text)
    ids = tok.encode(text)
    corpus = Corpus(ids[:3000], ids[3000:3500], ids[3500:], tok, "generated")
    preset = get_preset("tiny-shakespeare")
    run = RunConfig(preset.model, preset.data, preset.train.replace(max_steps=1))

    def where(frame) -> str:
        path = frame.f_code.co_filename.replace("\\", "/")
        if path.endswith("longseq/model/registry.py"):
            return "registry"
        return "config" if "/longseq/config/" in path else "other"

    counted, done = [], []

    class Built(Exception):
        pass

    def profile(frame, event, arg):
        if event == "call" and frame.f_back is not None:
            here, caller = where(frame), where(frame.f_back)
            if {here, caller} == {"registry", "config"}:
                counted.append(f"{frame.f_back.f_code.co_name} -> {frame.f_code.co_name}")
        if event == "return" and frame.f_code.co_name == "build_model" and where(frame) == "registry":
            done.append(True)
            raise Built

    sys.setprofile(profile)
    try:
        train(run, out_dir, corpus=corpus, progress=False)
    except Built:
        pass
    finally:
        sys.setprofile(None)
        shutil.rmtree(out_dir, ignore_errors=True)
    return {"trips": len(counted), "calls": counted, "built": bool(done)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = {
        "config_classes": config_classes(),
        "set_leaves": set_leaves(),
        "preset_leaves": preset_leaves(),
        "machinery": machinery(),
        "constructors": constructors(),
        "trips": trips(),
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    for name, counts in result["config_classes"].items():
        print(f"{name:24} {counts['fields']:3} fields {counts['leaves']:3} leaves")
    print("--set leaves: " + ", ".join(f"{k} {v}" for k, v in result["set_leaves"].items()))
    m = result["machinery"]
    for name, n in m["functions"].items():
        print(f"{n:4}  {name}")
    print(f"machinery functions: {m['function_lines']} lines")
    for name, n in m["declarations"].items():
        print(f"{n:4}  {name}")
    print(
        f"declarations: {len(m['declarations'])}, {m['declaration_lines']} lines; registry entries declaring reads: "
        f"{m['registry_entries_declaring_reads']}"
    )
    print("model leaves by preset: " + ", ".join(f"{k} {v}" for k, v in result["preset_leaves"].items()))
    c = result["constructors"]
    print("widest constructors in model/: " + ", ".join(f"{k} {v}" for k, v in c["widest"].items()))
    print(f"RelativeMultiHeadAttention.__init__: {c['relative_attention']} parameters")
    t = result["trips"]
    print(f"registry <-> config trips from api.train to the built model: {t['trips']} ({'; '.join(t['calls'])})")


if __name__ == "__main__":
    main()
