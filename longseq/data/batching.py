"""Ordered LM batching: parallel streams consumed in consecutive segments.

The token stream is cut into ``batch_size`` equal rows; row b of every batch continues row b of
the previous one, so the memory of stream b always holds that stream's preceding text (the
paper's ``LMOrderedIterator``).  Each segment's labels are the inputs shifted by one, taken from
the stream itself, so no prediction is lost at a segment boundary.

The iterator's position is a small JSON-able state, so training resumes with identical batches.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor


class BatchingError(ValueError):
    """The data is too short for the requested batch shape."""


@dataclass
class Segment:
    input_ids: Tensor  # (B, T)
    labels: Tensor  # (B, T)
    new_epoch: bool  # the first segment of a pass over the data: start from an empty memory
    doc_ids: Tensor | None = None  # (B, T) document of every input token, when documents are tracked


class OrderedStream:
    """Endless (for training) or one-pass (for evaluation) iterator over ordered segments.

    ``varlen`` draws each segment length as the paper's code does: ``tgt_len`` (or half of it with
    probability 0.05), plus Gaussian noise of std 5, clipped to [5, tgt_len + 15].
    """

    def __init__(
        self,
        ids: np.ndarray,
        batch_size: int,
        tgt_len: int,
        varlen: bool = False,
        seed: int = 0,
        doc_ids: np.ndarray | None = None,
    ) -> None:
        n_step = len(ids) // batch_size
        if n_step < 2:
            raise BatchingError(
                f"{len(ids)} tokens cannot fill {batch_size} streams of at least 2 tokens; lower batch_size"
            )
        self.data = torch.from_numpy(
            np.ascontiguousarray(ids[: n_step * batch_size].reshape(batch_size, n_step))
        )  # (B, N)
        self.docs = None
        if doc_ids is not None:
            if len(doc_ids) != len(ids):
                raise BatchingError(f"doc_ids has {len(doc_ids)} entries for {len(ids)} tokens")
            self.docs = torch.from_numpy(
                np.ascontiguousarray(doc_ids[: n_step * batch_size].reshape(batch_size, n_step))
            )
        self.batch_size, self.tgt_len, self.varlen, self.seed = batch_size, tgt_len, varlen, seed
        self.epoch = 0
        self.position = 0
        self.segment = 0

    @property
    def stream_len(self) -> int:
        return self.data.size(1)

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position, "segment": self.segment}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.position, self.segment = int(state["epoch"]), int(state["position"]), int(state["segment"])

    def _length(self) -> int:
        if not self.varlen:
            return self.tgt_len
        rng = np.random.default_rng([self.seed, self.epoch, self.segment])
        base = self.tgt_len if rng.random() < 0.95 else self.tgt_len / 2
        return int(min(self.tgt_len + 15, max(5, int(rng.normal(base, 5)))))

    def next_segment(self, cycle: bool = True) -> Segment | None:
        """The next segment; at the end of the data, wrap to a new epoch (``cycle``) or return None."""
        if self.position >= self.stream_len - 1:
            if not cycle:
                return None
            self.epoch, self.position, self.segment = self.epoch + 1, 0, 0
        new_epoch = self.position == 0
        length = min(self._length(), self.stream_len - 1 - self.position)
        start = self.position
        input_ids = self.data[:, start : start + length]
        labels = self.data[:, start + 1 : start + 1 + length]
        self.position += length
        self.segment += 1
        docs = None if self.docs is None else self.docs[:, start : start + length]
        return Segment(input_ids, labels, new_epoch, docs)

    def n_segments(self) -> int:
        """Segments in one pass at fixed length."""
        return -(-(self.stream_len - 1) // self.tgt_len)
