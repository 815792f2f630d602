"""The sparse kernels (strided, block_sparse, global tokens, random blocks): outputs and every gradient equal the
dense masked reference in float64, and a kernel scores only the pairs its pattern can reach, counted."""

import math

import pytest
import torch
from support import assert_same_run, make_layer, pattern_lm, run_layer

import longseq.model.attention.sparse as sparse
from longseq.config.model import PatternConfig
from longseq.model.attention.patterns import AttentionPattern, PatternMask

SPARSE = {
    "strided": dict(window=3, stride=5),
    "block_sparse": dict(block_size=4, block_summary=2),
    "global": dict(window=3),
    "bigbird": dict(window=2, block_size=4, num_random_blocks=2, pattern_seed=5),
}


def global_tokens(qlen: int) -> torch.Tensor:
    """A run of two global tokens and a lone one in row 0, one late token in row 1: (2, T)."""
    flags = torch.zeros(2, qlen, dtype=torch.bool)
    flags[0, :2] = flags[0, 17] = flags[1, 30] = True
    return flags


@pytest.fixture
def pieces_built(monkeypatch):
    """The names of the sparse pieces built during a test: proves the sparse path ran."""
    built = []
    original = sparse.sparse_pieces

    def recording(mask, block):
        pieces = original(mask, block)
        built.extend(type(p).__name__ for p in pieces)
        return pieces

    monkeypatch.setattr(sparse, "sparse_pieces", recording)
    return built


@pytest.mark.parametrize("pos", ["sinusoidal", "shaw"])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("mlen", [0, 12])
@pytest.mark.parametrize("name", list(SPARSE))
def test_sparse_kernel_equals_dense_reference(name, mlen, causal, pos, pieces_built):
    """40 queries in blocks of 8 over several periods, blocks and random picks; memory not a multiple of any."""
    p = AttentionPattern(name, PatternConfig(bidirectional=not causal, **SPARSE[name]))
    qlen = 40
    flags = global_tokens(qlen) if p.has_global else None
    fast = run_layer(make_layer("rel_shift", 8, pos), p, qlen, mlen, flags)
    slow = run_layer(make_layer("reference", 0, pos), p, qlen, mlen, flags)
    expected = {
        "strided": "StrideColumns",
        "block_sparse": "SummaryColumns",
        "global": "GlobalColumns",
        "bigbird": "RandomBlocks",
    }
    assert pieces_built[0] == "Band" and expected[name] in pieces_built
    assert_same_run(fast, slow)
    inference = run_layer(make_layer("rel_shift", 8, pos), p, qlen, mlen, flags, grad=False)
    torch.testing.assert_close(inference[0], slow[0], rtol=0, atol=1e-10)


@pytest.mark.parametrize("name", ["strided", "bigbird"])
def test_sparse_kernel_keeps_documents_apart(name):
    p = AttentionPattern(name, PatternConfig(**SPARSE[name]))
    docs = torch.tensor([[0] * 20 + [1] * 25 + [2] * 7, [3] * 52])  # (B, K): memory 12, segment 40
    args = (p, 40, 12, global_tokens(40) if p.has_global else None, (docs[:, 12:], docs))
    fast = run_layer(make_layer("rel_shift", 8), *args)
    slow = run_layer(make_layer("reference", 0), *args)
    assert_same_run(fast, slow)


def test_half_precision_sparse_kernel_computes_in_float32():
    """bf16 inputs: scores and softmax in float32, so the result is the float64 reference's to bf16 rounding."""
    p = AttentionPattern("strided", PatternConfig(**SPARSE["strided"]))
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, n, 4, dtype=torch.float64) for n in (40, 52, 52))
    rel, u, w = torch.randn(2, 53, 4, dtype=torch.float64), torch.randn(2, 4, dtype=torch.float64), torch.zeros(2, 4)
    mask = PatternMask(p, 40, 12)
    exact = sparse.sparse_attention(q, k, v, rel, u, w.double(), mask, 8, 0.0, False)
    half = sparse.sparse_attention(*(t.bfloat16() for t in (q, k, v, rel, u, w)), mask, 8, 0.0, False)
    assert half.dtype == torch.bfloat16
    torch.testing.assert_close(half.double(), exact, rtol=0, atol=0.05)


def count_scored_pairs(monkeypatch) -> list[int]:
    """Every score entry the sparse kernel computes (per batch row and head), padding included: the pieces'
    masked scores, the global columns' position terms and the global rows' probabilities."""
    counted = []

    def counting(fn):
        def wrapped(*args, **kwargs):
            out = fn(*args, **kwargs)
            counted.append(out.numel())
            return out

        return wrapped

    monkeypatch.setattr(sparse, "relative_scores", counting(sparse.relative_scores))
    monkeypatch.setattr(sparse, "relative_probs", counting(sparse.relative_probs))
    for name in ("DiagonalScores", "PositionScores"):
        cls = getattr(sparse, name)
        monkeypatch.setattr(sparse, name, type(name, (), {"apply": staticmethod(counting(cls.apply))}))
    return counted


@pytest.mark.parametrize("name", list(SPARSE))
def test_sparse_kernel_scores_only_the_pairs_its_pattern_reaches(name, monkeypatch):
    """At 1,024 queries over 1,280 keys, the pairs scored are the band (block + reach, whole blocks) plus each
    pattern's bound on its other keys (counted from the parameters, padding of the layouts included), a small part
    of the dense T x K; and at least the allowed pairs (exactness needs every one)."""
    qlen, mlen, block, heads = 1024, 256, 64, 2
    params = {
        "strided": dict(window=33, stride=32),
        "block_sparse": dict(block_size=64, block_summary=2),
        "global": dict(window=33),
        "bigbird": dict(window=33, block_size=32, num_random_blocks=3),
    }[name]
    p = AttentionPattern(name, PatternConfig(**params))
    klen = qlen + mlen
    flags = torch.zeros(1, klen, dtype=torch.bool)
    flags[0, mlen + 100 : mlen + 104] = True  # 4 global tokens (global and bigbird only)
    mask = PatternMask(p, qlen, mlen, global_keys=flags if p.has_global else None)
    counted = count_scored_pairs(monkeypatch)
    q, k, v = (torch.randn(1, heads, n, 8) for n in (qlen, klen, klen))
    sparse.sparse_attention(q, k, v, torch.randn(heads, klen + 1, 8), torch.zeros(heads, 8), torch.zeros(heads, 8),
                            mask, block, 0.0, False)  # fmt: skip
    scored = sum(counted) / heads
    band = qlen * (64 + block)  # a reach of 32 (window 33, or a block of 64: 63) rounds up to one block
    if name == "strided":
        bound = band + (qlen + 32) * math.ceil(klen / 32)
    elif name == "block_sparse":
        bound = band + (qlen + 64) * 2 * math.ceil(klen / 64)
    elif name == "global":
        bound = band + qlen * 4 + 4 * klen
    else:
        bound = band + (qlen + 32) * 3 * 32 + qlen * 4 + 4 * klen
    allowed = int((~mask.forbidden()).sum())
    assert allowed <= scored <= bound < qlen * klen / 4, (allowed, scored, bound)


@pytest.mark.parametrize("name", list(SPARSE))
def test_sparse_kernels_under_activation_checkpointing_give_the_same_gradients(name):
    """Recomputed in the backward pass (saved tensors unpacked once), every parameter's gradient is unchanged."""
    grads = []
    for every in (0, 1):
        params = {("pattern_seed" if k == "seed" else k): v for k, v in SPARSE[name].items()}
        model = pattern_lm([name], attn_chunk=4, mem_len=6, **params).train()
        model.transformer.stack.activation_checkpointing = every
        ids = torch.randint(0, 40, (2, 25), generator=torch.Generator().manual_seed(0))
        flags = None
        if name in ("global", "bigbird"):
            flags = torch.zeros(2, 12, dtype=torch.bool)
            flags[0, :2] = flags[1, 7] = True
        first = model(ids[:, :12], labels=ids[:, 1:13], global_mask=flags)
        second = model(ids[:, 12:24], first.mems, labels=ids[:, 13:25], global_mask=flags)
        (first.loss + second.loss).backward()
        grads.append([p.grad for p in model.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
