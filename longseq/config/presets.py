"""Presets: run configurations shipped as TOML files in ``longseq/config/presets/`` (the same format as
``longseq train --config FILE``; see :mod:`longseq.config.files`).  Add a preset by adding a file."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from longseq.config.files import load_run_config, preset_names, preset_path
from longseq.config.run import RunConfig


def get_preset(name: str) -> RunConfig:
    """Return a fresh :class:`RunConfig` for a preset name, or raise with the close matches."""
    return load_run_config(preset_path(name))


PRESETS: dict[str, Callable[[], RunConfig]] = {name: partial(get_preset, name) for name in preset_names()}
