"""The recurrence memory: one immutable :class:`Memory` per forward pass, one small state object per layer
(:mod:`~longseq.model.memory.state`), read through a context per layer (:mod:`~longseq.model.memory.context`) and
written by small policies (truncation, pruning, compression, 8-bit storage, memory tokens, documents, dropout) or
kept as projected keys and values (:mod:`~longseq.model.memory.cache`).  See :mod:`~longseq.model.memory.policy`."""

from longseq.config.model import Recurrence
from longseq.model.memory.cache import RingBuffer, RingKV
from longseq.model.memory.compose import MemoryPolicies
from longseq.model.memory.context import CacheContext, HiddenContext, RingContext, StateContext
from longseq.model.memory.documents import reset_rows
from longseq.model.memory.policy import (
    Compressed,
    MaskInputs,
    MemoryStep,
    Reconstruction,
    Selection,
    SlotDocuments,
    StepInputs,
    StepOutput,
    WrittenTokens,
)
from longseq.model.memory.quantize import Quantized, quantize
from longseq.model.memory.state import (
    HiddenMemory,
    HourglassState,
    KVMemory,
    LayerState,
    Memory,
    RecurrentState,
    RingMemory,
    as_memory,
)
from longseq.model.memory.truncate import keep_recent

__all__ = [
    "CacheContext",
    "Compressed",
    "HiddenContext",
    "HiddenMemory",
    "HourglassState",
    "KVMemory",
    "LayerState",
    "MaskInputs",
    "Memory",
    "MemoryPolicies",
    "MemoryStep",
    "Quantized",
    "Reconstruction",
    "RecurrentState",
    "Recurrence",
    "RingBuffer",
    "RingContext",
    "RingKV",
    "RingMemory",
    "Selection",
    "SlotDocuments",
    "StateContext",
    "StepInputs",
    "StepOutput",
    "WrittenTokens",
    "as_memory",
    "keep_recent",
    "quantize",
    "reset_rows",
]
