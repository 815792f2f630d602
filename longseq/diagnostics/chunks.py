"""Where a model with learned or entropy chunks (``boundaries=learned|entropy``) cuts a text: the boundaries read
segment by segment with the memory carried, and what they look like (mean chunk length and spread, how many fall
at the start of a word or a line)."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from longseq.generation import read_prompt
from longseq.model import Memory
from longseq.model.dynamic import DynamicHourglass


def read_boundaries(model, ids: Tensor, segment: int) -> Tensor:
    """The chunk starts (T,) bool of one stream ``ids`` (T,) read in segments of ``segment`` tokens with the memory
    carried: position t begins a chunk.  ``model`` is a language model with a dynamic hourglass.  No tokens: no
    starts, an empty (0,) tensor."""
    blocks = [layer for layer in model.transformer.stack.layers if isinstance(layer, DynamicHourglass)]
    if not blocks:
        raise ValueError("this model has no chunk boundaries: set shorten_layers and boundaries=learned or entropy")
    if not isinstance(ids, Tensor) or ids.dim() != 1:
        shape = tuple(ids.shape) if isinstance(ids, Tensor) else type(ids).__name__
        raise ValueError(f"read_boundaries reads one stream of token ids (T,), got {shape}")
    if segment < 1:
        raise ValueError(f"read_boundaries reads segments of at least one token, got segment={segment}")
    if ids.numel() == 0:
        return torch.zeros(0, dtype=torch.bool)
    cuts: list[Tensor] = []
    hook = blocks[0].boundaries.register_forward_hook(lambda module, args, out: cuts.append(out.cuts[0]))
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            read_prompt(model, ids[None], segment, mems=Memory())
    finally:
        model.train(was_training)
        hook.remove()
    return torch.cat(cuts).cpu()


def chunk_statistics(data: bytes, starts: Tensor, mem_len: int) -> dict:
    """Mean chunk length and its spread over ``data`` (one token per byte) cut at ``starts`` (T,); the share of
    chunk starts at a word start (after a space or newline), at a space or newline itself and at a line start,
    against those positions' share of the text; and ``mem_len`` chunk memory slots expressed in bytes.  A text of
    no bytes has no chunks to measure, and is an error, as are ``starts`` of another length or with no start."""
    if len(data) == 0:
        raise ValueError("chunk_statistics needs a text of at least one byte: this one is empty, it has no chunks")
    starts = starts.bool().tolist()
    if len(starts) != len(data):
        raise ValueError(f"chunk_statistics: starts has {len(starts)} positions, the text {len(data)} bytes")
    begins = [t for t, cut in enumerate(starts) if cut]
    if not begins:
        raise ValueError("chunk_statistics: starts marks no chunk start (a stream's first position always begins one)")
    lengths = [b - a for a, b in zip(begins, begins[1:] + [len(starts)])]
    mean = sum(lengths) / len(lengths)
    spread = math.sqrt(sum((n - mean) ** 2 for n in lengths) / len(lengths))
    word = [t > 0 and data[t - 1 : t] in (b" ", b"\n") for t in range(len(starts))]
    line = [t > 0 and data[t - 1 : t] == b"\n" for t in range(len(starts))]
    space = [data[t : t + 1] in (b" ", b"\n") for t in range(len(starts))]
    return {
        "chunks": len(lengths),
        "mean_length": mean,
        "std_length": spread,
        "longest": max(lengths),
        "at_word_start": sum(word[t] for t in begins) / len(begins),
        "word_starts_in_text": sum(word) / len(word),
        "word_starts_cut": sum(starts[t] for t in range(len(word)) if word[t]) / max(1, sum(word)),
        "at_space": sum(space[t] for t in begins) / len(begins),
        "spaces_in_text": sum(space) / len(space),
        "at_line_start": sum(line[t] for t in begins) / len(begins),
        "memory_slots": mem_len,
        "memory_bytes": mem_len * mean,
    }


CHUNK_TOKENS = 640  # tokens of the text whose cuts ``longseq diagnose`` draws


def has_chunks(model) -> bool:
    """Whether ``model`` is a language model with a dynamic hourglass (``boundaries=learned|entropy``)."""
    stack = getattr(getattr(model, "transformer", None), "stack", None)
    return stack is not None and any(isinstance(layer, DynamicHourglass) for layer in stack.layers)


def chunk_lengths(starts: Tensor) -> dict:
    """The number of chunks that ``starts`` (T,) cut, their mean length and its spread, and the longest, in tokens."""
    begins = [t for t, cut in enumerate(starts.bool().tolist()) if cut]
    lengths = [b - a for a, b in zip(begins, begins[1:] + [len(starts)])]
    if not lengths:
        return {"chunks": 0, "mean_length": 0.0, "std_length": 0.0, "longest": 0}
    mean = sum(lengths) / len(lengths)
    spread = math.sqrt(sum((n - mean) ** 2 for n in lengths) / len(lengths))
    return {"chunks": len(lengths), "mean_length": mean, "std_length": spread, "longest": max(lengths)}


def token_pieces(ids: list[int], tokenizer=None) -> list[str]:
    """Each token as a reader sees it: its text (a word followed by a space), or its id without a tokenizer."""
    if tokenizer is None:
        return [f"{i} " for i in ids]
    space = " " if tokenizer.kind == "word" else ""
    return [(lambda text: text if text.endswith("\n") else text + space)(tokenizer.decode([i])) for i in ids]


def draw_cuts(model, ids, segment: int, path: str, tokenizer=None) -> dict:
    """Read the first :data:`CHUNK_TOKENS` tokens of ``ids`` in segments of ``segment`` with the memory carried,
    draw where the model cuts them into ``path`` (:func:`~longseq.diagnostics.plots.plot_chunk_cuts`) and return the
    numbers: tokens read, the cut positions, and :func:`chunk_lengths`."""
    from longseq.diagnostics.plots import plot_chunk_cuts

    device = next(model.parameters()).device
    passage = torch.as_tensor([int(i) for i in ids[:CHUNK_TOKENS]], dtype=torch.long, device=device)
    starts = read_boundaries(model, passage, segment)
    stats = chunk_lengths(starts)
    title = (
        f"where the model cuts the text: {stats['chunks']} chunks over {len(passage)} tokens, mean "
        f"{stats['mean_length']:.2f} tokens (std {stats['std_length']:.2f}); a red bar begins a chunk"
    )
    plot_chunk_cuts(token_pieces(passage.tolist(), tokenizer), starts.tolist(), path, title=title)
    return {"tokens": len(passage), **stats, "cuts": [t for t, cut in enumerate(starts.tolist()) if cut]}
