"""Task heads on the Transformer-XL backbone: long-document classification, masked LM, span extraction.

A document longer than one segment is read segment by segment with the memory carried, exactly as in language
modeling.  The memory is stop-gradient by default: the classifier trains the last segment's computation (every
segment's with the joint LM loss), the span heads every segment's.  With ``mem_bptt`` = k > 1 (or another of
:attr:`~longseq.config.model.ModelConfig.segments_per_step`'s settings) the gradient flows through the memory
within blocks of k segments, counted back from the document's end: the classifier then trains its last k
segments.  Heads are small modules over the backbone's hidden states.

The backbone's auxiliary loss (the compressive memory's reconstruction loss, a dynamic hourglass's ratio or
entropy losses) joins every head's training loss as it joins the language model's: its mean over the segments that
keep their graph, weight 1 (:func:`mean_aux`).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from longseq.model.transformer import TransformerXLLM

POOLING = ("last", "mean", "document")  # a classifier's summary of a document: DocumentClassifier


class SegmentRead(NamedTuple):
    """What :func:`read_segments` yields for one segment."""

    index: int
    ids: Tensor  # (B, T)
    pad: Tensor | None  # (B, T) filler mask, or None
    hidden: Tensor  # (B, T, E) the last layer's hidden states
    aux: Tensor | None  # the backbone's auxiliary loss of the segment (memory, boundaries), or None


def mean_aux(losses: list[Tensor | None]) -> Tensor | float:
    """The mean of the segments' auxiliary losses (:attr:`SegmentRead.aux`) that have a graph (0.0 when none has
    one): what a head adds to its training loss, as language modeling adds each segment's.  A head keeps these,
    not the reads: a read holds its segment's hidden states."""
    kept = [aux for aux in losses if aux is not None and aux.requires_grad]
    return torch.stack(kept).mean() if kept else 0.0


def read_segments(lm: TransformerXLLM, input_ids: Tensor, segment_len: int, padding: Tensor | None = None, track=None):
    """Read a (B, N) document segment by segment with the memory carried, as in language modeling: yields a
    :class:`SegmentRead` (index, segment ids, filler mask, hidden states, auxiliary loss) for every segment.

    The one reader of every task head.  ``padding`` (B, N) marks filler: it is a document of its own, so no real
    token attends to it.  ``track(index, count)`` says whether a segment's computation keeps its graph (default:
    all).  The memory is cut (detached) before every block of ``lm.config.segments_per_step`` segments, the blocks
    counted back from the batch's last segment (a left-padded document's end; with right padding, the longest
    document's): stop-gradient between all segments by default."""
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be (batch, length), got shape {tuple(input_ids.shape)}")
    segments = input_ids.split(segment_len, dim=1)
    mems, block = None, lm.config.segments_per_step
    for i, (segment, pad) in enumerate(zip(segments, padding_segments(padding, input_ids, segment_len))):
        keep_graph = track is None or track(i, len(segments))
        if mems is not None and (len(segments) - i) % block == 0:
            mems = mems.detach()  # a new block: no gradient into the previous one
        with torch.set_grad_enabled(torch.is_grad_enabled() and keep_graph):
            hidden, mems, aux = lm.hidden_states(segment, mems, doc_ids=None if pad is None else pad.long())
        yield SegmentRead(i, segment, pad, hidden, aux)


class DocumentClassifier(nn.Module):
    """Classify a (B, N) document from a summary (``pooling``): the last position (a summary token), the mean over
    the final segment, or the mean over the whole ``document`` (every segment then trains, as with the joint LM
    loss; LRA's published small models pool so).  ``lm`` is a :class:`TransformerXLLM` (e.g. loaded from an LM
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
        self,
        input_ids: Tensor,
        segment_len: int,
        labels: Tensor | None = None,
        lm_weight: float = 0.0,
        padding: Tensor | None = None,
    ) -> dict[str, Tensor]:
        """``input_ids`` (B, N) read in segments of ``segment_len``; returns ``logits`` (B, C) and, with
        ``labels`` (B,), ``loss`` = task loss + ``lm_weight`` x the mean next-token loss over the document.
        ``padding`` (B, N) marks filler positions: no real token attends to them, and pooling and the LM loss
        leave them out.  The final ``config.segments_per_step`` segments train (one by default), every segment
        with the joint LM loss or document pooling."""
        lm_losses, block, every = [], self.config.segments_per_step, lm_weight > 0 or self.pooling == "document"
        total = count = 0
        auxes = []
        for read in read_segments(self.lm, input_ids, segment_len, padding, track=lambda i, n: i >= n - block or every):
            auxes.append(read.aux)
            segment, pad, hidden = read.ids, read.pad, read.hidden
            if lm_weight > 0 and segment.size(1) > 1:
                targets = segment[:, 1:] if pad is None else segment[:, 1:].masked_fill(pad[:, 1:], -100)
                nll = self.lm.head(hidden[:, :-1], targets).nll  # (B, T - 1), 0 at filler targets
                lm_losses.append(nll.sum() / (targets != -100).sum().clamp(min=1))  # a segment of filler adds 0
            if self.pooling == "document":
                part, n_real = real_sum(hidden, pad)
                total, count = total + part, count + n_real
        if self.pooling == "mean":  # the segment read last
            total, count = real_sum(hidden, pad)
        summary = hidden[:, -1] if self.pooling == "last" else total / count.clamp(min=1).to(total.dtype)  # (B, E)
        out = {"logits": self.classifier(summary)}
        if labels is not None:
            loss = F.cross_entropy(out["logits"], labels) + mean_aux(auxes)
            if lm_losses:
                loss = loss + lm_weight * torch.stack(lm_losses).mean()
            out["loss"] = loss
        return out


def real_sum(hidden: Tensor, pad: Tensor | None) -> tuple[Tensor, Tensor]:
    """The sum of a segment's hidden states (B, T, E) over its real positions, (B, E), and their count (B, 1) in
    float32 (exact); ``pad`` (B, T) marks filler, or None."""
    if pad is None:
        return hidden.sum(1), hidden.new_full((hidden.size(0), 1), hidden.size(1), dtype=torch.float32)
    return hidden.masked_fill(pad.unsqueeze(-1), 0).sum(1), (~pad).sum(1, keepdim=True, dtype=torch.float32)


def padding_segments(padding: Tensor | None, input_ids: Tensor, segment_len: int) -> list[Tensor | None]:
    """``padding`` (B, N) cut like the input into segments; None (no filler anywhere) for each segment when absent."""
    n_segments = -(-input_ids.size(1) // segment_len)
    if padding is None or not bool(padding.any()):
        return [None] * n_segments
    if padding.shape != input_ids.shape:
        raise ValueError(
            f"padding must have the shape of input_ids {tuple(input_ids.shape)}, got {tuple(padding.shape)}"
        )
    return list(padding.bool().split(segment_len, dim=1))


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
        padding: Tensor | None = None,
    ) -> dict[str, Tensor]:
        """``input_ids`` (B, N) read in segments of ``segment_len``; ``allowed`` (B, N) marks the positions an
        answer may start or end at (the context, not the question or padding).  Returns ``start_logits`` and
        ``end_logits`` (B, N), -inf where not allowed, and with ``starts``/``ends`` (B,) token positions (inclusive)
        ``loss``, the mean of the start and end cross-entropies.  ``padding`` (B, N) marks filler no real token
        may attend to (it matters for a bidirectional backbone)."""
        if allowed is not None and allowed.shape != input_ids.shape:
            raise ValueError(
                f"allowed must have the shape of input_ids {tuple(input_ids.shape)}, got {tuple(allowed.shape)}"
            )
        reads = list(read_segments(self.lm, input_ids, segment_len, padding))
        logits = self.qa(torch.cat([r.hidden for r in reads], dim=1)).float()  # (B, N, 2)
        if allowed is not None:
            logits = logits.masked_fill(~allowed.unsqueeze(-1), float("-inf"))
        out = {"start_logits": logits[..., 0], "end_logits": logits[..., 1]}
        if starts is not None and ends is not None:
            start, end = F.cross_entropy(out["start_logits"], starts), F.cross_entropy(out["end_logits"], ends)
            out["loss"] = (start + end) / 2 + mean_aux([r.aux for r in reads])
        return out


class MaskedLM(nn.Module):
    """Masked language modeling over a long (B, N) input read segment by segment: the LM's own softmax restores the
    masked tokens.  ``lm`` should be bidirectional (every segment token sees the later ones)."""

    def __init__(self, lm: TransformerXLLM) -> None:
        super().__init__()
        self.lm = lm
        self.config = lm.config

    def forward(
        self, input_ids: Tensor, segment_len: int, labels: Tensor | None = None, padding: Tensor | None = None
    ) -> dict[str, Tensor]:
        """With ``labels`` (B, N; -100 where not masked): ``nll`` (summed over the labelled tokens, float32),
        ``count``, ``correct`` (argmax hits), ``aux`` (:func:`mean_aux`: a training loss adds it to the mean nll)
        and, without gradients, ``predicted`` (B, N: the argmax at labelled positions, -100 elsewhere); without:
        ``logits`` (B, N, V)."""
        segment_labels = None if labels is None else labels.split(segment_len, dim=1)
        nll, correct, count, logits = input_ids.new_zeros((), dtype=torch.float32), 0, 0, []
        auxes, predicted = [], []
        for read in read_segments(self.lm, input_ids, segment_len, padding):
            i, hidden = read.index, read.hidden
            auxes.append(read.aux)
            if segment_labels is None:
                logits.append(self.lm.head(hidden).logits)
                continue
            y = segment_labels[i]
            nll = nll + self.lm.head(hidden, y).nll.float().sum()
            keep = y != -100
            if not torch.is_grad_enabled():
                guess = torch.full_like(y, -100)
                if keep.any():
                    guess[keep] = self.lm.head(hidden).logits[keep].argmax(-1)
                    correct += int((guess[keep] == y[keep]).sum())
                predicted.append(guess)
            count += int(keep.sum())
        if segment_labels is None:
            return {"logits": torch.cat(logits, dim=1)}
        aux = mean_aux(auxes)
        out = {"nll": nll, "count": torch.tensor(count), "correct": torch.tensor(correct), "aux": aux}
        return out if not predicted else {**out, "predicted": torch.cat(predicted, dim=1)}


def best_spans(start_logits: Tensor, end_logits: Tensor, max_len: int) -> Tensor:
    """The (start, end) of highest start + end score with start <= end < start + ``max_len``, per row: (B, 2).
    Only the ``max_len`` diagonals are scored (memory B x N x max_len at most, not B x N x N)."""
    if max_len < 1:
        raise ValueError(f"max_len must be >= 1, got {max_len}")
    n = start_logits.size(-1)
    best = start_logits.new_full(start_logits.shape[:-1], float("-inf"))
    spans = torch.zeros(*start_logits.shape[:-1], 2, dtype=torch.long, device=start_logits.device)
    for length in range(min(max_len, n)):  # end = start + length
        scores = start_logits[..., : n - length] + end_logits[..., length:]  # (B, N - length)
        value, start = scores.max(dim=-1)
        better = value > best
        best = torch.where(better, value, best)
        spans[better] = torch.stack([start, start + length], dim=-1)[better]
    return spans


def mask_tokens(
    input_ids: Tensor,
    rate: float,
    mask_id: int,
    vocab_size: int,
    generator: torch.Generator | None = None,
    *,
    rates: Tensor | None = None,
    span: int = 1,
) -> tuple[Tensor, Tensor]:
    """BERT masking: choose ``rate`` of the positions; of those, 80% become ``mask_id``, 10% a random token and
    10% stay.  Returns (inputs, labels) with labels -100 at unchosen positions.

    Selective masking: ``rates`` (vocab_size,) gives every id its own rate (a token class's; 0: never chosen, nor
    drawn as a random token), in place of ``rate``.  Span masking: ``span`` > 1 chooses span starts at a position's
    rate / ``span`` and masks the ``span`` positions from each (clipped at the row's end; positions of rate 0
    inside a span stay), about the same share of tokens in runs."""
    if rates is None:
        if not 0.0 < rate < 1.0:
            raise ValueError(f"masking rate must be in (0, 1), got {rate}")
        rates = torch.full((vocab_size,), rate)
    per_position = rates.to(torch.float32)[input_ids]  # (B, N)
    draw = torch.rand(input_ids.shape, generator=generator)
    chosen = draw < per_position / span
    if span > 1:
        starts, chosen = chosen, chosen.clone()
        for shift in range(1, span):  # a start at t - shift covers t
            chosen[:, shift:] |= starts[:, :-shift]
        chosen &= per_position > 0
    labels = torch.where(chosen, input_ids, torch.full_like(input_ids, -100))
    action = torch.rand(input_ids.shape, generator=generator)
    inputs = input_ids.clone()
    inputs[chosen & (action < 0.8)] = mask_id
    randomize = chosen & (action >= 0.8) & (action < 0.9)
    drawable = torch.nonzero(rates > 0).flatten()
    if len(drawable) == vocab_size:
        inputs[randomize] = torch.randint(0, vocab_size, (int(randomize.sum()),), generator=generator)
    else:
        inputs[randomize] = drawable[torch.randint(0, len(drawable), (int(randomize.sum()),), generator=generator)]
    return inputs, labels
