"""Counting host synchronisations: the operations that make the CPU wait for the device.

On a GPU, reading a value of a tensor on the host (``.item()``, ``int(t)``, ``bool(t)``, ``.tolist()``), an output
whose size depends on the data (``nonzero``, boolean indexing, ``masked_select``, ``unique``, ``repeat_interleave``
of a tensor) or a copy to the host stalls the CPU until the GPU has drained its queue.  :class:`HostSyncs` counts
them anywhere, the CPU included, so that a test on a machine without a GPU can hold a forward pass to zero::

    with HostSyncs() as syncs:
        model(input_ids, labels=labels).loss.backward()
    assert syncs.count == 0, syncs.where

The operators are seen through PyTorch's dispatcher (``TorchDispatchMode``); ``Tensor.tolist``, ``.numpy`` and
``.cpu``, which do not always pass through it on the CPU, are counted by wrapping them for the duration.
"""

from __future__ import annotations

import traceback

import torch
from torch.utils._python_dispatch import TorchDispatchMode

SYNCING = (  # torch.unique dispatches to _unique2 (unique_dim with dim=)
    "_local_scalar_dense", "nonzero", "masked_select", "unique", "_unique", "_unique2", "unique_dim",
    "unique_consecutive", "is_nonzero", "equal",
)  # fmt: skip
HOST_METHODS = ("tolist", "numpy", "cpu")


class HostSyncs(TorchDispatchMode):
    """Within ``with HostSyncs() as syncs``: ``syncs.count`` host synchronisations, ``syncs.where`` the operator
    and the innermost longseq frame of each."""

    def __init__(self) -> None:
        super().__init__()
        self.where: list[str] = []
        self._saved: dict = {}

    @property
    def count(self) -> int:
        return len(self.where)

    def _note(self, what: str) -> None:
        frames = [
            f for f in traceback.extract_stack()[:-2] if "/longseq/" in f.filename and "syncs.py" not in f.filename
        ]
        place = f"{frames[-1].filename.split('/longseq/')[-1]}:{frames[-1].lineno}" if frames else "?"
        self.where.append(f"{what} at {place}")

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        if name in SYNCING or (
            name == "repeat_interleave" and "output_size" not in kwargs and isinstance(args[0], torch.Tensor)
        ):
            self._note(name)
        elif name == "index" and any(i is not None and i.dtype in (torch.bool, torch.uint8) for i in args[1]):
            self._note("boolean indexing")
        return func(*args, **kwargs)

    def __enter__(self):
        for method in HOST_METHODS:
            original = getattr(torch.Tensor, method)
            self._saved[method] = original

            def counted(tensor, *args, _original=original, _method=method, **kwargs):
                self._note(f"Tensor.{_method}")
                return _original(tensor, *args, **kwargs)

            setattr(torch.Tensor, method, counted)
        return super().__enter__()

    def __exit__(self, *exc):
        for method, original in self._saved.items():
            setattr(torch.Tensor, method, original)
        return super().__exit__(*exc)
