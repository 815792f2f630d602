"""The recurrence memory: one immutable :class:`Memory` per forward pass, read per layer and written by small
policies (truncation, pruning, compression, 8-bit storage, memory tokens, documents, dropout) or kept as
projected keys and values (:mod:`~longseq.model.memory.cache`).  See :mod:`~longseq.model.memory.policy`."""

from longseq.model.memory.cache import RingBuffer, RingKV
from longseq.model.memory.compose import MemoryPolicies, build_policies
from longseq.model.memory.documents import reset_rows
from longseq.model.memory.policy import (
    LayerContext,
    MaskInputs,
    MemoryPolicy,
    MemoryStep,
    Reconstruction,
    StepInputs,
    StepOutput,
    Update,
)
from longseq.model.memory.quantize import Quantized, quantize
from longseq.model.memory.state import LayerMemory, Memory, Recurrence, as_memory
from longseq.model.memory.truncate import keep_recent

__all__ = [
    "LayerContext",
    "LayerMemory",
    "Memory",
    "MaskInputs",
    "MemoryPolicies",
    "MemoryPolicy",
    "MemoryStep",
    "Reconstruction",
    "Quantized",
    "Recurrence",
    "RingBuffer",
    "RingKV",
    "StepInputs",
    "StepOutput",
    "Update",
    "as_memory",
    "build_policies",
    "keep_recent",
    "quantize",
    "reset_rows",
]
