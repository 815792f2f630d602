"""Transformer-XL architecture: attention, positions, memory, adaptive softmax, backbone."""

from longseq.model.memory import LayerMemory, Memory, Quantized, Recurrence, reset_rows
from longseq.model.transformer import LMOutput, TransformerXL, TransformerXLLM


def build_model(config):
    """The language model a config describes: Transformer-XL (and its vanilla and Shaw variants) or the LSTM."""
    if config.vocab_size < 1:
        raise ValueError("ModelConfig.vocab_size is 0 (taken from the tokenizer in training): set it to build a model")
    if config.arch == "lstm":
        from longseq.model.lstm import LSTMLM

        return LSTMLM(config)
    return TransformerXLLM(config)


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
