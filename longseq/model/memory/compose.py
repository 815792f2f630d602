"""The memory policies a config switches on, composed: one step per forward pass."""

from __future__ import annotations

from torch import nn

from longseq.config.model import ModelConfig
from longseq.model.memory.cache import KeyValueStep
from longseq.model.memory.compress import Compression
from longseq.model.memory.documents import Documents
from longseq.model.memory.dropout import MemoryDropout
from longseq.model.memory.policy import MemoryStep, StepInputs
from longseq.model.memory.prune import AttentionPrune
from longseq.model.memory.quantize import FloatStorage, Int8Storage
from longseq.model.memory.state import HiddenMemory, KVMemory, RingMemory
from longseq.model.memory.step import HiddenStep
from longseq.model.memory.tokens import MemoryTokens
from longseq.model.memory.truncate import Truncate

STEPS = {HiddenMemory: HiddenStep, KVMemory: KeyValueStep, RingMemory: KeyValueStep}  # by the memory's kind


class MemoryPolicies(nn.Module):
    """The policies a config switches on, one per role (:mod:`~longseq.model.memory.policy`), and the storage
    codec; opens one step per forward pass.  The policies with parameters (memory tokens, learned compressors)
    sit in ``policies``, so checkpoints name them ``memory.policies.tokens.*`` and ``memory.policies.compression.*``."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        m = config.memory
        self.codec = Int8Storage(m.mem_quant_axis) if m.mem_quant == "int8" else FloatStorage()
        learned: dict[str, nn.Module] = {}
        if m.mem_tokens:
            learned["tokens"] = MemoryTokens(m.mem_tokens, config.d_model, m.mem_tokens_bptt)
        if m.cmem_len:
            learned["compression"] = Compression(m.cmem_fn, m.cmem_rate, m.cmem_len, config.d_model, config.n_layer)
        self.policies = nn.ModuleDict(learned)
        self.selection = AttentionPrune() if m.mem_select == "attention" else Truncate()
        self.documents = Documents(m.cmem_rate, m.cmem_len)
        self.dropout = MemoryDropout(m.mem_dropout) if m.mem_dropout else None

    @property
    def tokens(self) -> MemoryTokens | None:
        return self.policies["tokens"] if "tokens" in self.policies else None

    @property
    def compression(self) -> Compression | None:
        return self.policies["compression"] if "compression" in self.policies else None

    def begin(self, given: StepInputs) -> MemoryStep:
        """The step of one forward pass (:class:`~longseq.model.memory.policy.MemoryStep`), by the memory's kind."""
        return STEPS[given.memory.kind](self, given)
