"""``python -m longseq.lm_eval``: the ``lm_eval`` command with the ``longseq`` model registered (same flags)::

    python -m longseq.lm_eval --model longseq --model_args checkpoint=DIR --tasks wikitext --include_path TASKS/

The model lives in :mod:`longseq.integrations.harness` (``pip install "longseq[lm-eval]"``).
"""

if __name__ == "__main__":
    from longseq.integrations.harness import main

    main()
