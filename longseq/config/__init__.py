"""Typed configuration: a base with strict JSON round trips and ``--set`` overrides, the model's config in
sections, the run's configs, config files (TOML or JSON) and the presets shipped as such files."""

from longseq.config.base import ConfigError, JsonConfig, apply_overrides, coerce_value
from longseq.config.files import load_run_config, write_run_config
from longseq.config.model import MemoryConfig, ModelConfig, PatternConfig, PositionConfig, Recurrence
from longseq.config.presets import PRESETS, get_preset
from longseq.config.run import DataConfig, EvalConfig, RunConfig, TaskConfig
from longseq.config.train import (
    SCHEDULES,
    CheckpointConfig,
    CurriculumConfig,
    LoggingConfig,
    OptimConfig,
    RuntimeConfig,
    SampleConfig,
    TrainConfig,
)

__all__ = [
    "PRESETS",
    "SCHEDULES",
    "CheckpointConfig",
    "ConfigError",
    "CurriculumConfig",
    "DataConfig",
    "EvalConfig",
    "JsonConfig",
    "LoggingConfig",
    "MemoryConfig",
    "ModelConfig",
    "OptimConfig",
    "PatternConfig",
    "PositionConfig",
    "Recurrence",
    "RunConfig",
    "RuntimeConfig",
    "SampleConfig",
    "TaskConfig",
    "TrainConfig",
    "apply_overrides",
    "coerce_value",
    "get_preset",
    "load_run_config",
    "write_run_config",
]
