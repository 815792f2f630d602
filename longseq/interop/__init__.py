"""Conversion to and from other Transformer-XL implementations."""

from longseq.interop.hf import ConversionError, convert_from_hf, export_to_hf, load_hf

__all__ = ["ConversionError", "convert_from_hf", "export_to_hf", "load_hf"]
