"""Task heads on the Transformer-XL backbone: long-document classification, masked LM, span extraction.

A document longer than one segment is read segment by segment with the memory carried, exactly as in language
modeling.  The memory is stop-gradient: the classifier trains the last segment's computation (every segment's with
the joint LM loss), the span heads every segment's.  Heads are small modules over the backbone's hidden states.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from longseq.model.transformer import TransformerXLLM

POOLING = ("last", "mean")


class DocumentClassifier(nn.Module):
    """Classify a (B, N) document from the summary of its final segment: the last position (a summary token) or
    the mean over the final segment (``pooling``).  ``lm`` is a :class:`TransformerXLLM` (e.g. loaded from an LM
    checkpoint); its softmax serves the optional joint LM loss."""

    def __init__(self, lm: TransformerXLLM, n_classes: int, pooling: str = "last") -> None:
        super().__init__()
        if pooling not in POOLING:
            raise ValueError(f"pooling must be one of {POOLING}, got {pooling!r}")
        if n_classes < 2:
            raise ValueError(f"a classifier needs at least 2 classes, got {n_classes}")
        self.lm = lm
        self.config = lm.config  # the backbone's, for optimizers and layer-wise learning-rate decay
        self.pooling = pooling
        self.classifier = nn.Linear(lm.config.d_model, n_classes)

    def forward(
        self, input_ids: Tensor, segment_len: int, labels: Tensor | None = None, lm_weight: float = 0.0
    ) -> dict[str, Tensor]:
        """``input_ids`` (B, N) read in segments of ``segment_len``; returns ``logits`` (B, C) and, with
        ``labels`` (B,), ``loss`` = task loss + ``lm_weight`` x the mean next-token loss over the document."""
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be (batch, length), got shape {tuple(input_ids.shape)}")
        segments = input_ids.split(segment_len, dim=1)
        mems, lm_losses = None, []
        for i, segment in enumerate(segments):
            final = i == len(segments) - 1
            with torch.set_grad_enabled(torch.is_grad_enabled() and (final or lm_weight > 0)):
                c = self.lm.config
                hidden, mems, _ = self.lm.transformer(segment, mems, c.mem_len, c.clamp_len, c.same_length)
                if lm_weight > 0 and segment.size(1) > 1:
                    flat = hidden[:, :-1].reshape(-1, hidden.size(-1))
                    lm_losses.append(self.lm.crit.nll(flat, segment[:, 1:].reshape(-1)).mean())
        summary = hidden[:, -1] if self.pooling == "last" else hidden.mean(dim=1)  # (B, E)
        out = {"logits": self.classifier(summary)}
        if labels is not None:
            loss = F.cross_entropy(out["logits"], labels)
            if lm_losses:
                loss = loss + lm_weight * torch.stack(lm_losses).mean()
            out["loss"] = loss
        return out


class SpanExtractor(nn.Module):
    """Start and end heads for extractive question answering over a long (B, N) input, read segment by segment
    with the memory carried: the question comes first, and the answer may lie many segments after it, reached
    only through the memory.  Every segment's forward is trained (its own positions' start and end scores); the
    memory between segments is stop-gradient, as in language modeling."""

    def __init__(self, lm: TransformerXLLM) -> None:
        super().__init__()
        self.lm = lm
        self.config = lm.config
        self.qa = nn.Linear(lm.config.d_model, 2)  # start and end scores

    def forward(
        self,
        input_ids: Tensor,
        segment_len: int,
        allowed: Tensor | None = None,
        starts: Tensor | None = None,
        ends: Tensor | None = None,
    ) -> dict[str, Tensor]:
        """``input_ids`` (B, N) read in segments of ``segment_len``; ``allowed`` (B, N) marks the positions an
        answer may start or end at (the context, not the question or padding).  Returns ``start_logits`` and
        ``end_logits`` (B, N), -inf where not allowed, and with ``starts``/``ends`` (B,) token positions (inclusive)
        ``loss``, the mean of the start and end cross-entropies."""
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be (batch, length), got shape {tuple(input_ids.shape)}")
        if allowed is not None and allowed.shape != input_ids.shape:
            raise ValueError(
                f"allowed must have the shape of input_ids {tuple(input_ids.shape)}, got {tuple(allowed.shape)}"
            )
        c, mems, hidden = self.lm.config, None, []
        for segment in input_ids.split(segment_len, dim=1):
            out, mems, _ = self.lm.transformer(segment, mems, c.mem_len, c.clamp_len, c.same_length)
            hidden.append(out)
        logits = self.qa(torch.cat(hidden, dim=1)).float()  # (B, N, 2)
        if allowed is not None:
            logits = logits.masked_fill(~allowed.unsqueeze(-1), float("-inf"))
        out = {"start_logits": logits[..., 0], "end_logits": logits[..., 1]}
        if starts is not None and ends is not None:
            out["loss"] = (F.cross_entropy(out["start_logits"], starts) + F.cross_entropy(out["end_logits"], ends)) / 2
        return out


def best_spans(start_logits: Tensor, end_logits: Tensor, max_len: int) -> Tensor:
    """The (start, end) of highest start + end score with start <= end < start + ``max_len``, per row: (B, 2)."""
    n = start_logits.size(-1)
    scores = start_logits.unsqueeze(-1) + end_logits.unsqueeze(-2)  # (B, N start, N end)
    offset = torch.arange(n).unsqueeze(0) - torch.arange(n).unsqueeze(1)  # end - start
    scores = scores.masked_fill((offset < 0) | (offset >= max_len), float("-inf"))
    best = scores.flatten(1).argmax(-1)
    return torch.stack([best // n, best % n], dim=-1)


def mask_tokens(
    input_ids: Tensor, rate: float, mask_id: int, vocab_size: int, generator: torch.Generator | None = None
) -> tuple[Tensor, Tensor]:
    """BERT masking: choose ``rate`` of the positions; of those, 80% become ``mask_id``, 10% a random token and
    10% stay.  Returns (inputs, labels) with labels -100 at unchosen positions."""
    if not 0.0 < rate < 1.0:
        raise ValueError(f"masking rate must be in (0, 1), got {rate}")
    draw = torch.rand(input_ids.shape, generator=generator)
    chosen = draw < rate
    labels = torch.where(chosen, input_ids, torch.full_like(input_ids, -100))
    action = torch.rand(input_ids.shape, generator=generator)
    inputs = input_ids.clone()
    inputs[chosen & (action < 0.8)] = mask_id
    randomize = chosen & (action >= 0.8) & (action < 0.9)
    inputs[randomize] = torch.randint(0, vocab_size, (int(randomize.sum()),), generator=generator)
    return inputs, labels
