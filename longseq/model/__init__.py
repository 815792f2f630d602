"""Transformer-XL architecture: attention, positions, memory, adaptive softmax, backbone."""

from longseq.model.memory import KVMemory, Memory, update_memory
from longseq.model.transformer import LMOutput, TransformerXL, TransformerXLLM

__all__ = ["KVMemory", "LMOutput", "Memory", "TransformerXL", "TransformerXLLM", "update_memory"]
