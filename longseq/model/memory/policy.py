"""Memory policies and the per-forward memory step.

A forward pass opens one step on the memory it was given (:meth:`~longseq.model.memory.compose.MemoryPolicies.begin`).  Every layer asks the
step what to attend to before the segment (:meth:`~longseq.model.memory.step.HiddenStep.read`), and at the end the step writes the new
memory from the layers' inputs (:meth:`~longseq.model.memory.step.HiddenStep.write`).  What is read and kept is decided by small policies,
each in its own file, applied in this order:

    tokens       memory tokens around the segment, written after it          (tokens.py)
    selection    which positions stay: the most recent (truncation to mem_len) or the most attended  (truncate.py,
                 prune.py)
    compression  evicted positions compressed into an older memory            (compress.py)
    documents    document ids of every slot, so nothing crosses a document boundary  (documents.py)
    dropout      memory dropout in training                                   (dropout.py)

The storage codec (float, or 8 bits: quantize.py) encodes what is kept and decodes what is read.  A key/value
memory (cache.py) has a step of its own.  A new policy is a subclass of :class:`MemoryPolicy` in a file of its
own, switched on by a config field in :func:`longseq.model.memory.compose.build_policies`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor, nn


@dataclass
class LayerContext:
    """What one layer reads from the memory: an attention layer attends to hidden states (B, C + M, E), or to a
    key/value ``cache`` ((keys, values) of (B, H, M, D), or a ring), and ``with_mass`` asks it for the attention mass
    of every key; a recurrent layer (ssm, conv, rnn) continues from its ``state``, with ``docs`` = (document of every
    position (B, T), document of the last position before the segment (B,)) when documents are tracked."""

    memory: Tensor | None = None
    cache: object | None = None
    with_mass: bool = False
    state: tuple | None = None
    docs: tuple | None = None
    inner: object | None = None  # an hourglass block's memory of its shortened layers
    recurrence: object | None = None  # the call's Recurrence (an hourglass derives its shortened layers' from it)


@dataclass
class Update:
    """The new memory under construction, filled in by the policies' ``write`` in order."""

    inputs: list[Tensor | None]  # per layer, the segment's layer inputs (B, T, E); None for a recurrent layer
    plain: list[Tensor | None]  # per layer, the dense memory the layer attended to (B, M, E), compressed part aside
    masses: list[Tensor | None]  # per layer, attention mass of every key (B, K) when asked for
    hidden: Tensor  # the last layer's output (B, T', E), memory tokens included until the tokens policy strips them
    kept: tuple[Tensor, ...] = ()  # per layer, the new plain memory (B, M', E)
    n_evicted: int = 0  # positions of [memory; segment] that left the plain memory
    compressed: tuple[Tensor, ...] | None = None
    doc_ids: Tensor | None = None
    last_doc: Tensor | None = None  # (B,) document of the segment's last position
    tokens: Tensor | None = None
    tokens_age: int = 0
    aux_losses: list[Tensor] = field(default_factory=list)


class MemoryPolicy(nn.Module):
    """A part of the memory's behaviour.  Every hook is optional; ``step`` is the forward pass's
    :class:`HiddenStep`.  A policy is an ``nn.Module`` so that it may own parameters (compressors, tokens)."""

    def begin(self, step) -> None:
        """Called once when a forward pass opens its step, before the embedding."""

    def wrap(self, step, hidden: Tensor) -> Tensor:
        """The embedded segment (B, T, E) as the layers will see it."""
        return hidden

    def wrap_flags(self, step, flags: Tensor) -> Tensor:
        """Per-position flags of the segment (B, T) (global tokens) laid out as :meth:`wrap` lays out tokens."""
        return flags

    def read(self, step, layer: int, context: LayerContext) -> LayerContext:
        """What layer ``layer`` attends to before the segment."""
        return context

    def write(self, step, update: Update) -> None:
        """Fill in this policy's part of the new memory."""
