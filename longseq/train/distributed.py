"""Data-parallel training under ``torchrun`` (PyTorch DDP): gloo on CPU, NCCL on GPU.

Every rank reads the same ordered stream of ``batch_size`` parallel rows and keeps its own contiguous slice of
rows (and of the memory), so the recurrence of each row is exactly what one process would compute.  Gradients
are averaged by DDP; losses are averaged across ranks for logging and for the NaN guard; rank 0 alone writes
checkpoints and logs, after gathering the memory of every rank.

    torchrun --nproc_per_node 2 -m longseq train --set batch_size=16 ...
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from longseq.model.memory import join_memory, memory_from_tensors, memory_to_tensors, split_memory


@dataclass(frozen=True)
class World:
    """This process's place in the run: ``rank`` of ``size`` (1 without torchrun)."""

    rank: int = 0
    size: int = 1

    @property
    def main(self) -> bool:
        return self.rank == 0

    def rows(self, batch: int) -> slice:
        """The slice of the ``batch`` parallel rows this rank owns."""
        per_rank = batch // self.size
        return slice(self.rank * per_rank, (self.rank + 1) * per_rank)

    def mean(self, value: float) -> float:
        """The mean of ``value`` over ranks (every rank gets it)."""
        if self.size == 1:
            return value
        buffer = torch.tensor([value], dtype=torch.float64)
        dist.all_reduce(buffer)
        return float(buffer) / self.size

    def gather_memory(self, mems):
        """Every rank's memory joined in rank order (all ranks must call it); None stays None."""
        if self.size == 1 or mems is None:
            return mems
        tensors = memory_to_tensors(mems)
        gathered = [{} for _ in range(self.size)]
        for name in sorted(tensors):
            parts = [torch.empty_like(tensors[name]) for _ in range(self.size)]
            dist.all_gather(parts, tensors[name].contiguous())
            for rank, part in enumerate(parts):
                gathered[rank][name] = part
        restored = [memory_from_tensors(parts) for parts in gathered]
        if hasattr(mems, "tokens_age"):  # a scalar of the state, the same on every rank
            restored = [type(m)(m.hidden, m.compressed, m.doc_ids, m.tokens, mems.tokens_age) for m in restored]
        return join_memory(restored)

    def local_memory(self, mems):
        """This rank's rows of a full memory (read from a checkpoint)."""
        if self.size == 1 or mems is None:
            return mems
        return split_memory(mems, self.size)[self.rank]

    def barrier(self) -> None:
        if self.size > 1:
            dist.barrier()


def init_world() -> World:
    """Join the process group that ``torchrun`` describes in the environment (WORLD_SIZE, RANK, ...)."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size <= 1:
        return World()
    if not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend)
    return World(dist.get_rank(), dist.get_world_size())
