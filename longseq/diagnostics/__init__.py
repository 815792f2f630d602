"""Model diagnostics: attention maps, entropy, attention by distance, gradient norms, memory statistics, plots."""

from longseq.diagnostics.plots import plot_runs
from longseq.diagnostics.report import (
    attention_layers,
    attention_maps,
    diagnose,
    memory_attention_share,
    summarize_attention,
)

__all__ = [
    "attention_layers",
    "attention_maps",
    "diagnose",
    "memory_attention_share",
    "plot_runs",
    "summarize_attention",
]
