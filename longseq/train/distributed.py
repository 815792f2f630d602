"""Data-parallel training under ``torchrun`` (PyTorch DDP): gloo on CPU, NCCL on GPU.

Every rank reads the same ordered stream of ``batch_size`` parallel rows and keeps its own contiguous slice of
rows (and of the memory), so the recurrence of each row is exactly what one process would compute.  Gradients
are averaged by DDP; losses are averaged across ranks for logging and for the NaN guard; rank 0 alone writes
checkpoints and logs, after gathering the memory of every rank.

    torchrun --nproc_per_node 2 -m longseq train --set batch_size=16 ...

With ``parallel=fsdp`` the weights, gradients and optimizer moments are sharded across ranks instead of copied
(FSDP2, ``torch.distributed.fsdp.fully_shard``: one unit per decoder layer, the embeddings, softmax and u, v in
the root unit).  The rows and the memory are split exactly as under DDP.  Checkpoints hold full tensors in the
same files as a one-process run, so either can resume or read the other's.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.tensor import DTensor, distribute_tensor

from longseq.config import ConfigError
from longseq.model.memory import Memory
from longseq.model.spec import ModelSpec


@dataclass(frozen=True)
class World:
    """This process's place in the run: ``rank`` of ``size`` (1 without torchrun), and the ``device`` its
    collectives exchange tensors on: the model's (NCCL moves CUDA tensors only; gloo, CPU ones)."""

    rank: int = 0
    size: int = 1
    device: torch.device = torch.device("cpu")

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
        buffer = torch.tensor([value], dtype=torch.float64, device=self.device)
        dist.all_reduce(buffer)
        return float(buffer) / self.size

    def means(self, *values) -> list[float]:
        """The means over ranks of ``values`` (0-d tensors on any device, or numbers), read from the device at once:
        one host synchronisation, one collective.  (A gradient norm is the same on every rank: its mean is it.)"""
        stacked = torch.stack([torch.as_tensor(v).detach().to(self.device, torch.float64) for v in values])
        if self.size > 1:
            dist.all_reduce(stacked)
            stacked /= self.size
        return stacked.tolist()

    def any(self, flag: bool) -> bool:
        """True on every rank when ``flag`` is true on some rank (a decision every rank must take alike)."""
        if self.size == 1:
            return flag
        buffer = torch.tensor([float(flag)], device=self.device)
        dist.all_reduce(buffer, op=dist.ReduceOp.MAX)
        return bool(buffer.item())

    def gather_memory(self, mems):
        """Every rank's memory joined in rank order (all ranks must call it); None stays None."""
        if self.size == 1 or mems is None:
            return mems
        tensors = mems.to_tensors()  # on the CPU, for the checkpoint
        gathered = [{} for _ in range(self.size)]
        for name in sorted(tensors):
            local = tensors[name].to(self.device).contiguous()
            parts = [torch.empty_like(local) for _ in range(self.size)]
            dist.all_gather(parts, local)
            for rank, part in enumerate(parts):
                gathered[rank][name] = part
        restored = [Memory.from_tensors(parts, tokens_age=mems.tokens_age) for parts in gathered]
        return Memory.join(restored)

    def gather_rngs(self, cpu: Tensor, cuda: list | None) -> list[tuple[Tensor, list | None]]:
        """The RNG states (CPU, and CUDA's per device) of ranks 1 .. size - 1, on every rank (all ranks call it):
        each rank draws its own dropout, so each resumes from its own state."""
        if self.size == 1:
            return []
        parts = [cpu, *(cuda or [])]
        gathered = []
        for state in parts:
            local = state.to(self.device)
            copies = [torch.empty_like(local) for _ in range(self.size)]
            dist.all_gather(copies, local)
            gathered.append([c.cpu() for c in copies])
        return [(gathered[0][r], [g[r] for g in gathered[1:]] or None) for r in range(1, self.size)]

    def local_memory(self, mems):
        """This rank's rows of a full memory (read from a checkpoint)."""
        if self.size == 1 or mems is None:
            return mems
        return mems.split(self.size)[self.rank]

    def barrier(self) -> None:
        if self.size > 1:
            dist.barrier()


def init_world() -> World:
    """Join the process group that ``torchrun`` describes in the environment (WORLD_SIZE, RANK, ...)."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size <= 1:
        return World()
    device = torch.device("cpu")
    if torch.cuda.is_available():  # NCCL, one GPU per rank: this rank's, made current before the group forms
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        if device.type == "cuda":
            dist.init_process_group("nccl", device_id=device)
        else:
            dist.init_process_group("gloo")
    return World(dist.get_rank(), dist.get_world_size(), device)


def shard_model(model, spec: ModelSpec) -> None:
    """Shard ``model`` in place with FSDP2, one unit per module of its architecture's ``spec.fsdp_units`` (each
    layer of the stack, then the language model), and ``model`` itself last when it holds the language model (a
    task's head is the root unit's)."""
    from torch.distributed.fsdp import fully_shard

    if spec.fsdp_units is None:
        raise ConfigError(f"parallel=fsdp: the {spec.build.__name__} architecture cannot be sharded; use parallel=ddp")
    units = spec.fsdp_units(model)
    for unit in units:
        fully_shard(unit)
    if units[-1] is not model:
        fully_shard(model)


def full_tensor(tensor: Tensor) -> Tensor:
    """The whole of a sharded tensor (a collective: every rank must call it in the same order); others as they are."""
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def full_state_dict(model, keep: bool = True) -> dict[str, Tensor]:
    """The model's weights as whole CPU tensors (every rank must call it), a tied weight once, under its
    alphabetically first name (as safetensors' ``save_model`` writes it).  With ``keep=False`` (the ranks that
    do not write) each gathered tensor is dropped at once and {} returned."""
    weights, seen = model.state_dict(keep_vars=True), set()
    out = {}
    for name in sorted(weights):
        if id(weights[name]) in seen:
            continue
        seen.add(id(weights[name]))
        whole = full_tensor(weights[name].detach())
        if keep:
            out[name] = whole.cpu().contiguous()
    return out


def load_full_state_dict(model, tensors: dict[str, Tensor]) -> None:
    """Load whole tensors (as :func:`full_state_dict` gives: a tied weight under any one of its names) into a
    sharded ``model``: each rank keeps its own shard."""
    targets = model.state_dict(keep_vars=True)
    names_of: dict[int, list[str]] = {}
    for name, value in targets.items():
        names_of.setdefault(id(value), []).append(name)
    sharded = {}
    for names in names_of.values():
        found = [tensors[n] for n in names if n in tensors]
        if not found:
            raise KeyError(f"the weights have no tensor for {names[0]}")
        target = targets[names[0]]
        value = found[0].to(device=target.device, dtype=target.dtype)
        if isinstance(target, DTensor):
            value = distribute_tensor(value, target.device_mesh, target.placements)
        sharded.update(dict.fromkeys(names, value))
    model.load_state_dict(sharded)


def full_optimizer_state(optimizer, keep: bool = True) -> dict:
    """``optimizer.state_dict()`` with whole moments (every rank must call it): the one-process format.  With
    ``keep=False`` the moments are gathered (the collective) but not kept, and {} is returned."""
    state = optimizer.state_dict()  # its per-parameter dicts are the live ones: build new ones
    full = {}
    for index in sorted(state["state"]):
        slots = state["state"][index]
        whole = {k: full_tensor(v).cpu() if isinstance(v, Tensor) else v for k, v in sorted(slots.items())}
        if keep:
            full[index] = whole
    return {"state": full, "param_groups": state["param_groups"]} if keep else {}


def shard_optimizer_state(optimizer, state: dict) -> dict:
    """A one-process optimizer state (whole moments) cut to this rank's shards of ``optimizer``'s parameters."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    out = {"param_groups": state["param_groups"], "state": {}}
    for index, slots in state["state"].items():
        param = params[int(index)]
        out["state"][index] = {
            key: distribute_tensor(value.to(param.device), param.device_mesh, param.placements)
            if isinstance(param, DTensor) and isinstance(value, Tensor) and value.shape == param.shape
            else value
            for key, value in slots.items()
        }
    return out


def resolve_device(name: str, world: World | None = None) -> torch.device:
    """The device ``name`` means (``auto``: CUDA when available); under torchrun a plain ``cuda`` is this rank's
    ``cuda:LOCAL_RANK``.  Asking for CUDA on a machine without it is a :class:`ConfigError`."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and world is not None and world.size > 1:
        name = f"cuda:{int(os.environ.get('LOCAL_RANK', world.rank))}"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device {name}, but this machine has no GPU that torch can use")
    return torch.device(name)
