"""The memory policies a config switches on, composed: one step per forward pass."""

from __future__ import annotations

from torch import nn

from longseq.config.model import ModelConfig
from longseq.model.memory.cache import KeyValueStep
from longseq.model.memory.compress import Compression
from longseq.model.memory.documents import Documents
from longseq.model.memory.dropout import MemoryDropout
from longseq.model.memory.policy import MemoryPolicy, MemoryStep, StepInputs
from longseq.model.memory.prune import AttentionPrune
from longseq.model.memory.quantize import FloatStorage, Int8Storage
from longseq.model.memory.step import HiddenStep
from longseq.model.memory.tokens import MemoryTokens
from longseq.model.memory.truncate import Truncate


class MemoryPolicies(nn.Module):
    """The policies a config switches on, in order, and the storage codec; opens one step per forward pass."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        m = config.memory
        self.codec = Int8Storage(m.mem_quant_axis) if m.mem_quant == "int8" else FloatStorage()
        self.policies = nn.ModuleDict(build_policies(config))  # named, so checkpoints name their parameters
        self.active = list(self.policies.values())

    def begin(self, given: StepInputs) -> MemoryStep:
        """The step of one forward pass (:class:`~longseq.model.memory.policy.MemoryStep`)."""
        step_type = HiddenStep if given.memory.storage == "hidden" else KeyValueStep
        return step_type(self, given)


def build_policies(config: ModelConfig) -> dict[str, MemoryPolicy]:
    """The policies of ``config`` by name, in the order of :mod:`longseq.model.memory.policy`."""
    m = config.memory
    policies: dict[str, MemoryPolicy] = {}
    if m.mem_tokens:
        policies["tokens"] = MemoryTokens(m.mem_tokens, config.d_model, m.mem_tokens_bptt)
    policies["selection"] = AttentionPrune() if m.mem_select == "attention" else Truncate()
    if m.cmem_len:
        policies["compression"] = Compression(m.cmem_fn, m.cmem_rate, m.cmem_len, config.d_model, config.n_layer)
    policies["documents"] = Documents(m.cmem_rate, m.cmem_len)
    if m.mem_dropout:
        policies["dropout"] = MemoryDropout(m.mem_dropout)
    return policies
