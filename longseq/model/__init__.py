"""Transformer-XL architecture: attention, positions, memory, adaptive softmax, backbone."""

from longseq.model.memory import (
    HiddenMemory,
    KVMemory,
    Memory,
    Quantized,
    Recurrence,
    RecurrentState,
    RingMemory,
    reset_rows,
)
from longseq.model.registry import build_model
from longseq.model.transformer import LMOutput, TransformerXL, TransformerXLLM

__all__ = [
    "LMOutput",
    "HiddenMemory",
    "KVMemory",
    "Memory",
    "Quantized",
    "RecurrentState",
    "Recurrence",
    "RingMemory",
    "TransformerXL",
    "TransformerXLLM",
    "build_model",
    "reset_rows",
]
