"""Typed configuration: a base with strict JSON round trips and ``--set`` overrides, the model's config in
sections, the run's configs, the tasks' options (one class per task, chosen by name), config files (TOML or JSON)
and the presets shipped as such files."""

from longseq.config.base import ConfigError, JsonConfig, apply_overrides, coerce_value
from longseq.config.files import load_run_config, write_run_config
from longseq.config.model import MemoryConfig, ModelConfig, PatternConfig, PositionConfig, Recurrence
from longseq.config.presets import PRESETS, get_preset
from longseq.config.run import DataConfig, EvalConfig, RunConfig
from longseq.config.task import (
    ClassifyOptions,
    FinetuneOptions,
    LMOptions,
    MaskedLMOptions,
    RecallOptions,
    SpanOptions,
    TaskConfig,
)
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
    "ClassifyOptions",
    "ConfigError",
    "CurriculumConfig",
    "DataConfig",
    "EvalConfig",
    "FinetuneOptions",
    "JsonConfig",
    "LMOptions",
    "LoggingConfig",
    "MaskedLMOptions",
    "MemoryConfig",
    "ModelConfig",
    "OptimConfig",
    "PatternConfig",
    "PositionConfig",
    "RecallOptions",
    "Recurrence",
    "RunConfig",
    "RuntimeConfig",
    "SampleConfig",
    "SpanOptions",
    "TaskConfig",
    "TrainConfig",
    "apply_overrides",
    "coerce_value",
    "get_preset",
    "load_run_config",
    "write_run_config",
]
