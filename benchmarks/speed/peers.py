"""The Hugging Face TransfoXL peer for side-by-side benchmarks (needs ``transformers==4.46.3``).

transformers 4.46.3 fails on current torch at ``pos_seq.type_as(dtype=...)``; :func:`shim_hf` applies the package's
fix (:mod:`longseq.interop.transfo_xl_compat`: ``type_as(dtype=)`` accepted while HF's forward runs).  The peer is built with the same
configuration and the same weights as the longseq model, converted with ``longseq.interop``.
"""

from __future__ import annotations

import warnings

import torch

from longseq import ModelConfig, TransformerXLLM
from longseq.interop.transfo_xl import hf_config_from_model, state_dict_to_hf
from longseq.interop.transfo_xl_compat import apply as apply_compat

_shimmed = False


def shim_hf() -> None:
    global _shimmed
    if _shimmed:
        return
    apply_compat()
    warnings.filterwarnings("ignore", module="transformers")
    warnings.filterwarnings("ignore", message="The output of TransfoXL")
    _shimmed = True


def hf_twin(model: TransformerXLLM):
    """An HF ``TransfoXLLMHeadModel`` holding the same weights as ``model``."""
    shim_hf()
    from transformers import TransfoXLConfig, TransfoXLLMHeadModel

    config = {k: v for k, v in hf_config_from_model(model.config).items() if k not in ("model_type", "architectures")}
    twin = TransfoXLLMHeadModel(TransfoXLConfig(**config))
    missing, unexpected = twin.load_state_dict(state_dict_to_hf(model), strict=False)
    assert not unexpected, unexpected
    return twin


def byte_model(
    n_layer=4, d_model=256, n_head=8, d_head=32, d_inner=1024, mem_len=128, dropout=0.1, **extra
) -> TransformerXLLM:
    """The issue's benchmark model: byte vocabulary, plain softmax."""
    torch.manual_seed(0)
    config = ModelConfig(
        vocab_size=256, n_layer=n_layer, d_model=d_model, n_head=n_head, d_head=d_head, d_inner=d_inner,
        dropout=dropout, dropatt=0.0, mem_len=mem_len, **extra,
    )  # fmt: skip
    return TransformerXLLM(config)
