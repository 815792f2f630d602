"""Run transformers 4.x's own TransfoXL on current PyTorch: ``apply()``, once, before its first forward.

transformers 4.35-4.46 build the relative positions with ``torch.arange(...).type_as(dtype=word_emb.dtype)``
(``TransfoXLModel.forward``); ``Tensor.type_as`` takes a tensor, not ``dtype=``, and current torch raises
``TypeError: type_as() missing 1 required positional arguments: "other"`` on the first forward.  :func:`apply` wraps
``TransfoXLModel.forward`` so that, while it runs, ``type_as(dtype=...)`` means ``.to(dtype)``; outside it torch is
untouched.  Use it for directories written by ``longseq convert --to-hf --format transfo-xl``::

    from longseq.interop.transfo_xl_compat import apply
    apply()
    model = TransfoXLLMHeadModel.from_pretrained("hf-dir")

TransfoXL was deprecated in transformers 4.36 and deleted in 5.0; with transformers 5, use ``import longseq.hf``
and ``AutoModelForCausalLM`` instead (docs/transformers.md).  Not thread-safe: another thread calling
``Tensor.type_as`` during a TransfoXL forward sees the tolerant version.
"""

from __future__ import annotations

import functools

import torch

_PATCHED = "_longseq_type_as_compat"


def transfo_xl_module():
    """transformers' TransfoXL modeling module, or an ImportError that says what to use instead."""
    try:
        from transformers.models.deprecated.transfo_xl import modeling_transfo_xl
    except ImportError:
        import transformers

        raise ImportError(
            f"transformers {transformers.__version__} has no TransfoXL (deleted in transformers 5); load longseq "
            "models with `import longseq.hf` and AutoModelForCausalLM, or install transformers==4.46.3 for the "
            "old TransfoXL format"
        ) from None
    return modeling_transfo_xl


def _type_as(original):
    def type_as(self, other=None, dtype=None):
        return self.to(dtype) if other is None and dtype is not None else original(self, other)

    return type_as


def apply() -> bool:
    """Make ``TransfoXLModel.forward`` run on current torch; True if it was patched now, False if already."""
    model_class = transfo_xl_module().TransfoXLModel
    if getattr(model_class.forward, _PATCHED, False):
        return False
    original_forward = model_class.forward

    @functools.wraps(original_forward)
    def forward(self, *args, **kwargs):
        original = torch.Tensor.type_as
        torch.Tensor.type_as = _type_as(original)
        try:
            return original_forward(self, *args, **kwargs)
        finally:
            torch.Tensor.type_as = original

    setattr(forward, _PATCHED, True)
    model_class.forward = forward
    return True
