"""The base of every config: strict JSON round trips, nested sections, and ``key=value`` overrides.

A config is a dataclass that mixes in :class:`JsonConfig` and validates itself in ``__post_init__``.  A field
whose type is another such dataclass is a section (``ModelConfig.memory``); it is written as a nested JSON
object.  Unknown keys are an error that names the close matches.

Overrides address a field by its path (``model.memory.mem_len``) or by any dotted tail of it that names one
field only (``memory.mem_len``, ``mem_len``).

A config may be one of several, chosen by a field (:class:`Variants`: the task's options, tagged by ``name``): a key
the chosen one has no field for is unknown, and the error names the variants that have it.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import functools
import inspect
import json
import math
import textwrap
import types
import typing
from typing import Any, ClassVar


class ConfigError(ValueError):
    """A configuration value, key or preset is invalid."""


def check(condition: bool, message: str) -> None:
    """Raise :class:`ConfigError` with ``message`` unless ``condition`` holds."""
    if not condition:
        raise ConfigError(message)


def leaves(data: dict, sep: str = ".", prefix: str = "", keep: tuple[str, ...] = ()) -> dict:
    """A nested dict flattened to ``{"a.b": value}`` (``sep`` joins the keys); the dicts under a key in ``keep``
    stay values."""
    out = {}
    for key, value in data.items():
        if isinstance(value, dict) and key not in keep:
            out.update(leaves(value, sep, f"{prefix}{key}{sep}", keep))
        else:
            out[f"{prefix}{key}"] = value
    return out


def check_finite(config) -> None:
    """Every float field of a config dataclass is a finite number (a NaN learning rate, an infinite init_std)."""
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{type(config).__name__}.{f.name} must be a finite number, got {value}")


def check_choice(owner: str, value: str, choices: tuple[str, ...]) -> None:
    """``value`` must be one of ``choices``; the error names the close matches."""
    if value in choices:
        return
    close = difflib.get_close_matches(str(value), choices, n=2)
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    raise ConfigError(f"{owner}: unknown value {value!r}{hint}; choose one of {', '.join(choices)}")


def field_docs(cls: type) -> dict[str, str]:
    """Each field's docstring (the string literal after its declaration, as Sphinx reads it), from ``cls`` and the
    classes it derives from, one line each; empty where the source is not at hand."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError, SyntaxError):
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for statement, following in zip(body, body[1:]):
            if (
                isinstance(statement, ast.AnnAssign)
                and isinstance(statement.target, ast.Name)
                and isinstance(following, ast.Expr)
                and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)
            ):
                docs[statement.target.id] = " ".join(following.value.value.split())
    return docs


def is_section(annotation: Any) -> bool:
    return isinstance(annotation, type) and dataclasses.is_dataclass(annotation) and issubclass(annotation, JsonConfig)


def field_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


CONFIG_CLASSES: list[type] = []  # every config dataclass, to say where a misplaced key belongs


def config_classes() -> list[type]:
    """The config dataclasses (a mixin such as :class:`Variants` registers too, and is left out)."""
    return [c for c in CONFIG_CLASSES if dataclasses.is_dataclass(c)]


class JsonConfig:
    """Mixin: strict ``from_dict`` (nested sections included) and plain ``to_dict``.  Declare configs with
    :func:`config`: their constructor then takes the fields of their sections by name too (``ModelConfig(mem_len=
    64)`` sets ``memory.mem_len``), and an unknown or misplaced key is a :class:`ConfigError` that names where it
    belongs."""

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        CONFIG_CLASSES.append(cls)

    @classmethod
    def from_dict(cls, data: dict[str, Any]):
        if not isinstance(data, dict):
            raise ConfigError(f"{cls.__name__} expects a JSON object, got {type(data).__name__}")
        data = nest_flat_keys(cls, data)
        types_ = field_types(cls)
        names = [f.name for f in dataclasses.fields(cls)]
        check_known_keys(cls, data)
        values = {name: coerce_value(name, data[name], types_[name]) for name in names if name in data}
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def replace(self, **changes):
        """A validated copy with ``changes`` (field names of this config or of its sections, or sections as dicts)."""
        return type(self).from_dict(merge(self.to_dict(), nest_flat_keys(type(self), changes)))

    @classmethod
    def unknown_keys(cls, unknown: list[str], values: dict[str, Any]) -> str:
        """The error for the keys of ``values`` that ``cls`` has no field for: each with where it belongs or the close
        matches."""
        names = [f.name for f in dataclasses.fields(cls)]
        return f"unknown {cls.__name__} key(s): {'; '.join(_placed(cls, key, names) for key in unknown)}"


class Variants(JsonConfig):
    """The base of configs of which a run holds one, chosen by a field (``TAG``): a tagged union.  The base is a
    :func:`config` dataclass with the tag as its one field and ``VARIANTS`` (each tag's class); each variant
    subclasses it.  ``Base(tag=..., ...)`` and ``Base.from_dict`` build the variant the tag names, and ``replace`` of
    the tag moves to another; the base's leaves are every variant's, so a key of any resolves.  A key the chosen
    variant has no field for is an unknown key, and the error names the variants that have it (:meth:`elsewhere`).
    A union is a section of a run (``RunConfig.task``), not of another config: :func:`nest_flat_keys` and
    :func:`get_annotation` read a section's own fields."""

    TAG: ClassVar[str] = "name"
    VARIANTS: ClassVar[dict[str, type]]  # set on the base

    def __new__(cls, *args, **values):
        if is_union(cls):
            cls = cls.variant(values.get(cls.TAG, cls.default_tag()))
        return super().__new__(cls)

    def __post_init__(self) -> None:
        tag = getattr(self, self.TAG)
        check(
            self.union().VARIANTS.get(tag) is type(self),
            f"{type(self).__name__} is not the config of {self.TAG}={tag!r}",
        )

    @classmethod
    def union(cls) -> type:
        return next(c for c in cls.__mro__ if is_union(c))

    @classmethod
    def default_tag(cls) -> str:
        return cls.__dataclass_fields__[cls.TAG].default

    @classmethod
    def variant(cls, tag: str) -> type:
        """The class of tag ``tag``; an unknown one is an error with the close matches."""
        variants = cls.union().VARIANTS
        check_choice(cls.union().__name__ + "." + cls.TAG, tag, tuple(variants))
        return variants[tag]

    @classmethod
    def from_dict(cls, data: dict[str, Any]):
        if not isinstance(data, dict):
            raise ConfigError(f"{cls.__name__} expects a JSON object, got {type(data).__name__}")
        return JsonConfig.from_dict.__func__(cls.variant(data.get(cls.TAG, cls.default_tag())), data)

    @classmethod
    def unknown_keys(cls, unknown: list[str], values: dict[str, Any]) -> str:
        tag = values.get(cls.TAG, cls.default_tag())
        owned = [key for key in unknown if cls.owners(key)]
        said = [cls.elsewhere(key, cls.owners(key), tag) for key in owned]
        rest = [key for key in unknown if key not in owned]
        return "; ".join(said + ([JsonConfig.unknown_keys.__func__(cls, rest, values)] if rest else []))

    @classmethod
    def owners(cls, key: str) -> list[str]:
        """The tags whose config has a field ``key``."""
        return [tag for tag, v in cls.union().VARIANTS.items() if key in {f.name for f in dataclasses.fields(v)}]

    @classmethod
    def elsewhere(cls, key: str, owners: list[str], tag: str) -> str:
        """The error for ``key``, a field of the variants ``owners``, set for ``tag``'s (a union words its own)."""
        return f"{key!r} is a key of {cls.TAG}={', '.join(owners)}, not of {cls.TAG}={tag}"

    @classmethod
    def refuse_elsewhere(cls, section: str, key: str, tag: str) -> None:
        """Raise :meth:`elsewhere`'s error when ``key`` (a ``--set`` key) names another variant's field."""
        try:
            path = resolve_key(key, [f"{section}.{p}" for p in leaf_paths(cls.union())])
        except ConfigError:
            return
        field = path.split(".")[1]
        if tag not in cls.owners(field):  # (a key of the chosen variant fails for another reason: ambiguous)
            raise ConfigError(cls.elsewhere(field, cls.owners(field), tag))


def is_union(cls: type) -> bool:
    """Whether ``cls`` is the base of a tagged union (:class:`Variants`), not one of its variants."""
    return isinstance(cls, type) and issubclass(cls, Variants) and "VARIANTS" in cls.__dict__


def config(cls: type) -> type:
    """``@dataclass`` for a :class:`JsonConfig`, whose constructor also takes its sections' fields by name and
    refuses an unknown key with a :class:`ConfigError` naming where it belongs (the generated one raises a bare
    ``TypeError``)."""
    cls = dataclasses.dataclass(cls)
    generated = cls.__init__

    @functools.wraps(generated)
    def __init__(self, *args, **values) -> None:
        values = nest_flat_keys(cls, values)
        check_known_keys(cls, values)
        sections = _sections(cls)
        for name, value in values.items():
            if name in sections and isinstance(value, dict):
                values[name] = sections[name].from_dict(value)
        generated(self, *args, **values)

    cls.__init__ = __init__
    return cls


def _sections(cls: type) -> dict[str, type]:
    names = {f.name for f in dataclasses.fields(cls)}
    return {name: t for name, t in field_types(cls).items() if name in names and is_section(t)}


def nest_flat_keys(cls: type, values: dict[str, Any]) -> dict[str, Any]:
    """``values`` with every key that names a field of one of ``cls``'s sections moved into that section (a dict
    or a config laid under it): ``{"mem_len": 64}`` -> ``{"memory": {"mem_len": 64}}`` for a ModelConfig."""
    sections = _sections(cls)
    if not sections:
        return dict(values)
    owner = {f.name: name for name, section in sections.items() for f in dataclasses.fields(section)}
    own = {f.name for f in dataclasses.fields(cls)}
    out, moved = {}, {}
    for key, value in values.items():
        if key not in own and key in owner:
            moved.setdefault(owner[key], {})[key] = value
        else:
            out[key] = value
    for name, flat in moved.items():
        given = out.get(name, {})
        given = given.to_dict() if isinstance(given, JsonConfig) else dict(given)
        out[name] = {**given, **flat}
    return out


def check_known_keys(cls: type, values: dict[str, Any]) -> None:
    """Every key of ``values`` must be a field of ``cls`` (its sections' fields nested already): the error names
    each unknown key, where it belongs when it is another config's key, or the close matches."""
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(values) - set(names))
    if unknown:
        raise ConfigError(cls.unknown_keys(unknown, values))


def _placed(cls: type, key: str, names: list[str]) -> str:
    """``'key'`` with where it belongs (a key of another config: ``ModelConfig.pattern.window``) or the close
    matches among ``cls``'s keys, its sections' included (``memory.mem_len`` for ``mem_lne``)."""
    nested = {t for c in config_classes() for t in _sections(c).values()}  # configs that are sections of another
    homes = sorted(
        {
            f"{other.__name__}.{path}"
            for other in config_classes()
            if other not in nested and other is not cls and not is_union(other)
            for path in leaf_paths(other)
            if path.split(".")[-1] == key
        }
    )
    if homes:
        return f"{key!r} (it is a key of {', '.join(homes)})"
    paths = {path.split(".")[-1]: path for path in leaf_paths(cls)} | {name: name for name in names}
    close = [paths[k] for k in difflib.get_close_matches(key, list(paths), n=3)]
    return f"{key!r}" + (f" (did you mean {', '.join(close)}?)" if close else "")


def leaf_paths(cls: type, prefix: str = "") -> list[str]:
    """Every field of ``cls`` that is not a section, as a dotted path ("memory.mem_len"); a union's are every
    variant's."""
    if is_union(cls):
        return list(dict.fromkeys(p for v in cls.VARIANTS.values() for p in leaf_paths(v, prefix)))
    paths = []
    for name, annotation in field_types(cls).items():
        if name not in {f.name for f in dataclasses.fields(cls)}:
            continue
        if is_section(annotation):
            paths += leaf_paths(annotation, f"{prefix}{name}.")
        else:
            paths.append(f"{prefix}{name}")
    return paths


def coerce_value(key: str, value: Any, annotation: Any) -> Any:
    """Convert ``value`` (a JSON value or a command-line string) to ``annotation`` or raise :class:`ConfigError`."""
    if is_section(annotation):
        return value if isinstance(value, annotation) else annotation.from_dict(value)
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
            if type(None) in args:
                return None
        inner = [a for a in args if a is not type(None)]
        return coerce_value(key, value, inner[0])
    if origin is list:
        return [coerce_value(key, v, args[0]) for v in _as_list(key, value)]
    if annotation is dict or origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected an object, got {value!r}")
        return dict(value)
    coerce = _SCALARS.get(annotation)
    if coerce is None:
        raise ConfigError(f"{key}: unsupported field type {annotation}")
    return coerce(key, value)


def _as_list(key: str, value: Any) -> list:
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            try:
                value = json.loads(text)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{key}: cannot parse {value!r} as a list: {exc}") from None
        else:
            value = [v for v in text.split(",") if v.strip()]
    if not isinstance(value, (list, tuple)):
        raise ConfigError(f"{key}: expected a list, got {value!r}")
    return list(value)


def _to_bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "1", "yes", "on"):
        return True
    if isinstance(value, str) and value.lower() in ("false", "0", "no", "off"):
        return False
    raise ConfigError(f"{key}: expected true or false, got {value!r}")


def _to_int(key: str, value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.replace("_", ""))
        except ValueError:
            pass
    raise ConfigError(f"{key}: expected an integer, got {value!r}")


def _to_float(key: str, value: Any) -> float:
    number = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            pass
    if number is None:
        raise ConfigError(f"{key}: expected a number, got {value!r}")
    if not math.isfinite(number):  # lr=inf trains three NaN steps and stops; no setting means infinity or NaN
        raise ConfigError(f"{key}: expected a finite number, got {value!r}")
    return number


def _to_str(key: str, value: Any) -> str:
    if isinstance(value, str):
        return value
    raise ConfigError(f"{key}: expected a string, got {value!r}")


_SCALARS = {bool: _to_bool, int: _to_int, float: _to_float, str: _to_str}


def resolve_key(key: str, paths: list[str]) -> str:
    """The one path that ``key`` names: the path itself or a dotted tail of it; else a path that ``key`` names with
    the sections between its first part and a tail left out (``train.lr`` -> ``train.optim.lr``: the flat name
    under its config, as the constructors take it).  An error lists the candidates."""
    matches = [p for p in paths if p == key or p.endswith("." + key)]
    if not matches and "." in key:
        head, rest = key.split(".", 1)
        matches = [p for p in paths if p.startswith(head + ".") and p.endswith("." + rest)]
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise ConfigError(f"key {key!r} is ambiguous: use one of {', '.join(matches)}")
    tails = {t for p in paths for t in _tails(p)}
    close = difflib.get_close_matches(key, sorted(tails), n=4, cutoff=0.6)
    sections = sorted({p.split(".")[0] for p in paths})
    hint = f"; did you mean {', '.join(close)}?" if close else f"; sections: {', '.join(sections)}"
    raise ConfigError(f"unknown config key {key!r}{hint}")


def resolve_section_key(sections: dict[str, JsonConfig], key: str, paths: list[str]) -> str:
    """:func:`resolve_key` over the ``paths`` of ``sections``; a key that names a field of another variant of a
    section that is one of several (:class:`Variants`: ``pooling`` for a span task) is an error naming them."""
    try:
        return resolve_key(key, paths)
    except ConfigError:
        for name, cfg in sections.items():
            if isinstance(cfg, Variants):
                cfg.refuse_elsewhere(name, key, getattr(cfg, cfg.TAG))
        raise


def _tails(path: str) -> list[str]:
    parts = path.split(".")
    return [".".join(parts[i:]) for i in range(len(parts))]


def set_path(data: dict, path: str, value: Any) -> None:
    """Set ``path`` ("memory.mem_len") in a nested dict."""
    *outer, last = path.split(".")
    for part in outer:
        data = data.setdefault(part, {})
    data[last] = value


def get_annotation(cls: type, path: str) -> Any:
    head, _, rest = path.partition(".")
    annotation = field_types(cls)[head]
    return get_annotation(annotation, rest) if rest else annotation


def apply_overrides(sections: dict[str, JsonConfig], overrides: list[str]) -> dict[str, JsonConfig]:
    """Apply ``key=value`` strings to named config sections and return new, validated configs.

    A key is a field's path below the section names (``model.memory.mem_len``) or any dotted tail of that
    path naming one field only (``mem_len``).  An unknown key is an error that lists the close matches.
    """
    items = []
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like key=value")
        key, raw = item.split("=", 1)
        items.append((key.strip(), raw))
    return apply_values(sections, items)


def apply_values(sections: dict[str, JsonConfig], items: list[tuple[str, Any]]) -> dict[str, JsonConfig]:
    """:func:`apply_overrides` for ``(key, value)`` pairs: values are strings or already typed (a config file's)."""
    paths = [f"{name}.{p}" for name, cfg in sections.items() for p in leaf_paths(type(cfg))]
    changes: dict[str, dict] = {name: {} for name in sections}
    for key, raw in items:
        path = resolve_section_key(sections, key, paths)
        section, rest = path.split(".", 1)
        value = coerce_value(key, raw, get_annotation(type(sections[section]), rest))
        set_path(changes[section], rest, value)
    return {name: type(cfg).from_dict(merge(cfg.to_dict(), changes[name])) for name, cfg in sections.items()}


def merge(base: dict, changes: dict) -> dict:
    """``base`` with ``changes`` laid over it, nested dicts merged key by key."""
    out = dict(base)
    for key, value in changes.items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out
