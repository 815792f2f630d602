"""Conversion to and from other implementations, without importing transformers: HF TransfoXL checkpoints in and
out (:mod:`longseq.interop.transfo_xl`), the transformers format of any longseq model (:mod:`longseq.interop.hf_longseq`;
``import longseq.hf`` loads it), and the fix that runs transformers 4.x's TransfoXL on current torch
(:mod:`longseq.interop.transfo_xl_compat`)."""

from longseq.interop.hf_longseq import export_longseq_hf
from longseq.interop.transfo_xl import ConversionError, convert_from_hf, export_to_hf, load_hf

__all__ = ["ConversionError", "convert_from_hf", "export_longseq_hf", "export_to_hf", "load_hf"]
