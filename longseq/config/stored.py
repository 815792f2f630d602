"""Stored formats: what longseq wrote before, read as today's.  The one module that knows an old name, an old layout
or an old default; nothing else does (the model's modules know today's names only).

Checkpoints carry a format number (``config.json``'s ``"format"``), and each older format maps to one function
that rewrites what it stored (the run config, the weights and the training state's tensors) into the next format's
terms: :data:`UPGRADES`, applied in turn up to :data:`FORMAT`.  Run files (a run.toml, a study's stored result) and
the transformers export's ``config.json`` carry no number: they are read by the keys they hold
(:func:`stored_run`, :func:`stored_model`), with the same rules.  Weight names are renamed by one table,
:data:`RENAMES`, which the transformers integration also reads (as its ``key_mapping``, :func:`has_old_names`).

The formats:

* **v1** (before the memory and the model config were redesigned, 2026-12-01): the model config flat (every field of
  its sections at the top of ``"model"``, which the model config still reads); two weights under other names (the
  compressors and the memory tokens, :data:`V1_RENAMES`); a training state's memory tensors named ``mems.i`` and
  ``state.i.j``; and, as in v2, a fine-tuned run's task options in a dict, ``{"name": ..., "options": {...}}``.
* **v2** differs from v3 in that last way only.  A classifier that recorded no ``pooling`` was trained with ``last``,
  the default then.
* **v3**, as written until the model config became a tree of components, within which several layouts and defaults
  changed without a new number (each rule below names its date):

  - the backbone was its layer stack (``transformer.layers.0...``, ``transformer.r_w_bias``; before 2026-12-06) and
    the position weights sat on the attention module (``dec_attn.r_net``, ``dec_attn.rel_table``; before
    2026-12-04): :data:`RENAMES`;
  - a stack without attention kept u and v, never read (before 2026-12-07): dropped;
  - ``linear`` and ``performer`` saved without ``mixers.reset_every`` ran unbounded and unrotated, a ``delta`` saved
    without ``mixers.short_conv`` had no short convolution (both before 2026-12-06), a learned-chunk hourglass saved
    without ``hourglass.residual_proj`` added its input itself: those settings are written in, so it runs as it ran;
  - a fine-tuned run stored every task's options in one flat class (d3a9f4a and earlier): read in its task's terms
    (:func:`stored_task`);
  - an hourglass's training state held its phase among its tensors (before ``memory.phase.i``).

The rule for what comes next (docs/ARCHITECTURE.md): a changed default is a new option value or a new name, never a
rule that rewrites old configs; a new layout or name is a new format number and one more function here; a
deprecation names the version that removes it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import fields

from longseq.config.base import ConfigError
from longseq.config.task import TASK_OPTIONS

FORMAT = "longseq-checkpoint-v3"  # what save_checkpoint writes
V1, V2 = "longseq-checkpoint-v1", "longseq-checkpoint-v2"

RENAMES: tuple[tuple[str, str], ...] = (  # (regular expression over a whole weight name, replacement)
    (r"(^|\.)transformer\.(?!word_emb\.|final_norm\.|stack\.)", r"\1transformer.stack."),  # the backbone (2026-12-06)
    (r"\.dec_attn\.r_net\.", ".dec_attn.rel.r_net."),  # positions as modules (2026-12-04)
    (r"\.dec_attn\.rel_table$", ".dec_attn.rel.rel_table"),
)
V1_RENAMES: tuple[tuple[str, str], ...] = (  # format v1's compressors and memory tokens
    (r"(^|\.)transformer\.compressors\.", r"\1transformer.stack.memory.policies.compression.compressors."),
    (r"(^|\.)transformer\.memory_tokens$", r"\1transformer.stack.memory.policies.tokens.initial"),
)
UNREAD_BIASES = r"(^|\.)transformer\.stack\.{inner}r_[wr]_bias$"  # u and v of a stack without attention (2026-12-07)
STORED_MIXERS = {"d_state", "head_dim", "expand", "chunk", "conv_kernel", "state_bptt"}  # every stored section's
FLAT_TASK_DEFAULTS = dict(  # the one flat TaskConfig's defaults (the same from its first version, cc24dc9, to d3a9f4a)
    train="", valid=None, segment_len=0, base=None, head_only=False, group_by_length=False, sha256={}, labels=[],
    pooling="document", lm_weight=0.0, max_answer_len=64, mask_rate=0.15, mask_token=None, mask_id=-1,
    text_column="text", label_column="label", seq_len=256, min_distance=0, max_distance=0, key_len=3, alphabet=16,
    n_pairs=4, n_copy=16, valid_size=256,
)  # fmt: skip


class Stored:
    """What one checkpoint stored, as a format's upgrade reads and rewrites it: the run config (a dict), the weights
    (names -> tensors; None when not read) and the training state's tensors (None when not read)."""

    def __init__(self, run: dict, weights: dict | None = None, training: dict | None = None) -> None:
        self.run, self.weights, self.training = run, weights, training


def _renamed(tensors: dict | None, table: Iterable[tuple[str, str]]) -> dict | None:
    if tensors is None:
        return None
    out = {}
    for name, tensor in tensors.items():
        for pattern, replacement in table:
            name = re.sub(pattern, replacement, name)
        out[name] = tensor
    return out


def _v1_memory_name(old: str) -> str:
    if old.startswith("mems."):
        return "memory.hidden." + old.split(".", 1)[1]
    return "memory." + old.split(".", 1)[1] if old.startswith("state.") else old


def _task_options_as_fields(run: dict) -> dict:
    """A task stored as ``{"name": ..., "options": {...}}`` (formats v1 and v2) as its fields; a classifier without
    ``pooling`` pooled the ``last`` position."""
    task = run.get("task")
    if not isinstance(task, dict) or "options" not in task:
        return run
    options = dict(task["options"])
    if task.get("name") == "classify":
        options.setdefault("pooling", "last")
    return {**run, "task": {"name": task["name"], **options}}


def from_v1(stored: Stored) -> Stored:
    training = None if stored.training is None else {_v1_memory_name(k): v for k, v in stored.training.items()}
    return Stored(_task_options_as_fields(stored.run), _renamed(stored.weights, V1_RENAMES), training)


def from_v2(stored: Stored) -> Stored:
    return Stored(_task_options_as_fields(stored.run), stored.weights, stored.training)


UPGRADES: dict[str, Callable[[Stored], Stored]] = {V1: from_v1, V2: from_v2}  # a format -> the next format's terms
NEXT = {V1: V2, V2: FORMAT}


def needs_upgrade(format: str | None) -> bool:
    """Whether a checkpoint of ``format`` is read through :func:`upgrade` (v3 itself: its layouts changed within the
    number)."""
    return True


def upgrade(stored: Stored, format: str) -> Stored:
    """``stored`` (of checkpoint format ``format``) in today's terms; an unknown format is a :class:`ConfigError`
    naming it."""
    if format != FORMAT and format not in UPGRADES:
        raise ConfigError(f"checkpoint format {format!r} is not one longseq reads (today's: {FORMAT!r})")
    while format != FORMAT:
        stored, format = UPGRADES[format](stored), NEXT[format]
    return settle_v3(stored)


def settle_v3(stored: Stored) -> Stored:
    """A v3 checkpoint of any date in today's layout: :data:`RENAMES`, the unread u and v dropped, the model's and
    the task's stored defaults (:func:`stored_run`), an hourglass's phase moved out of its tensors."""
    run = stored_run(stored.run)
    weights = None if stored.weights is None else stored_weights(run.get("model", {}), stored.weights)
    return Stored(run, weights, None if stored.training is None else _hourglass_phase(stored.training))


def stored_weights(model: dict, tensors: dict) -> dict:
    """Weights stored with the model config ``model`` (a dict as stored), under today's names (:data:`RENAMES`),
    without the u and v of a stack that holds no attention layer."""
    unread = [UNREAD_BIASES.format(inner=inner) for inner in _stacks_without_attention(model)]
    renamed = _renamed(tensors, RENAMES)
    return {k: v for k, v in renamed.items() if not any(re.search(p, k) for p in unread)}


def _layer_kinds(model: dict) -> tuple[list[str], list[int]]:
    """A stored (sectioned, v3) model dict's mixer per layer and its hourglass's [first, end] (empty: none)."""
    n_layer = int(model.get("n_layer", 4))
    mixer = model.get("mixer", ["attention"])
    names = [n.strip() for n in (mixer.split(",") if isinstance(mixer, str) else mixer) if str(n).strip()]
    names = names * n_layer if len(names) == 1 else names
    hourglass = model.get("hourglass") if isinstance(model.get("hourglass"), dict) else model
    return names, list(hourglass.get("shorten_layers") or [])


def _stacks_without_attention(model: dict) -> list[str]:
    """The stacks of a stored model that hold no attention layer (the outer one and an hourglass's inner one), as
    the part of their weights' names after ``transformer.stack.``."""
    if not isinstance(model, dict) or model.get("arch", "transformer") != "transformer":
        return []
    names, shortened = _layer_kinds(model)
    first, end = shortened or (len(names), len(names))
    out = [] if "attention" in names[:first] + names[end:] else [""]
    if shortened and "attention" not in names[first:end]:
        out.append(rf"layers\.{first}\.inner\.")
    return out


def _hourglass_phase(tensors: dict) -> dict:
    """An hourglass state saved with its phase among its tensors (tail, up, phase, doc) and no ``memory.phase.i``:
    the phase written out, as today's state has it."""
    out = dict(tensors)
    for key in [k for k in tensors if re.fullmatch(r"memory\.state\.\d+\.2", k)]:
        i = key.split(".")[2]
        held = [k for k in tensors if k.startswith(f"memory.state.{i}.")]
        if len(held) == 4 and not tensors[key].is_floating_point() and f"memory.phase.{i}" not in out:
            out[f"memory.phase.{i}"] = tensors[key][0]
    return out


def stored_run(run: dict) -> dict:
    """A stored run (a checkpoint's, a run file's tables, a study's result) with its model's and its task's stored
    defaults in today's terms (:func:`stored_model`, :func:`stored_task`)."""
    if not isinstance(run, dict):
        return run
    run = _task_options_as_fields(run)
    if isinstance(run.get("model"), dict):
        run = {**run, "model": stored_model(run["model"])}
    if isinstance(run.get("task"), dict):
        run = {**run, "task": stored_task(run["task"])}
    return run


def stored_model(model: dict) -> dict:
    """A model config as stored before a field that changes behaviour existed, in today's terms: ``linear`` and
    ``performer`` saved without ``mixers.reset_every`` (before 2026-12-06) ran unbounded and unrotated, and still
    do; a model with ``delta`` saved without ``mixers.short_conv`` had none, and still has none; a learned-chunk
    hourglass saved without ``hourglass.residual_proj`` added its input itself, and still does.  A mixers section
    is taken as stored when it holds every field the section was born with; a partial one, written by hand
    (``LongseqConfig(longseq={...})``), gets today's defaults."""
    if not isinstance(model, dict):
        return model
    hourglass = model.get("hourglass")
    if isinstance(hourglass, dict) and hourglass.get("boundaries") == "learned" and "residual_proj" not in hourglass:
        model = {**model, "hourglass": {**hourglass, "residual_proj": False}}
    stored = model.get("mixers")
    if not isinstance(stored, dict) or not STORED_MIXERS <= set(stored):  # written by hand: today's defaults
        return model
    names = set(_layer_kinds(model)[0])
    mixers = stored if "short_conv" in stored or "delta" not in names else {**stored, "short_conv": []}
    if "reset_every" not in stored and {"linear", "performer"} & names:
        mixers = {**mixers, "reset_every": 0, "rotary": False}
    return {**model, "mixers": mixers}


def stored_task(task: dict) -> dict:
    """A task table the one flat ``TaskConfig`` stored (every task's options; a checkpoint's ``config.json`` or a
    ``run.toml``, which leaves out the fields that are None) in its task's terms: a field its task has none of is
    dropped where it holds the flat default.  The flat class refused any other value for an option its task did not
    read, so nothing a run read is lost; another value stays, and the task's options refuse it by name.  Any other
    table (today's, or one a person wrote) passes unchanged."""
    stored = {k for k, v in FLAT_TASK_DEFAULTS.items() if v is not None}  # what every table the flat class wrote holds
    if not isinstance(task, dict) or not stored <= set(task) or task.get("name", "lm") not in TASK_OPTIONS:
        return task
    own = {f.name for f in fields(TASK_OPTIONS[task.get("name", "lm")])}
    return {k: v for k, v in task.items() if k in own or k not in FLAT_TASK_DEFAULTS or v != FLAT_TASK_DEFAULTS[k]}


def has_old_names(names: Iterable[str]) -> bool:
    """Whether weights named ``names`` (an export's, say) use a name :data:`RENAMES` renames."""
    return any(re.search(pattern, name) for pattern, _ in RENAMES for name in names)
