"""Truncation, the paper's memory: keep the last ``mem_len`` positions of [memory; segment], detached (or, with
``mem_bptt`` > 1 in training, with their gradient, which the caller cuts every ``mem_bptt`` segments); with attention
sinks (``sinks`` > 0, StreamingLLM), also the first ``sinks`` positions of the stream, for ever, before them."""

from __future__ import annotations

import torch
from torch import Tensor

from longseq.model.memory.policy import Selection


def keep_recent(
    inputs: Tensor, old: Tensor | None, mem_len: int, keep_graph: bool = False, sinks: int = 0, dim: int = 1
) -> Tensor:
    """The last ``mem_len`` positions of [old; inputs] along ``dim`` ((B, M', E), or (B, H, M', D) with ``dim`` 2),
    detached: no gradient reaches an earlier segment (the paper's SG(.)); with ``keep_graph``, the positions keep
    their gradient.  With ``sinks`` the first ``sinks`` positions of [old; inputs] stay before them: ``old`` holds
    the stream's first positions (all of it, until more than ``sinks`` + ``mem_len`` were read), so these are the
    stream's first positions."""
    if not keep_graph:  # detached first: the join builds no graph
        inputs, old = inputs.detach(), None if old is None else old.detach()
    joined = inputs if old is None or old.size(dim) == 0 else torch.cat([old, inputs], dim=dim)  # (B, M + T, E)
    length = joined.size(dim)
    if length <= sinks + mem_len:
        return joined
    recent = joined.narrow(dim, length - mem_len, mem_len)
    return recent if not sinks else torch.cat([joined.narrow(dim, 0, sinks), recent], dim=dim)


class Truncate:
    """The selection policy ``mem_select="recent"``: the most recent ``mem_len`` positions stay."""

    needs_mass = False  # it reads no attention weights

    def check(self, step) -> None:
        pass

    def select(self, step, inputs: list[Tensor | None], plain: list[Tensor | None], masses: list) -> Selection:
        mem_len, sinks = step.recurrence.mem_len, step.recurrence.sinks
        keep_graph = step.training and step.config.memory.mem_bptt > 1
        kept = tuple(
            None if x is None else keep_recent(x, old, mem_len, keep_graph, sinks) for x, old in zip(inputs, plain)
        )  # recurrent layers (None) keep a state instead
        attending = [(x, k) for x, k in zip(inputs, kept) if x is not None]
        n_evicted = step.memory.mem_length + attending[0][0].size(1) - attending[0][1].size(1) if attending else 0
        return Selection(kept, n_evicted)
