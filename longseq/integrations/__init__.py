"""Bridges to other tools' interfaces (optional extras, imported only when asked for).

``lm_eval``: the ``longseq`` model of the LM evaluation harness (``pip install "longseq[lm-eval]"``); run it with
``python -m longseq.lm_eval --model longseq --model_args checkpoint=DIR --tasks ...``.
"""
