"""``import longseq.hf``: the public name of longseq's transformers 5 classes, which live in
:mod:`longseq.integrations.transformers`.  Importing it registers them with ``AutoConfig`` and
``AutoModelForCausalLM``; importing plain ``longseq`` never imports transformers."""

from longseq.integrations.transformers import LongseqCache, LongseqConfig, LongseqForCausalLM, from_longseq

__all__ = ["LongseqCache", "LongseqConfig", "LongseqForCausalLM", "from_longseq"]
