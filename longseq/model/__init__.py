"""Transformer-XL architecture: attention, positions, memory, adaptive softmax, backbone."""

from longseq.model.memory import KVMemory, Memory, MemoryState, Quantized, memory_nbytes, reset_rows, update_memory
from longseq.model.transformer import LMOutput, TransformerXL, TransformerXLLM

__all__ = [
    "KVMemory",
    "LMOutput",
    "Memory",
    "MemoryState",
    "Quantized",
    "memory_nbytes",
    "reset_rows",
    "TransformerXL",
    "TransformerXLLM",
    "update_memory",
]
