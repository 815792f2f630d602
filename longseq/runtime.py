"""Process-wide settings longseq chooses when it is imported: glibc's allocator keeps the memory it frees.

Why.  A training step of a long segment allocates tensors of tens to hundreds of MiB (a 16k-token step of the
benchmark model: feed-forward activations of 64 MiB, the window kernel's scores of 168 MiB per layer) and frees
them before the next step.  glibc serves every request above its mmap threshold (at most 32 MiB on 64-bit
systems, whatever ``M_MMAP_THRESHOLD`` says) with a fresh ``mmap`` and returns it with ``munmap`` when it is freed, so
each step faults every page of those tensors in again: the kernel zeroes 4 KiB at a time, in system time.
Measured on the benchmark model with ``window`` (256) at 16k tokens: about 100 minor page faults and 200-400 us of
system time per token, none after the first step once freed memory is kept; at 2k tokens the tensors stay under
the threshold and the heap already reuses them.  That is what made local patterns grow 1.5-2x in time per token
from 2k to 16k tokens (BENCHMARKS.md).

What.  ``M_MMAP_MAX = 0`` serves large blocks from the heap, where freed memory is reused by the next step;
``M_TRIM_THRESHOLD = -1`` (documented in mallopt(3): no trimming) stops glibc from handing the top of the heap back after each step.  The cost: the
process keeps its peak heap for its lifetime, which is what a training or evaluation loop needs again at its next
step anyway.  Reusing buffers inside the kernels would fix only the tensors we allocate, not autograd's or the
optimizer's; preallocating needs the lengths in advance.  Choosing the allocator's behaviour once covers them all.

Where.  glibc only (Linux): elsewhere (macOS, musl, Windows) the call is a no-op.  Set ``LONGSEQ_MALLOC=system`` in
the environment to keep glibc's defaults.  PyTorch's CUDA memory has its own caching allocator and is unaffected.
"""

from __future__ import annotations

import ctypes
import os
import platform

M_TRIM_THRESHOLD = -1  # <malloc.h>
M_MMAP_MAX = -4

_state = {"allocator": "system"}


def keep_freed_memory() -> bool:
    """Make glibc keep freed memory for reuse (see the module docstring).  Returns True when the settings took
    effect; False on other C libraries, or when ``LONGSEQ_MALLOC=system`` asks for the defaults."""
    if os.environ.get("LONGSEQ_MALLOC", "").lower() == "system" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(None)
        done = libc.mallopt(M_MMAP_MAX, 0) == 1 and libc.mallopt(M_TRIM_THRESHOLD, -1) == 1
    except (OSError, AttributeError):
        return False
    if done:
        _state["allocator"] = "glibc, freed memory kept (M_MMAP_MAX=0, M_TRIM_THRESHOLD=-1)"
    return done


def allocator() -> str:
    """How this process's host allocator is set, in words (benchmarks print it beside their figures)."""
    return _state["allocator"]


MATMUL_PRECISIONS = ("highest", "high", "medium")


def set_matmul_precision(device, precision: str = "high") -> None:
    """On CUDA, let float32 matrix multiplies use TensorFloat-32 (``high``, PyTorch's name; ``highest``: full
    float32; ``medium``: bfloat16 too), as every training recipe on Ampere and later GPUs does: 8-10x the matmul
    throughput at a 10-bit mantissa, inside the accumulations of a model trained in float32 anyway.  On the CPU
    nothing changes (the setting also picks bfloat16 kernels there, which a 2-core CPU without AVX-512 BF16 runs
    slower)."""
    import torch

    if str(device).startswith("cuda"):
        torch.set_float32_matmul_precision(precision)
