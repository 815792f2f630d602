"""A teacher's next-token distributions over a corpus split, computed once and kept by position: what knowledge
distillation (:mod:`longseq.tasks.distill`) reads at every training step.

The teacher reads the split as evaluation does, in ``batch_size`` ordered streams of segments of ``tgt_len`` with
its memory carried (:class:`~longseq.data.batching.OrderedStream`), and keeps, for every position ``p`` it predicts,
its ``top_k`` largest logits and their ids: its distribution of token ``p`` after the tokens before it.  The first
position of each stream and the split's last few tokens (those past ``batch_size`` whole streams) are predicted by
no stream: their ids are -1, and distillation leaves them to the next-token loss alone.  A directory holds::

    DIR/topk.safetensors   ids (n, k) int32 (-1: not predicted), logits (n, k) float32, read by slices (memory map)
    DIR/index.json         format, k, n, the teacher's weights' sha256, the split's ids' sha256, how it was read

written under a temporary name and renamed into place, so a killed pass leaves nothing half-written.
"""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import torch
from safetensors import safe_open
from safetensors.numpy import save_file

from longseq.config.base import ConfigError
from longseq.data.batching import OrderedStream
from longseq.eval.evaluate import start_memory
from longseq.progress import Meter

FORMAT = "longseq-teacher-topk-v1"
FILE, INDEX = "topk.safetensors", "index.json"


class TeacherCacheError(ConfigError):
    """A teacher cache that is missing, damaged, or made from another teacher, split or k."""


@torch.no_grad()
def teacher_topk(model, ids: np.ndarray, top_k: int, batch_size: int, tgt_len: int, progress: bool = False):
    """The teacher's ``top_k`` logits and ids at every position of ``ids`` (see the module docstring): two arrays
    (n, k), int32 ids (-1 where no stream predicts the position) and float32 logits."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    stream = OrderedStream(ids, batch_size, tgt_len)
    top_ids = np.full((len(ids), top_k), -1, dtype=np.int32)
    top_logits = np.zeros((len(ids), top_k), dtype=np.float32)
    mems = start_memory(model)
    try:
        with Meter(stream.n_segments(), "teacher", enabled=progress, quiet_start=True) as bar:
            while (segment := stream.next_segment(cycle=False)) is not None:
                out = model(segment.input_ids.to(device), mems)
                mems = out.mems
                values, where = out.logits.float().topk(top_k, dim=-1)  # (R, T, k)
                length = segment.input_ids.size(1)
                rows = (segment.first[:, None] + 1 + torch.arange(length)).reshape(-1).numpy()  # the labels' places
                top_ids[rows] = where.reshape(-1, top_k).cpu().numpy().astype(np.int32)
                top_logits[rows] = values.reshape(-1, top_k).cpu().numpy()
                bar.update(1)
    finally:
        model.train(was_training)
    return top_ids, top_logits


def write_teacher_cache(out_dir: str, top_ids: np.ndarray, top_logits: np.ndarray, **index) -> str:
    """``top_ids`` and ``top_logits`` (:func:`teacher_topk`) and ``index`` (the fingerprints and settings) into
    ``out_dir``, atomically; an existing directory is refused."""
    out_dir = os.path.abspath(os.path.expanduser(out_dir))
    if os.path.exists(out_dir):
        raise TeacherCacheError(f"{out_dir} already exists: remove it or choose another directory for the cache")
    tmp = f"{out_dir}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    try:
        save_file({"ids": top_ids, "logits": top_logits}, os.path.join(tmp, FILE))
        meta = {"format": FORMAT, "top_k": int(top_ids.shape[1]), "tokens": int(top_ids.shape[0]), **index}
        with open(os.path.join(tmp, INDEX), "w", encoding="utf-8") as f:
            json.dump(meta, f, indent=1)
        os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


class TeacherCache:
    """A cache directory (see the module docstring), checked against what the run reads: its ``index.json`` must
    name the same teacher (``teacher_sha256``), the same split (``ids_sha256``, ``tokens``) and at least ``top_k``
    logits a position.  :meth:`rows` reads the teacher's top-k for the labels of a segment."""

    def __init__(self, directory: str, *, teacher_sha256: str, ids_sha256: str, tokens: int, top_k: int) -> None:
        self.directory = os.path.abspath(os.path.expanduser(directory))
        self.index = read_index(self.directory)
        wanted = {"teacher_sha256": teacher_sha256, "ids_sha256": ids_sha256, "tokens": tokens}
        wrong = {key: value for key, value in wanted.items() if self.index.get(key) != value}
        if wrong:
            names = {"teacher_sha256": "teacher", "ids_sha256": "training split", "tokens": "number of tokens"}
            raise TeacherCacheError(
                f"{self.directory} was made from another {', '.join(names[k] for k in wrong)} than this run's: "
                "make the cache again (longseq distill-cache) or point task.cache elsewhere"
            )
        if self.index["top_k"] < top_k:
            raise TeacherCacheError(
                f"{self.directory} holds the teacher's top {self.index['top_k']} logits, the run asks for top_k={top_k}"
            )
        self.top_k = top_k
        self.file = safe_open(os.path.join(self.directory, FILE), "np")

    def rows(self, first: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The teacher's ids and logits (R, length, top_k) for the labels of a segment whose rows start at ``first``
        (R,): positions first + 1 .. first + length."""
        ids, logits = self.file.get_slice("ids"), self.file.get_slice("logits")
        parts = [(ids[a + 1 : a + 1 + length], logits[a + 1 : a + 1 + length]) for a in first.tolist()]
        top_ids = torch.from_numpy(np.stack([p[0][:, : self.top_k] for p in parts]).astype(np.int64))
        top_logits = torch.from_numpy(np.stack([p[1][:, : self.top_k] for p in parts]))
        return top_ids, top_logits


def read_index(directory: str) -> dict:
    path = os.path.join(directory, INDEX)
    try:
        with open(path, encoding="utf-8") as f:
            index = json.load(f)
    except (OSError, json.JSONDecodeError) as exc:
        raise TeacherCacheError(f"{directory} is not a teacher cache ({path}: {exc})") from None
    if index.get("format") != FORMAT or not os.path.isfile(os.path.join(directory, FILE)):
        raise TeacherCacheError(f"{directory} is not a teacher cache of format {FORMAT} with its {FILE}")
    return index
