"""Evaluation metrics."""

from longseq.eval.context import context_curve, per_position_losses
from longseq.eval.evaluate import evaluate, segment_losses
from longseq.eval.recl import recl, relative_gain

__all__ = ["context_curve", "evaluate", "per_position_losses", "recl", "relative_gain", "segment_losses"]
