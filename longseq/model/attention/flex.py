"""Relative attention on PyTorch's FlexAttention (``attn_impl="flex"``): the pattern is the ``mask_mod``, the relative
term an additive bias read by the ``score_mod``.

* Content: Flex scores (q + u) . k / sqrt(D) itself (terms (a) and (c)).
* Position: (q + v) . W_R R_d / sqrt(D) (terms (b) and (d); Shaw's a_d with v = 0) for the distances a query can
  reach, a (B, H, T, n) tensor the ``score_mod`` indexes by pair: n = 2 reach + 1 distances (reach + 1 causal) for a
  pattern of bounded reach (window, dilated), else every row of the table (n = R, quadratic in memory: full attention
  needs it anyway).  The bias requires grad; Flex returns its gradient, which autograd takes back to q, v and W_R.
* Mask: :meth:`PatternMask.mask_mod`, the pattern's predicate on window positions: query ``q_idx`` of the segment
  sits at M + q_idx, behind the memory, so keys are longer than queries and aligned bottom-right.  The block mask
  is built at exactly (T, K) for each forward (and shared by the layers), never cut from a larger one:
  ``BlockMask._adjust`` crops to the upper-left corner, which would drop the memory offset.

On CUDA, Flex runs compiled, with the lengths and the block mask's block counts marked dynamic, so a new segment or
memory length does not compile again (two graphs in all: the first segment, where K = T, and the rest).  On CPU it runs uncompiled (dense, for verification): PyTorch's ``flex_attention`` refuses gradients on CPU,
because its compiled CPU kernel has none, but the unfused implementation that it runs uncompiled has an exact
backward; with gradients on CPU we call that implementation the way ``flex_attention`` does, without the check.
Flex has no attention dropout: ``dropatt`` > 0 in training is refused.
"""

from __future__ import annotations

import math
from functools import cache

import torch
from torch import Tensor

from longseq.model.attention.patterns import PatternMask
from longseq.model.attention.shift import table_rows
from longseq.model.block import softcap as capped


@cache
def flex_available() -> bool:
    """True when this PyTorch has FlexAttention (2.5 and later)."""
    try:
        import torch.nn.attention.flex_attention  # noqa: F401
    except ImportError:
        return False
    return True


def flex_relative_attention(
    query, key, value, rel_key, r_w_bias, r_r_bias, mask, dropatt, training, first_forbidden: int = 0, softcap=0.0
) -> Tensor:
    """The kernel contract on FlexAttention, for the whole problem at once; ``mask`` a :class:`PatternMask` or a
    dense bool mask broadcastable to (B, H, T, K), True where forbidden (its block mask skips what is allowed
    everywhere, so ``first_forbidden`` adds nothing).  A ``softcap`` caps each score in the ``score_mod``, before
    the mask."""
    if training and dropatt > 0:
        raise ValueError("attn_impl=flex has no attention dropout: set dropatt=0 or use attn_impl=rel_shift")
    batch, heads, qlen, d_head = query.shape
    klen = key.size(2)
    scale = 1.0 / math.sqrt(d_head)
    reach = flex_reach(mask)
    if reach is None:  # every row of the table: row T - i + j
        rows = torch.arange(rel_key.size(1), device=query.device)
    else:  # the distances reach .. -reach (.. 0 when causal): rows K - reach .. K + reach
        causal = mask.pattern.causal
        rows = torch.arange(klen - reach, klen + (1 if causal else reach + 1), device=query.device)
    table = table_rows(rel_key, rows).to(torch.float32 if query.dtype != torch.float64 else query.dtype)
    position = torch.matmul(
        (query + r_r_bias[:, None]).to(table.dtype) * scale, table.transpose(-1, -2)
    )  # (B, H, T, n)
    last, mlen = rows.numel() - 1, klen - qlen

    def score_mod(score, b, h, q_idx, kv_idx):
        slot = qlen - q_idx + kv_idx if reach is None else reach - (q_idx + mlen - kv_idx)
        return capped(score + position[b, h, q_idx, slot.clamp(0, last)], softcap)

    block_mask = _block_mask(mask, batch, heads, qlen, klen, query.device)
    return _flex(query + r_w_bias[:, None], key, value, score_mod, block_mask, scale)


def flex_reach(mask: PatternMask | Tensor) -> int | None:
    """The largest |distance| any allowed pair has, when the pattern bounds it (no global tokens, no sinks); else
    None."""
    if not isinstance(mask, PatternMask) or mask.has_global_tokens or mask.sinks:
        return None
    return mask.pattern.reach


def _block_mask(mask: PatternMask | Tensor, batch: int, heads: int, qlen: int, klen: int, device):
    """FlexAttention's block mask at exactly (T, K), once per forward for all layers sharing ``mask``."""
    from torch.nn.attention.flex_attention import create_block_mask

    if isinstance(mask, Tensor):
        dense = mask.expand(batch, heads, qlen, klen)  # a view: (B, H, T, K)
        return create_block_mask(lambda b, h, q, kv: ~dense[b, h, q, kv], batch, heads, qlen, klen, device=device)

    def make():
        per_batch = any(t is not None for t in (mask.key_docs, mask.global_keys, mask.dropped_keys))
        per_head = len(mask.pattern.config.dilation) > 1
        compiled = device.type in COMPILED_ON and not torch.compiler.is_compiling()  # else the model's graph has it
        create = _compiled_block_mask() if compiled else create_block_mask
        return create(
            mask.mask_mod(), batch if per_batch else None, heads if per_head else None, qlen, klen, device=device
        )

    return mask.shared(("flex", batch, heads), make)


COMPILED_ON = ("cuda",)  # the devices where Flex runs compiled (elsewhere: the dense unfused path, to verify)
FLEX_BACKEND = "inductor"  # the backend it is compiled with (the tests run the compiled path with "eager" on CPU)
FLEX_RECOMPILE_LIMIT = 64  # graphs of the one compiled Flex: every pattern, dtype and head count; dynamo's is 8


class FlexRecompileLimitError(RuntimeError):
    """The compiled FlexAttention reached its recompile limit: past it, torch would run it uncompiled, which on CUDA
    builds the whole score matrix, and a kernel called flex never falls back in silence."""


def _flex(query, key, value, score_mod, block_mask, scale) -> Tensor:
    from torch.nn.attention.flex_attention import flex_attention

    if query.device.type in COMPILED_ON and torch.compiler.is_compiling():  # torch.compile(model): its graph has Flex
        return flex_attention(query, key, value, score_mod=score_mod, block_mask=block_mask, scale=scale)
    if query.device.type in COMPILED_ON:
        return compiled_flex_call(_compiled_flex(), query, key, value, score_mod, block_mask, scale)
    if torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value)):
        return _eager_flex_with_grad(query, key, value, score_mod, block_mask, scale)
    return flex_attention(query, key, value, score_mod=score_mod, block_mask=block_mask, scale=scale)


def compiled_flex_call(compiled, query, key, value, score_mod, block_mask, scale) -> Tensor:
    """Call a compiled ``flex_attention`` with the lengths marked dynamic: T and K, and with them the block mask's
    block counts (its tensors would otherwise be specialised on their first sizes and compiled again), under a
    recompile limit of :data:`FLEX_RECOMPILE_LIMIT` that fails loudly when it is hit
    (:class:`FlexRecompileLimitError`).  Inside a ``torch.compile`` of the whole model, dynamo traces
    ``flex_attention`` itself and refuses marks while tracing: the plain operator is called, and the outer compile
    decides what is dynamic."""
    from torch.nn.attention.flex_attention import flex_attention

    if torch.compiler.is_compiling():
        return flex_attention(query, key, value, score_mod=score_mod, block_mask=block_mask, scale=scale)
    for tensor in (query, key, value):
        torch._dynamo.maybe_mark_dynamic(tensor, 2)
    for tensor in block_mask.as_tuple():
        for dim in range(2, tensor.dim() if isinstance(tensor, Tensor) else 0):
            torch._dynamo.maybe_mark_dynamic(tensor, dim)
    try:
        with torch._dynamo.config.patch(recompile_limit=FLEX_RECOMPILE_LIMIT, fail_on_recompile_limit_hit=True):
            return compiled(query, key, value, score_mod=score_mod, block_mask=block_mask, scale=scale)
    except torch._dynamo.exc.FailOnRecompileLimitHit as exc:
        raise FlexRecompileLimitError(
            f"attn_impl=flex: the compiled FlexAttention reached its limit of {FLEX_RECOMPILE_LIMIT} graphs (one per "
            "pattern, dtype, head count and length kind); past it torch runs Flex uncompiled, building the whole "
            "score matrix. Use fewer patterns or shapes in one process, or raise longseq.model.attention.flex."
            "FLEX_RECOMPILE_LIMIT"
        ) from exc


@cache
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=True, backend=FLEX_BACKEND)


@cache
def _compiled_block_mask():
    from torch.nn.attention.flex_attention import create_block_mask

    return torch.compile(create_block_mask, dynamic=True, backend=FLEX_BACKEND)  # never materialises the (T, K) mask


def _flex_hop(*args):
    from torch._higher_order_ops.flex_attention import flex_attention as flex_hop

    return flex_hop(*args)


def _eager_flex_with_grad(query, key, value, score_mod, block_mask, scale) -> Tensor:
    """What ``flex_attention`` runs uncompiled (the FlexAttention operator through the eager backend), without its
    refusal of gradients on CPU.  Traced with static shapes: one trace per shape (the compilation environment lifts
    the recompile limit), because once dynamo's automatic dynamic shapes set in after a few lengths, tracing the
    ``score_mod``'s indexing of the position term fails (PendingUnbackedSymbolNotFound in PyTorch 2.13)."""
    try:
        from torch._higher_order_ops.utils import setup_compilation_env
        from torch.nn.attention.flex_attention import _apply_kernel_options
    except ImportError as exc:  # pragma: no cover - PyTorch internals moved
        raise NotImplementedError(
            f"attn_impl=flex with gradients on CPU needs FlexAttention's internals of PyTorch 2.13 ({exc}); "
            "train with attn_impl=rel_shift on CPU"
        ) from None
    options = _apply_kernel_options(query, key, value, False, None)
    with setup_compilation_env() as backend:
        run = torch.compile(_flex_hop, backend=backend, fullgraph=True, dynamic=False)
        out, *_ = run(query, key, value, score_mod, block_mask.as_tuple(), scale, options)
    return out
