"""GGUF files (llama.cpp's format) of Llama-family models, read through transformers' own GGUF loader.

transformers (with the ``gguf`` package: ``pip install 'longseq[pretrained]'``) reads the file's metadata as the
family's config and dequantizes its tensors to float32, undoing llama.cpp's permutation of the query and key rows
(llama.cpp's rope pairs channels 2k and 2k+1; transformers' and longseq's pair k and k + D/2); the tensors then
map as a transformers folder's do (:mod:`longseq.interop.llama`).  Refused by name before any tensor is
dequantized: a quantization the ``gguf`` package cannot dequantize (its ``dequantize`` has no entry for it), an
architecture transformers' loader or longseq lacks, and what :mod:`longseq.interop.llama` refuses.
"""

from __future__ import annotations

import os

import torch

from longseq.interop.llama import model_config, transformers_config
from longseq.interop.transfo_xl import ConversionError
from longseq.model import TransformerXLLM


def gguf_modules():
    """``gguf`` and transformers' GGUF loader, or a :class:`ConversionError` naming the extra to install."""
    try:
        import gguf
        from transformers import modeling_gguf_pytorch_utils
    except ImportError as exc:
        raise ConversionError(
            f"reading a GGUF file needs transformers and gguf ({exc}): pip install 'longseq[pretrained]'"
        ) from None
    return gguf, modeling_gguf_pytorch_utils


def refuse_quantizations(path: str) -> None:
    """Every tensor of the GGUF file ``path`` is of a type the ``gguf`` package dequantizes (F32, F16 and its
    quantization classes), else a :class:`ConversionError` naming the types and a tensor of each."""
    gguf, _ = gguf_modules()
    from gguf.quants import _type_traits

    readable = {gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16, *_type_traits}
    try:
        reader = gguf.GGUFReader(path)
    except (OSError, ValueError) as exc:
        raise ConversionError(f"cannot read {path} as GGUF: {exc}") from None
    other = {}
    for tensor in reader.tensors:
        if tensor.tensor_type not in readable:
            other.setdefault(tensor.tensor_type.name, tensor.name)
    if other:
        listed = ", ".join(f"{kind} ({name}, ...)" for kind, name in sorted(other.items()))
        raise ConversionError(f"{path} holds tensors of {listed}: a quantization the gguf package cannot dequantize")


def gguf_config(path: str) -> dict:
    """The transformers config (a dict) transformers' loader reads from the GGUF metadata of ``path``."""
    _, loader = gguf_modules()
    try:
        return loader.load_gguf_checkpoint(path, return_tensors=False)["config"]
    except (ValueError, KeyError, NotImplementedError) as exc:  # an architecture its loader lacks, ...
        raise ConversionError(f"{path}: transformers' GGUF loader cannot read it: {exc}") from None


def read_gguf_weights(path: str, hf) -> dict[str, torch.Tensor]:
    """The tensors of ``path`` under transformers' names, dequantized to float32 (q and k rows unpermuted)."""
    _, loader = gguf_modules()
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):  # only the names: no memory for weights
        names = AutoModelForCausalLM.from_config(hf)
    return loader.load_gguf_checkpoint(path, return_tensors=True, model_to_load=names, torch_dtype=torch.float32)[
        "tensors"
    ]


def load_gguf(path: str) -> tuple[TransformerXLLM, int, dict]:
    """The longseq model of a GGUF file (eval mode, float32), its segment length (tgt_len) and its transformers
    config as a dict; what longseq or the gguf package lacks is refused by name before a tensor is dequantized."""
    from longseq.interop.llama import build_from_hf

    if not os.path.isfile(path):
        raise ConversionError(f"{path} is not a file")
    refuse_quantizations(path)
    raw = gguf_config(path)
    hf = transformers_config(raw, path)
    config, tgt_len = model_config(hf, path)
    return build_from_hf(config, read_gguf_weights(path, hf), path), tgt_len, hf.to_dict()
