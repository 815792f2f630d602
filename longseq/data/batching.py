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

from longseq.data.sources import SplitFile


class BatchingError(ValueError):
    """The data is too short for the requested batch shape."""


@dataclass
class Segment:
    input_ids: Tensor  # (B, T)
    labels: Tensor  # (B, T)
    new_epoch: bool  # the first segment of a pass over the data: start from an empty memory
    doc_ids: Tensor | None = None  # (B, T) document of every input token, when documents are tracked
    first: Tensor | None = None  # (B,) where each row's first input token is in the split (its labels follow it)


class OrderedStream:
    """Endless (for training) or one-pass (for evaluation) iterator over ordered segments.

    ``ids`` is any flat array of token ids: in memory, or a ``np.memmap`` of a prepared corpus.  Row b of the
    stream is the contiguous slice ``ids[b * N : (b + 1) * N]`` (N = ``len(ids) // batch_size``); a segment reads
    only its own window of every row, so a memory-mapped corpus is never loaded.  ``rows`` (a slice of
    ``range(batch_size)``) yields only those rows: a data-parallel rank reads its own streams only.
    ``doc_ids`` (an array, or a :class:`~longseq.data.sources.DocumentIds`) is sliced the same way.  A prepared
    corpus's split is read from its file (:class:`~longseq.data.sources.SplitFile`): one truncated or rewritten
    under the run is a :class:`~longseq.data.sources.CorpusChangedError`, not a SIGBUS.

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
        doc_ids=None,
        rows: slice | None = None,
    ) -> None:
        n_step = len(ids) // batch_size
        if n_step < 2:
            raise BatchingError(
                f"{len(ids)} tokens cannot fill {batch_size} streams of at least 2 tokens; lower batch_size"
            )
        if doc_ids is not None and len(doc_ids) != len(ids):
            raise BatchingError(f"doc_ids has {len(doc_ids)} entries for {len(ids)} tokens")
        self.ids, self.doc_ids, self.n_step = ids, doc_ids, n_step
        self.file = SplitFile.of(ids)  # a prepared split: read from its file, never through the map (SIGBUS)
        self.rows = range(batch_size)[rows if rows is not None else slice(None)]
        if len(self.rows) == 0:
            raise BatchingError(f"rows={rows} selects none of the {batch_size} streams")
        self.batch_size, self.tgt_len, self.varlen, self.seed = batch_size, tgt_len, varlen, seed
        self.epoch = 0
        self.position = 0
        self.segment = 0

    @property
    def stream_len(self) -> int:
        return self.n_step

    @property
    def data(self) -> Tensor:
        """All of this stream's rows, (R, N): reads every token (for tests and small corpora)."""
        return self._window(self.ids, 0, self.n_step)

    def _window(self, array, start: int, length: int) -> Tensor:
        """Columns [start, start + length) of this stream's rows of ``array``, (R, length), int64."""
        if array is self.ids and self.file is not None:
            parts = [self.file.read(b * self.n_step + start, length) for b in self.rows]
        else:
            parts = [np.asarray(array[b * self.n_step + start : b * self.n_step + start + length]) for b in self.rows]
        return torch.from_numpy(np.stack(parts).astype(np.int64, copy=False))

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
        window = self._window(self.ids, start, length + 1)  # (R, T + 1): the inputs and, shifted by one, the labels
        self.position += length
        self.segment += 1
        docs = None if self.doc_ids is None else self._window(self.doc_ids, start, length)
        first = torch.as_tensor([b * self.n_step + start for b in self.rows], dtype=torch.long)
        return Segment(window[:, :-1], window[:, 1:], new_epoch, docs, first)

    def n_segments(self) -> int:
        """Segments in one pass at fixed length."""
        return -(-(self.stream_len - 1) // self.tgt_len)
