"""Checkpoints of earlier formats, read as today's (format v3): the one place that knows them.

Format v1 (written before the memory and the model config were redesigned, 2026-12-01) differs in four ways:

* the model config is flat (every field of the memory, pattern, positions, mixers and hourglass sections at the
  top of ``"model"``), which today's :class:`~longseq.config.model.ModelConfig` still reads;
* two weights had other names: the compressors and the memory tokens (the architecture's ``v1_weight_names``,
  :class:`~longseq.model.spec.ModelSpec`);
* a training state's memory tensors were named ``mems.i`` and ``state.i.j``;
* and, as in format v2, a fine-tuned run kept its task's options in a dict, ``{"name": ..., "options": {...}}``.

Format v2 differs in that last way only.  Today the options are typed fields of the task's options class
(:mod:`longseq.config.task`); a classifier that recorded no ``pooling`` was trained with ``last``, the default then.
A format v3 checkpoint written before each task had its options class (d3a9f4a and earlier) stored every task's
options in one flat class, the other tasks' at their defaults: ``RunConfig.from_dict`` reads them in the task's
terms (:func:`~longseq.config.task.upgrade_flat_task`, in the config package, as a run.toml is read there too).  In
any format, a ``linear`` or ``performer`` model saved before ``mixers.reset_every`` and ``mixers.rotary`` existed
gets both off, and a model saved before ``mixers.short_conv`` existed gets no short convolution (``delta`` has one
by default now), as it ran (:func:`upgrade_unforgetting`).  Each reader of a checkpoint passes what it read through
the function here for its part; an old checkpoint then loads and scores what it scored (``tests/fixtures``, format
v1 files)."""

from __future__ import annotations

from torch import Tensor

from longseq.config.model import upgrade_stored_model

FORMAT_V1 = "longseq-checkpoint-v1"
OLD_FORMATS = (FORMAT_V1, "longseq-checkpoint-v2")


def is_v1(config: dict) -> bool:
    return config.get("format") == FORMAT_V1


def upgrade_weight_names(tensors: dict[str, Tensor], v1_names: dict[str, str]) -> dict[str, Tensor]:
    """A v1 checkpoint's weights under today's names: each name that starts with a prefix of ``v1_names`` (its
    architecture's ``ModelSpec.v1_weight_names``) starts with that prefix's new form."""
    renamed = {}
    for name, tensor in tensors.items():
        for old, new in v1_names.items():
            if name.startswith(old):
                name = new + name[len(old) :]
        renamed[name] = tensor
    return renamed


def upgrade_memory_names(tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    """A v1 training state's memory tensors (``mems.i``, ``state.i.j``) under today's names (``memory.hidden.i``,
    ``memory.state.i.j``); today's names pass unchanged."""

    def name(old: str) -> str:
        if old.startswith("mems."):
            return "memory.hidden." + old.split(".", 1)[1]
        return "memory." + old.split(".", 1)[1] if old.startswith("state.") else old

    return {name(k): v for k, v in tensors.items()}


def upgrade_run(run: dict) -> dict:
    """A stored run config (a checkpoint's ``"run"``) in today's terms: a task's options dict becomes its fields,
    and a model of the mixers without decay saved before they restarted and rotated keeps its unbounded state."""
    run = upgrade_unforgetting(run)
    task = run.get("task")
    if not isinstance(task, dict) or "options" not in task:
        return run
    options = dict(task["options"])
    if task.get("name") == "classify":
        options.setdefault("pooling", "last")  # the default of the runs that did not record it
    return {**run, "task": {"name": task["name"], **options}}


def upgrade_unforgetting(run: dict) -> dict:
    """``linear`` and ``performer`` stored without ``mixers.reset_every`` (before 2026-12-06) ran unbounded and
    unrotated: those settings are written in (:func:`~longseq.config.model.upgrade_stored_model`), so the
    checkpoint scores and resumes as it did."""
    model = run.get("model")
    return run if not isinstance(model, dict) else {**run, "model": upgrade_stored_model(model)}
