"""longseq: Transformer-XL and long-sequence language modeling on current PyTorch."""

from longseq.config import ConfigError, DataConfig, EvalConfig, ModelConfig, RunConfig, TrainConfig, get_preset
from longseq.model import LMOutput, TransformerXLLM

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "DataConfig",
    "EvalConfig",
    "LMOutput",
    "ModelConfig",
    "RunConfig",
    "TrainConfig",
    "TransformerXLLM",
    "get_preset",
]
