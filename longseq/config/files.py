"""Run configurations as files: TOML or JSON with the sections ``model``, ``data`` and ``train``.

A file takes the keys of ``--set``, each in its section, as a dotted tail (``mem_len``) or a full path
(``memory.mem_len``, or the nested table ``[model.memory]``)::

    preset = "enwik8-base"   # optional: start from this preset; else from the configs' defaults
    [model]
    n_layer = 4
    mem_len = 128
    [data]
    tokenizer = "bpe"
    vocab_size = 4096
    [train]
    max_steps = 2000

An unknown key is an error naming the file and the close matches; a key given twice is an error.
:func:`write_run_config` writes every field, in nested tables, so that :func:`load_run_config` of the file gives
the same :class:`~longseq.config.run.RunConfig`.  TOML has no null: an unset optional field (``d_embed``,
``tie_projs``, ``path``, whose default is unset) is left out, and reads back unset.  The presets are such files,
shipped in ``longseq/config/presets/``.

TOML is read by the standard library's ``tomllib`` (``tomli`` before Python 3.11).  It has no writer, so
:func:`dumps_toml` writes the one shape a config has (tables of scalars and lists); tests read all it writes back
through ``tomllib``.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import re
import sys
from importlib import resources
from typing import Any

from longseq.config.base import ConfigError, apply_values, leaf_paths, leaves, resolve_section_key
from longseq.config.model import ModelConfig
from longseq.config.run import DataConfig, RunConfig, TaskConfig, TrainConfig
from longseq.config.stored import stored_run
from longseq.config.task import RECALL_TASKS

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

SECTIONS = ("model", "data", "train")
FINETUNE_DEFAULTS = "finetune"  # presets/finetune.toml: fine-tuning's defaults, not a preset of longseq train
TOP_LEVEL = ("preset", *SECTIONS, "task")  # [task]: a recall task's (a run.toml of `train --task` runs again)


def preset_names() -> list[str]:
    """The shipped presets of ``longseq train``, by file name (fine-tuning's defaults are not one)."""
    folder = resources.files("longseq.config") / "presets"
    names = (p.name[: -len(".toml")] for p in folder.iterdir() if p.name.endswith(".toml"))
    return sorted(name for name in names if name != FINETUNE_DEFAULTS)


def finetune_defaults() -> RunConfig:
    """Fine-tuning's defaults (``presets/finetune.toml``) over the configs' defaults: the data and train sections a
    new fine-tuning run starts from (:func:`longseq.train.finetune.finetune_run`; its model is the checkpoint's)."""
    return load_run_config(str(resources.files("longseq.config") / "presets" / f"{FINETUNE_DEFAULTS}.toml"))


def preset_path(name: str) -> str:
    """The file of preset ``name``, or an error with the close matches."""
    names = preset_names()
    if name not in names:
        close = difflib.get_close_matches(name, names, n=3, cutoff=0.4)
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise ConfigError(f"unknown preset {name!r}{hint}; available: {', '.join(names)}")
    return str(resources.files("longseq.config") / "presets" / f"{name}.toml")


def default_run() -> RunConfig:
    return RunConfig(model=ModelConfig(), data=DataConfig(), train=TrainConfig())


def read_config_file(path: str) -> dict[str, Any]:
    """The contents of a ``.toml`` or ``.json`` config file; a syntax error names the file and the place."""
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in (".toml", ".json"):
        raise ConfigError(f"config file {path} must end in .toml or .json")
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f) if suffix == ".toml" else json.load(f)
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    except (tomllib.TOMLDecodeError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {path} is not valid {suffix[1:].upper()}: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a table (a JSON object), got {type(data).__name__}")
    return data


def load_run_config(path: str, base: RunConfig | None = None, _seen: tuple[str, ...] = ()) -> RunConfig:
    """The run config of the file at ``path``, laid over the preset it names, else over ``base``, else over the
    configs' defaults."""
    data = read_config_file(path)
    unknown = sorted(set(data) - set(TOP_LEVEL))
    if unknown:
        hints = [f"{k!r}" + _did_you_mean(k, TOP_LEVEL) for k in unknown]
        raise ConfigError(f"{path}: unknown top-level key(s) {', '.join(hints)}; a config has {', '.join(TOP_LEVEL)}")
    if "preset" in data:
        name = data["preset"]
        if not isinstance(name, str):
            raise ConfigError(f"{path}: preset must be a preset's name, got {name!r}")
        if base is not None:
            raise ConfigError(f"{path} names the preset {name!r} and another base (--preset) was given: keep one")
        if name in _seen:
            raise ConfigError(f"{path}: presets name each other in a loop: {' -> '.join([*_seen, name])}")
        base = load_run_config(preset_path(name), _seen=(*_seen, name))
    task = data.get("task")
    if task is not None and not (isinstance(task, dict) and task.get("name") in RECALL_TASKS):
        name = task.get("name") if isinstance(task, dict) else task
        raise ConfigError(
            f"{path}: [task] name={name!r} is not a recall task ({', '.join(RECALL_TASKS)}), the only [task] a "
            "training config holds; a fine-tuning config is read by longseq finetune --config"
        )
    return apply_sections(base or default_run(), data, path)


def apply_sections(base: RunConfig, data: dict[str, Any], source: str) -> RunConfig:
    """``base`` with the ``model``, ``data`` and ``train`` tables of ``data`` (read from ``source``) laid over it,
    and its ``task`` table, when it has one.  Tables as an earlier version wrote them (a run.toml read again by
    ``train --config``) run as they ran: :func:`~longseq.config.stored.stored_run`."""
    data = stored_run(data)
    sections = base.sections()
    if isinstance(data.get("task"), dict):
        if "task" not in sections:  # the table chooses the task's options class (and holds what it needs: train)
            try:
                sections["task"] = TaskConfig.from_dict(data["task"])
            except ConfigError as exc:
                raise ConfigError(f"{source}: [task] {exc}") from None
    for name in (*SECTIONS, "task") if "task" in data else SECTIONS:
        table = data.get(name, {})
        if not isinstance(table, dict):
            raise ConfigError(f"{source}: [{name}] must be a table, got {table!r}")
        paths = [f"{name}.{p}" for p in leaf_paths(type(sections[name]))]
        resolved: dict[str, str] = {}
        items = []
        for key, value in leaves(table, keep=("sha256",)).items():
            try:
                path = resolve_section_key({name: sections[name]}, key, paths)
            except ConfigError as exc:
                raise ConfigError(f"{source}: [{name}] {exc}") from None
            if path in resolved:
                raise ConfigError(f"{source}: [{name}] sets {path} twice (as {resolved[path]} and {key})")
            resolved[path] = key
            items.append((path, value))
        try:
            sections[name] = apply_values({name: sections[name]}, items)[name]
        except ConfigError as exc:
            raise ConfigError(f"{source}: {exc}") from None
    return RunConfig(**sections)


def _did_you_mean(key: str, choices) -> str:
    close = difflib.get_close_matches(key, list(choices), n=2)
    return f" (did you mean {', '.join(close)}?)" if close else ""


def write_run_config(run: RunConfig, path: str) -> None:
    """Write ``run`` to ``path`` (``.toml`` or ``.json``) atomically: a temporary file, fsynced, renamed."""
    suffix = os.path.splitext(path)[1].lower()
    if suffix == ".toml":
        again = RERUN_LM if run.task is None or run.task.name in RECALL_TASKS else RERUN_TASK
        text = dumps_toml(run.to_dict(), header=f"{RUN_HEADER}\n{again}")
    elif suffix == ".json":
        text = json.dumps(run.to_dict(), indent=2, sort_keys=True) + "\n"
    else:
        raise ConfigError(f"config file {path} must end in .toml or .json")
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


RUN_HEADER = "The resolved configuration of a longseq run."  # the first line of every run.toml longseq writes
RERUN_LM = "`longseq train --config THIS_FILE --out NEW_DIR` runs it again."
RERUN_TASK = "A record of a fine-tuning run: `longseq finetune --resume --out RUN_DIR` continues it."


def dumps_toml(data: dict[str, Any], header: str = "") -> str:
    """TOML for nested tables of strings, numbers, booleans and lists of them; ``None`` values are left out."""
    lines = [f"# {line}".rstrip() for line in header.splitlines()]
    _write_table(lines, [], data)
    return "\n".join(lines).strip("\n") + "\n"


def _write_table(lines: list[str], path: list[str], table: dict[str, Any]) -> None:
    scalars = {k: v for k, v in table.items() if not isinstance(v, dict) and v is not None}
    tables = {k: v for k, v in table.items() if isinstance(v, dict)}
    if path and (scalars or not tables):  # a table of tables only is made by its sub-tables' headers
        lines += ["", f"[{'.'.join(_toml_key(p) for p in path)}]"]
    lines += [f"{_toml_key(k)} = {_toml_value(v, k)}" for k, v in scalars.items()]
    for key, value in tables.items():
        _write_table(lines, [*path, key], value)


def _toml_key(key: str) -> str:
    if not isinstance(key, str):
        raise ConfigError(f"TOML keys are strings, got {key!r}")
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else _toml_string(key)


_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def _toml_string(text: str) -> str:
    out = []
    for ch in text:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04X}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _toml_value(value: Any, key: str) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return ("inf" if value > 0 else "-inf") if math.isinf(value) else repr(value)
    if isinstance(value, str):
        return _toml_string(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v, key) for v in value) + "]"
    raise ConfigError(f"{key}: TOML cannot hold {value!r} ({type(value).__name__})")
