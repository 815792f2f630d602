"""Bridges to other tools' interfaces (optional extras, imported only when asked for).

``harness``: the ``longseq`` model of the LM evaluation harness (``pip install "longseq[lm-eval]"``); run it with
``python -m longseq.lm_eval --model longseq --model_args checkpoint=DIR --tasks ...``;
``transformers``: longseq's classes for transformers 5 (``pip install "longseq[hf]"``), imported as ``import longseq.hf``.
"""
