"""longseq: Transformer-XL and long-sequence language modeling on current PyTorch.

Importing longseq makes glibc keep the memory it frees (:mod:`longseq.runtime` says why: long training steps would
otherwise fault in their large tensors afresh every step); ``LONGSEQ_MALLOC=system`` keeps glibc's defaults.
"""

from longseq.config import ConfigError, DataConfig, EvalConfig, ModelConfig, RunConfig, TrainConfig, get_preset
from longseq.model import LMOutput, TransformerXLLM
from longseq.runtime import keep_freed_memory

keep_freed_memory()

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
