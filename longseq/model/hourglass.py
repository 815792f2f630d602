"""Multi-resolution modeling: the hourglass of Nawrot et al. (2021), "Hierarchical Transformers Are More Efficient
Language Models", with the XL memory at each resolution.

Layers ``first .. end - 1`` of the stack run on the sequence shortened by k.  Shortened position j summarises the
k positions up to and including jk (a causal shift by k - 1, then linear or mean pooling of each group), so it
sees nothing after jk; upsampling maps it to k vectors, one for each of the positions jk .. jk + k - 1, added to
the block's input (the residual link).  Position t therefore reads the shortened path only up to k * floor(t / k)
<= t: causal at every factor.

Groups are aligned with the stream, not with segments: the block carries as its state the last k - 1 inputs, the
upsampled vectors of the last group, the position in the current group (phase) and that group's document, and
the shortened layers carry their own memory (``mem_len // k`` groups, or ``coarse_mem_len``; distances counted in
groups).  A segment that completes no group (generation, one token at a time) leaves the shortened layers' memory
as it was.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from longseq.config.model import ModelConfig
from longseq.model.layers import LayerOutput, shape_fault
from longseq.model.memory import HourglassState, Memory, Recurrence, StateContext


def inner_config(config: ModelConfig) -> ModelConfig:
    """The config of the shortened layers: their mixers and patterns, the memory counted in groups or chunks
    (:meth:`~longseq.config.model.ModelConfig.coarse_mem`), no hourglass."""
    first, end = config.hourglass.shorten_layers
    mixers, patterns = config.layer_mixers[first:end], config.layer_pattern_names[first:end]
    memory = {**config.memory.to_dict(), "mem_len": config.coarse_mem()}
    return config.replace(
        n_layer=end - first,
        mixer=mixers,
        pattern={**config.pattern.to_dict(), "attention": patterns},
        memory=memory,
        hourglass={"shorten_layers": [], "boundaries": "fixed"},
    )


class Hourglass(nn.Module):
    """The shortened middle of a stack, called like a recurrent layer (its "present" is its new memory)."""

    attends = False  # a recurrent layer to the outer stack: its state and its shortened layers' memory
    reads = ("shorten_fn",)  # the hourglass options only the fixed groups read (a predictor's: BOUNDARY_PREDICTORS)

    def __init__(self, config: ModelConfig, inner: nn.Module) -> None:
        super().__init__()
        self.factor, self.d_model = config.hourglass.shorten_factor, config.d_model
        k, width = self.factor, config.d_model
        self.shorten = nn.Linear(k * width, width) if config.hourglass.shorten_fn == "linear" else None
        self.upsample = nn.Linear(width, k * width)  # one vector per position of the group
        self.inner = inner  # a LayerStack of the shortened layers
        self.coarse_mem = config.coarse_mem  # slots of the shortened layers' memory, given the stack's mem_len

    def state_fault(self, state, batch: int) -> str | None:
        """(its last k - 1 inputs, the upsampled vectors of its last group, its phase, its group's document)."""
        k, width = self.factor, self.d_model
        return shape_fault("an hourglass", state, HourglassState, batch, ((k - 1, width), (k, width), (), ()))

    def forward(self, hidden: Tensor, rel_key, r_w_bias, r_r_bias, mask, context: StateContext):
        batch, length, width = hidden.shape
        r = context.recurrence
        inner_recurrence = Recurrence(  # the shortened layers count positions in groups
            self.coarse_mem(r.mem_len), r.clamp_len // self.factor if r.clamp_len > 0 else -1, r.same_length
        )
        k = self.factor
        held = context.state  # an HourglassState, or None at the start of a stream
        tail, up, up_doc = self._state(None if held is None else held.tensors, hidden)
        phase = 0 if held is None else held.phase
        full = torch.cat([tail, hidden], dim=1)  # (B, k - 1 + T, E): position t of the segment at k - 1 + t
        first_end = (-phase) % k  # segment index of the first group end: global positions phase + t, ends at 0 mod k
        ends = torch.arange(first_end, max(first_end, length), k, device=hidden.device)  # (n,), maybe none
        docs = context.docs
        windows = full.unfold(1, k, 1)[:, ends].transpose(-1, -2)  # (B, n, k, E): positions end - k + 1 .. end
        if docs is not None:  # a group's positions from an earlier document are left out
            full_docs = torch.cat([docs[1][:, None].expand(batch, k - 1), docs[0]], dim=1)
            same = full_docs.unfold(1, k, 1)[:, ends] == docs[0][:, ends, None]  # (B, n, k)
            windows = windows * same[..., None].to(windows.dtype)
        inner_memory = Memory() if held is None else held.inner
        if len(ends):
            short = self.shorten(windows.flatten(-2)) if self.shorten is not None else windows.mean(dim=2)  # (B, n, E)
            short, inner_memory = self._run_inner(short, inner_memory, docs, ends, inner_recurrence)
            up = torch.cat([up[:, None], self.upsample(short).view(batch, -1, k, width)], dim=1)  # (B, n + 1, k, E)
            end_docs = None if docs is None else torch.cat([up_doc[:, None], docs[0][:, ends]], dim=1)  # (B, n + 1)
        else:
            up, end_docs = up[:, None], None if docs is None else up_doc[:, None]
        position = phase + torch.arange(length, device=hidden.device)  # global positions, modulo a multiple of k
        group = torch.div(position, k, rounding_mode="floor") * k  # each position's group end
        index = torch.div(group - phase - first_end, k, rounding_mode="floor") + 1  # 0: the group of an earlier segment
        added = up[:, index, position - group]  # (B, T, E)
        if docs is not None:  # a group of another document adds nothing
            added = added * (end_docs[:, index] == docs[0]).to(added.dtype)[..., None]
        new_state = (
            full[:, length:].detach(),
            up[:, -1].detach(),
            torch.full((batch,), (phase + length) % k, dtype=torch.long, device=hidden.device),
            up_doc if end_docs is None else end_docs[:, -1],
        )
        return LayerOutput(hidden + added, HourglassState(new_state, inner_memory, (phase + length) % k))

    def _state(self, state, hidden: Tensor):
        batch, k = hidden.size(0), self.factor
        if state is None:
            zeros = hidden.new_zeros
            return (
                zeros(batch, k - 1, self.d_model),
                zeros(batch, k, self.d_model),
                torch.full((batch,), -1, dtype=torch.long, device=hidden.device),
            )
        tail, up, _, up_doc = state  # its phase tensor is kept for the checkpoint; the host's phase is read
        return tail.to(hidden.dtype), up.to(hidden.dtype), up_doc

    def _run_inner(self, short: Tensor, memory: Memory, docs, ends: Tensor, r: Recurrence) -> tuple[Tensor, Memory]:
        """The shortened layers over the new groups (B, n, E), with their own memory and recurrence ``r`` (counted
        in groups)."""
        doc_ids = None if docs is None else docs[0][:, ends]
        step = self.inner.open_step(memory, short.size(0), short.size(1), short.device, r, doc_ids)
        out, memory, _ = self.inner.run(step, memory, short, r)
        return out, memory
