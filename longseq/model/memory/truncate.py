"""Truncation, the paper's memory: keep the last ``mem_len`` positions of [memory; segment], detached (or, with
``mem_bptt`` > 1 in training, with their gradient, which the caller cuts every ``mem_bptt`` segments)."""

from __future__ import annotations

import torch
from torch import Tensor

from longseq.model.memory.policy import Selection


def keep_recent(inputs: Tensor, old: Tensor | None, mem_len: int, keep_graph: bool = False) -> Tensor:
    """The last ``mem_len`` positions of [old; inputs] (B, M', E), detached: no gradient reaches an earlier
    segment (the paper's SG(.)); with ``keep_graph``, the positions keep their gradient."""
    if mem_len == 0:
        return inputs[:, :0].detach()
    if not keep_graph:  # detached first: the join builds no graph
        inputs, old = inputs.detach(), None if old is None else old.detach()
    joined = inputs if old is None or old.size(1) == 0 else torch.cat([old, inputs], dim=1)  # (B, M + T, E)
    return joined[:, -mem_len:]


class Truncate:
    """The selection policy ``mem_select="recent"``: the most recent ``mem_len`` positions stay."""

    needs_mass = False  # it reads no attention weights

    def check(self, step) -> None:
        pass

    def select(self, step, inputs: list[Tensor | None], plain: list[Tensor | None], masses: list) -> Selection:
        mem_len = step.recurrence.mem_len
        keep_graph = step.training and step.config.memory.mem_bptt > 1
        kept = tuple(
            None if x is None else keep_recent(x, old, mem_len, keep_graph) for x, old in zip(inputs, plain)
        )  # recurrent layers (None) keep a state instead
        attending = [(x, k) for x, k in zip(inputs, kept) if x is not None]
        n_evicted = step.memory.mem_length + attending[0][0].size(1) - attending[0][1].size(1) if attending else 0
        return Selection(kept, n_evicted)
