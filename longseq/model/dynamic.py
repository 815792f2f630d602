"""A dynamic hourglass: the shortened middle of a stack runs on chunks whose boundaries a predictor chooses
(``boundaries=learned`` or ``entropy``, :mod:`longseq.model.boundaries`), with an XL memory of chunks.

For a segment (B, T, E) of the level's input x (the output of the layers below, at full resolution):

1. the predictor decides, from positions <= t, whether position t begins a chunk (b_t, with probability p_t);
2. down-sampling selects the boundary positions: chunk c is represented by x at its first position s_c, which has
   read every position up to s_c and none after;
3. the coarse stack (attention layers) runs over the chunks with its own memory of ``mem_len`` chunks (or
   ``coarse_mem_len``), one slot per chunk, so that it reaches about that many x the mean chunk length positions back;
4. the smoothing averages the chunks' outputs (H-Net's EMA) and up-sampling gives position t the output of the chunk
   it lies in, times the straight-through confidence (1 in the forward pass);
5. the residual link adds it to x, for the layers above: for learned chunks with ``residual_proj`` (the default, as
   H-Net) through a linear map W_r x + b_r that starts at zero, so that at first the layers above read the coarse
   path only.  Entropy chunks add x itself: their threshold starts where almost nothing is cut, and a residual
   path that starts closed left the layers above with almost nothing to read (valid bpb 3.60 against 3.15 after
   600 steps on tiny-shakespeare).

Causality: position t reads the chunk that begins at s_c <= t, whose coarse output has read chunks up to c only
(each represented by a position <= s_c): nothing after t.  A chunk whose first position lies in an earlier segment
is read from the state (the smoothed output of the row's last chunk), so a chunk may span segments.

Rows cut different numbers of chunks.  The chunks are left-aligned and padded to the most of any row; the coarse
memory keeps each row's last real chunks right-aligned (:func:`~longseq.model.memory.ragged.keep_last`), a slot that
holds nothing masked by document id -1, so that relative distances count chunks.  The number of chunks is read on
the host once per call (the coarse stack's shape), which ``torch.export`` cannot trace.

The state is an :class:`~longseq.model.memory.HourglassState` whose tensors are the last input (B, E), the
smoothed output of the last chunk (B, E), the predictor's score of the last position (B,) and the length of the
last chunk so far (B,, int64: what ``max_chunk`` reads), with the coarse memory as its inner memory (phase 0).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from longseq.config.model import ModelConfig
from longseq.model.boundaries import BOUNDARY_PREDICTORS, confidence, select_chunks, smooth, upsample
from longseq.model.layers import LayerOutput, shape_fault
from longseq.model.memory import HourglassState, Memory, Recurrence, StateContext
from longseq.model.memory.ragged import keep_last


class DynamicHourglass(nn.Module):
    """The shortened middle of a stack on chunks chosen by a boundary predictor, called like a recurrent layer (its
    "present" is its new state, with the coarse memory)."""

    attends = False

    def __init__(self, config: ModelConfig, inner: nn.Module) -> None:
        super().__init__()
        h, width = config.hourglass, config.d_model
        kind = BOUNDARY_PREDICTORS[h.boundaries]
        self.boundaries = kind.build(config)
        self.inner = inner  # a LayerStack of the coarse (attention) layers
        projected = h.residual_proj and "residual_proj" in kind.reads
        self.residual = nn.Linear(width, width) if projected else None  # H-Net's residual_proj
        self.coarse_mem = config.coarse_mem  # slots of the shortened layers' memory, given the stack's mem_len

    def init_own_parameters(self) -> None:
        if self.residual is not None:  # zero, as H-Net's: the residual path opens as it learns
            nn.init.zeros_(self.residual.weight)
            nn.init.zeros_(self.residual.bias)

    def state_fault(self, state, batch: int) -> str | None:
        """(its last input, its open chunk's output, that position's score[, the open chunk's length])."""
        width = self.inner.config.d_model
        short, whole = ((width,), (width,), ()), ((width,), (width,), (), ())  # stored before the length was kept
        return shape_fault("a dynamic hourglass", state, HourglassState, batch, whole, short)

    def forward(self, hidden: Tensor, rel_key, r_w_bias, r_r_bias, mask, context: StateContext) -> LayerOutput:
        if torch.compiler.is_exporting():
            raise ValueError(
                "a dynamic hourglass (boundaries=learned or entropy) cannot be exported with torch.export: the "
                "number of chunks of a segment depends on the data; export a model with boundaries=fixed"
            )
        held = context.state  # an HourglassState, or None at the start of a stream
        previous, carried, last_score, run = self._state(held, hidden)
        forced = self._forced(held, context.docs, hidden)
        cut = self.boundaries(hidden, previous, last_score, run, forced, context.tokens)
        chunks, positions, counts = select_chunks(hidden, cut.cuts)  # (B, n, E), (B, n), (B,)
        memory = Memory() if held is None else held.inner
        smoothed = chunks  # no chunk begins in this segment: (B, 0, E)
        if chunks.size(1):
            docs = torch.zeros_like(positions) if context.docs is None else context.docs[0].gather(1, positions)
            outputs, memory = self._run_inner(chunks, memory, counts, docs, context.recurrence)
            starts = forced.gather(1, positions)
            smoothed = smooth(outputs, cut.probs.gather(1, positions), carried, starts)  # (B, n, E)
        added, carried = upsample(smoothed, carried, cut.cuts)  # (B, T, E), (B, E)
        state = (hidden[:, -1].detach(), carried.detach(), cut.last_score.detach(), cut.run)
        residual = hidden if self.residual is None else self.residual(hidden)
        return LayerOutput(residual + added * confidence(cut), HourglassState(state, memory, 0), None, cut.aux)

    def _state(self, held: HourglassState | None, hidden: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """The last input before the segment (B, E), the smoothed output of its chunk (B, E), the predictor's
        score of that position (B,) and the length of that chunk so far (B,, int64): zeros at the start of a stream
        (and the length, in a state stored before it was kept)."""
        if held is not None and len(held.tensors) > 3:
            previous, carried, last_score = (t.to(hidden.dtype) for t in held.tensors[:3])
            return previous, carried, last_score, held.tensors[3]
        run = torch.zeros(hidden.size(0), dtype=torch.long, device=hidden.device)
        if held is None:
            zeros = hidden.new_zeros(hidden.size(0), hidden.size(-1))
            return zeros, zeros, zeros[:, 0], run
        return (*(t.to(hidden.dtype) for t in held.tensors), run)

    @staticmethod
    def _forced(held: HourglassState | None, docs, hidden: Tensor) -> Tensor:
        """(B, T) bool: the positions that begin a chunk whatever the predictor says, the start of the stream
        and the first position of every document."""
        batch, length = hidden.shape[:2]
        forced = torch.zeros(batch, length, dtype=torch.bool, device=hidden.device)
        if held is None:
            forced[:, 0] = True
        if docs is not None:
            ids, last = docs
            forced = forced | (ids != torch.cat([last[:, None], ids[:, :-1]], dim=1))
        return forced

    def _run_inner(self, chunks: Tensor, memory: Memory, counts: Tensor, docs: Tensor, recurrence: Recurrence):
        """The coarse stack over the chunks (B, n, E), padded after each row's ``counts``: its output and its
        memory of each row's last ``mem_len`` chunks."""
        batch, length = chunks.shape[:2]
        whole = Recurrence(memory.mem_length + length, recurrence.clamp_len)  # keeps every chunk for keep_last
        step = self.inner.open_step(memory, batch, length, chunks.device, whole, docs)
        out, written, _ = self.inner.run(step, memory, chunks, whole)
        return out, keep_last(written, counts, length, self.coarse_mem(recurrence.mem_len))
