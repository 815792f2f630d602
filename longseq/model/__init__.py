"""Transformer-XL architecture: attention, positions, memory, adaptive softmax, backbone."""

from longseq.model.memory import LayerMemory, Memory, Quantized, Recurrence, reset_rows
from longseq.model.registry import build_model
from longseq.model.transformer import LMOutput, TransformerXL, TransformerXLLM

__all__ = [
    "LMOutput",
    "LayerMemory",
    "Memory",
    "Quantized",
    "Recurrence",
    "TransformerXL",
    "TransformerXLLM",
    "build_model",
    "reset_rows",
]
