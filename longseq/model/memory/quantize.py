"""8-bit memory storage: symmetric int8 with a float scale per position (row) or per channel, dequantized when a
layer reads it (``ModelConfig.memory.mem_quant="int8"``, ``mem_quant_axis``)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class Quantized:
    """An int8 tensor with a float scale per row (last axis reduced) or per channel (time axis reduced)."""

    values: Tensor  # int8 (B, M, E)
    scale: Tensor  # (B, M, 1) per row, (B, 1, E) per channel

    def dequantize(self, dtype: torch.dtype = torch.float32) -> Tensor:
        return self.values.to(dtype) * self.scale.to(dtype)

    @property
    def nbytes(self) -> int:
        return self.values.numel() * self.values.element_size() + self.scale.numel() * self.scale.element_size()

    @property
    def shape(self) -> torch.Size:
        return self.values.shape

    def size(self, dim: int) -> int:
        return self.values.size(dim)


def quantize(x: Tensor, axis: str = "row") -> Quantized:
    """Symmetric int8 quantization of (B, M, E) with one scale per position (``row``) or per channel."""
    reduce = -1 if axis == "row" else 1
    scale = x.detach().abs().amax(dim=reduce, keepdim=True).clamp(min=1e-12) / 127.0
    values = torch.round(x.detach() / scale).clamp(-127, 127).to(torch.int8)
    return Quantized(values, scale.to(torch.float16 if x.dtype == torch.float16 else torch.float32))


def dense(x: Tensor | Quantized, dtype: torch.dtype) -> Tensor:
    """``x`` as floats: dequantized when stored in 8 bits, else as it is."""
    return x.dequantize(dtype) if isinstance(x, Quantized) else x


class Int8Storage:
    """The storage codec of an 8-bit memory: quantize on write, dequantize on read."""

    def __init__(self, axis: str) -> None:
        self.axis = axis

    def encode(self, x: Tensor) -> Quantized:
        return quantize(x, self.axis)

    def decode(self, x: Tensor | Quantized, dtype: torch.dtype) -> Tensor:
        return dense(x, dtype)


class FloatStorage:
    """The default codec: the memory is kept as it is."""

    def encode(self, x: Tensor) -> Tensor:
        return x

    def decode(self, x: Tensor | Quantized, dtype: torch.dtype) -> Tensor:
        return dense(x, dtype)


def split_rows(x: Tensor | Quantized | None, chunks: int) -> list:
    if x is None:
        return [None] * chunks
    if isinstance(x, Quantized):
        return [Quantized(v, s) for v, s in zip(x.values.chunk(chunks, 0), x.scale.chunk(chunks, 0))]
    return list(x.chunk(chunks, 0))


def join_rows(parts: list):
    if parts[0] is None:
        return None
    if isinstance(parts[0], Quantized):
        return Quantized(torch.cat([p.values for p in parts]), torch.cat([p.scale for p in parts]))
    return torch.cat(parts)
