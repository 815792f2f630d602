"""Evaluation metrics."""

from longseq.eval.evaluate import evaluate

__all__ = ["evaluate"]
