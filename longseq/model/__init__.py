"""Transformer-XL architecture: attention, positions, memory, adaptive softmax, backbone."""

from longseq.model.memory import KVMemory, Memory, MemoryState, Quantized, memory_nbytes, reset_rows, update_memory
from longseq.model.transformer import LMOutput, TransformerXL, TransformerXLLM


def build_model(config):
    """The language model a config describes: Transformer-XL (and its vanilla and Shaw variants) or the LSTM."""
    if config.arch == "lstm":
        from longseq.model.lstm import LSTMLM

        return LSTMLM(config)
    return TransformerXLLM(config)


__all__ = [
    "build_model",
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
