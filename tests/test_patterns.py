"""Attention patterns: the predicate against hand-written loops, the blocked kernel against the dense
masked reference (float64, outputs and gradients), limits, global tokens, Shaw positions, bad input."""

import ast
import math
import re
from pathlib import Path

import pytest
import torch
from support import D_HEAD, D_MODEL, N_HEAD, assert_same_run, make_layer, pattern, pattern_lm, raises_naming, run_layer

from longseq.config import ConfigError, ModelConfig
from longseq.model import build_model
from longseq.model.attention.flex import flex_available
from longseq.model.attention.patterns import (
    PATTERNS,
    AttentionPattern,
    PatternError,
    PatternKind,
    PatternMask,
    global_keys,
    in_random_blocks,
    layer_patterns,
)
from longseq.model.memory import HiddenContext, Memory, Recurrence
from longseq.model.positions import RelativePositions, relative_distances


def naive_allowed(p: AttentionPattern, q: int, k: int, head: int) -> bool:
    """The pattern table of the module docstring, written as plain Python for one pair."""
    d = q - k
    if p.causal and d < 0:
        return False
    a = abs(d)
    if p.name == "full":
        return True
    if p.name in ("window", "global"):
        return a < p.config.window
    if p.name == "dilated":
        dil = p.config.dilation[head % len(p.config.dilation)]
        return a % dil == 0 and a < p.config.window * dil
    if p.name == "strided":
        return a < p.config.window or a % p.config.stride == 0
    if p.name == "block_sparse":
        s = p.config.block_size
        return q // s == k // s or k % s >= s - p.config.block_summary
    raise AssertionError(p.name)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("name", ["full", "window", "dilated", "strided", "block_sparse", "global"])
def test_predicate_matches_hand_written_rules(name, causal):
    p = pattern(name, causal)
    mask = PatternMask(p, qlen=13, mlen=7)
    allowed = ~mask.forbidden().expand(1, N_HEAD, 13, 20)[0]  # (H, T, K)
    for h in range(N_HEAD):
        for i in range(13):
            for k in range(20):
                assert bool(allowed[h, i, k]) == naive_allowed(p, 7 + i, k, h), (h, i, k)


@pytest.mark.parametrize("causal", [True, False])
def test_random_blocks_are_seeded_counted_and_causal(causal):
    p = pattern("bigbird", causal, window=1)
    klen, size = 40, p.config.block_size
    q = torch.arange(klen)[:, None]
    table = p.allowed(q, torch.arange(klen)[None, :], klen)[0]  # (K, K)
    if causal:
        table = table & (q >= torch.arange(klen)[None, :])
    blocks = table.view(klen // size, size, klen // size, size)[:, 0, :, 0]  # (nb, nb): random blocks + diagonal
    for qb in range(klen // size):
        eligible = qb + 1 if causal else klen // size
        chosen = set(blocks[qb].nonzero().flatten().tolist())
        assert qb in chosen  # the window of 1 is the diagonal
        assert len(chosen) in (min(p.config.num_random_blocks, eligible), min(p.config.num_random_blocks, eligible) + 1)
        if causal:
            assert max(chosen) <= qb
    again = p.allowed(q, torch.arange(klen)[None, :], klen)[0]
    assert torch.equal(again if not causal else again & (q >= torch.arange(klen)[None, :]), table)  # deterministic
    other = AttentionPattern(p.name, p.config.replace(pattern_seed=4)).allowed(q, torch.arange(klen)[None, :], klen)[0]
    assert not torch.equal(again, other)  # the seed matters
    # a block of queries sees the same random keys whether asked alone or as part of the whole
    part = p.allowed(q[12:20], torch.arange(8, 30)[None, :], klen)[0]
    assert torch.equal(part, again[12:20, 8:30])


@pytest.mark.parametrize("pos", ["sinusoidal", "shaw"])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("mlen", [0, 9])
@pytest.mark.parametrize("name", PATTERNS)
def test_blocked_kernel_equals_dense_reference(name, mlen, causal, pos):
    p = pattern(name, causal, num_global=1 if name == "bigbird" else 0)
    qlen = 17
    global_mask = None
    if p.has_global:
        global_mask = torch.zeros(2, qlen, dtype=torch.bool)
        global_mask[0, 6] = global_mask[1, 12] = True
    fast = run_layer(make_layer("rel_shift", 5, pos), p, qlen, mlen, global_mask)
    slow = run_layer(make_layer("reference", 0, pos), p, qlen, mlen, global_mask)
    torch.testing.assert_close(fast[0], slow[0], rtol=0, atol=1e-10)
    inference = run_layer(make_layer("rel_shift", 5, pos), p, qlen, mlen, global_mask, grad=False)
    torch.testing.assert_close(inference[0], slow[0], rtol=0, atol=1e-10)
    for a, b in zip(fast[1], slow[1]):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


def test_blocked_kernel_keeps_documents_apart():
    p = pattern("window")
    docs = torch.tensor([[0] * 10 + [1] * 12, [2] * 22])  # (B, K): memory 5, segment 17
    args = (p, 17, 5, None, (docs[:, 5:], docs))
    fast = run_layer(make_layer("rel_shift", 4), *args)
    slow = run_layer(make_layer("reference", 0), *args)
    torch.testing.assert_close(fast[0], slow[0], rtol=0, atol=1e-10)


@pytest.mark.parametrize("kernel, chunk", [("rel_shift", 0), ("rel_shift", 4), ("flex", 0)])
@pytest.mark.parametrize("name", ["full", "window"])
def test_memory_slots_dropped_from_the_mask_get_no_attention_and_no_gradient(kernel, chunk, name):
    """Memory dropout's mask (``dropped_keys``, per batch row) in every kernel equals the dense reference, and a
    dropped memory slot takes no part: its gradient is exactly zero."""
    if kernel == "flex":
        pytest.importorskip("torch.nn.attention.flex_attention")
    p = pattern(name)
    dropped = torch.zeros(2, 22, dtype=torch.bool)  # (B, K): memory 5, segment 17
    dropped[0, [0, 3]] = dropped[1, [1, 2, 4]] = True
    args = (p, 17, 5, None, None)
    fast = run_layer(make_layer(kernel, chunk), *args, dropped=dropped)
    slow = run_layer(make_layer("reference", 0), *args, dropped=dropped)
    assert_same_run(fast, slow)
    memory_grad = slow[1][-1]  # (B, M, E)
    assert torch.equal(memory_grad[dropped[:, :5]], torch.zeros_like(memory_grad[dropped[:, :5]]))
    if name == "full":  # a window does not reach every memory slot anyway
        assert bool((memory_grad[~dropped[:, :5]].abs().sum(-1) > 0).all())
    whole = run_layer(make_layer("reference", 0), *args)
    assert not torch.allclose(whole[0], slow[0])


def test_local_key_ranges_are_bounded_by_block_plus_reach():
    """What makes a local pattern linear: a block of queries never looks beyond its reach."""
    for p, reach in [(pattern("window", window=64), 63), (pattern("dilated", window=8, dilation=(1, 4)), 28)]:
        mask = PatternMask(p, qlen=4096, mlen=512)
        widths = [hi - lo for lo, hi in (mask.key_range(q0, q0 + 64) for q0 in range(0, 4096, 64))]
        assert max(widths) == 64 + reach


def test_window_covering_segment_and_memory_equals_full_attention():
    ids = torch.randint(0, 40, (2, 30))
    outs = {}
    for name, extra in [("full", {}), ("window", {"window": 12 + 10}), ("dilated", {"window": 22})]:
        model, mems, logits = pattern_lm([name], attn_chunk=4, **extra), None, []
        for segment in ids.split(10, dim=1):
            out = model(segment, mems)
            logits.append(out.logits)
            mems = out.mems
        outs[name] = torch.cat(logits, 1)
    torch.testing.assert_close(outs["window"], outs["full"], rtol=0, atol=1e-10)
    torch.testing.assert_close(outs["dilated"], outs["full"], rtol=0, atol=1e-10)
    narrow = pattern_lm(["window"], window=3)
    assert not torch.allclose(narrow(ids[:, :10]).logits, pattern_lm(["full"])(ids[:, :10]).logits)


@pytest.mark.parametrize("causal", [True, False])
def test_global_tokens_see_everything_and_are_seen_by_everything(causal):
    p = pattern("global", causal, window=2)
    gmask = torch.zeros(1, 12, dtype=torch.bool)
    gmask[0, 5] = True
    allowed = ~PatternMask(p, 12, 6, global_keys=global_keys(gmask, 0, 1, 12, 6, None)).forbidden()[0, 0]  # (T, K)
    visible = torch.ones(12, 18, dtype=torch.bool)
    if causal:
        visible = torch.arange(12)[:, None] + 6 >= torch.arange(18)[None, :]
    assert torch.equal(allowed[5], visible[5])  # the global token's row
    assert torch.equal(allowed[:, 6 + 5], visible[:, 11])  # its column
    assert not allowed[0, 0] and not allowed[11, 6 + 8 - 6]  # ordinary pairs beyond the window stay masked

    # and in a model: information from far away reaches a global token, not an ordinary one
    model = pattern_lm(["global"], window=2, mem_len=0, bidirectional=not causal)
    ids = torch.randint(0, 40, (1, 12))
    emb = model.transformer.word_emb(ids).detach().requires_grad_(True)
    hidden = model.transformer.stack.layers[0].dec_attn  # one layer is enough to show who reads whom
    rel = model.transformer.stack.relative_tables(12, -1, torch.float64, None, qlen=12)[0]
    step = model.transformer.stack.open_step(Memory(), 1, 12, None, Recurrence(0))
    mask = model.transformer.stack._masks(step, step.mask_inputs(), gmask, 1, None)[0]
    out, _, _ = hidden(emb, rel, model.transformer.stack.r_w_bias, model.transformer.stack.r_r_bias, mask)
    far_source = 0
    g_global = torch.autograd.grad(out[0, 5].sum(), emb, retain_graph=True)[0][0, far_source]
    g_plain = torch.autograd.grad(out[0, 11].sum(), emb)[0][0, far_source]
    assert g_global.abs().sum() > 0 and g_plain.abs().sum() == 0


def test_shaw_position_term_is_the_clipped_learned_table():
    layer = make_layer("rel_shift", 0, "shaw")
    qlen, mlen = 6, 5
    torch.manual_seed(2)
    hidden = torch.randn(1, qlen, D_MODEL, dtype=torch.float64)
    memory = torch.randn(1, mlen, D_MODEL, dtype=torch.float64)
    zero = torch.zeros(N_HEAD, D_HEAD, dtype=torch.float64)
    rel_key = layer.relative_keys(RelativePositions(relative_distances(qlen + mlen, -1), None, torch.float64))
    mask = PatternMask(pattern("full"), qlen, mlen)
    out, (key, value), _ = layer(hidden, rel_key, zero, zero, mask, HiddenContext(memory))
    query = layer.qkv_net(hidden).split(N_HEAD * D_HEAD, -1)[0].view(1, qlen, N_HEAD, D_HEAD)
    table = layer.rel.rel_table.view(-1, N_HEAD, D_HEAD)
    expected = torch.zeros(1, qlen, N_HEAD, D_HEAD, dtype=torch.float64)
    for h in range(N_HEAD):
        for i in range(qlen):
            scores = []
            for j in range(mlen + i + 1):
                a = table[min(mlen + i - j, 6) + 6, h]  # a_{clip(i - j)}, max_relative_distance 6
                scores.append((query[0, i, h] @ (key[0, h, j] + a)) / math.sqrt(D_HEAD))
            probs = torch.softmax(torch.stack(scores), 0)
            expected[0, i, h] = probs @ value[0, h, : mlen + i + 1]
    attn = layer.o_net(expected.view(1, qlen, -1))
    torch.testing.assert_close(out, layer.layer_norm(hidden + attn), rtol=0, atol=1e-10)


def test_bad_pattern_configurations_get_clear_errors():
    with pytest.raises(ConfigError, match="window must be >= 1"):
        ModelConfig(attention="window", window=0)
    with pytest.raises(ConfigError, match="nothing to attend to"):
        ModelConfig(attention="dilated", dilation=[1, 0, 2, 1])
    with pytest.raises(ConfigError, match="one per head"):
        ModelConfig(attention="dilated", dilation=[1, 2, 3])
    with pytest.raises(ConfigError, match="did you mean window"):
        build_model(ModelConfig(attention="windw"))
    with pytest.raises(ConfigError, match="one per layer"):
        ModelConfig(attention=["window", "full"], n_layer=4)
    assert layer_patterns(ModelConfig(attention="window,full,full,full"))[1].name == "full"
    model = pattern_lm(["global"], window=3)
    ids = torch.randint(0, 40, (2, 8))
    with raises_naming(ValueError, "global_mask", "(2, 8)", "(2, 7)"):
        model(ids, global_mask=torch.zeros(2, 7, dtype=torch.bool))
    with pytest.raises(ValueError, match="needs a global or bigbird"):
        pattern_lm(["window"])(ids, global_mask=torch.zeros(2, 8, dtype=torch.bool))
    with pytest.raises(PatternError, match="unknown value 'sparse'"):
        AttentionPattern(name="sparse")


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("name", ["window", "dilated"])
def test_banded_path_runs_and_equals_dense_reference(name, causal, monkeypatch):
    """Longer sequences take the batched banded kernel (every block at once); it must agree too."""
    import longseq.model.attention.kernels as attention

    calls = []
    original = attention.banded_attention

    def counting(*args, **kwargs):
        out = original(*args, **kwargs)
        calls.append(out is not None)
        return out

    monkeypatch.setattr(attention, "banded_attention", counting)
    p = pattern(name, causal, window=4, dilation=(1, 2, 1, 3) if name == "dilated" else (1,))
    docs = torch.tensor([[0] * 30 + [1] * 21, [5] * 51])  # (B, K): memory 12, segment 39
    args = (p, 39, 12, None, (docs[:, 12:], docs))
    fast = run_layer(make_layer("rel_shift", 8), *args)
    slow = run_layer(make_layer("reference", 0), *args)
    assert calls == [True]
    torch.testing.assert_close(fast[0], slow[0], rtol=0, atol=1e-10)
    for a, b in zip(fast[1], slow[1]):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


# --- a new pattern is one registry entry ------------------------------------------------------------------------

TOYS = {  # registered by the tests below only: each a predicate plus the data kernels read, nothing else
    # local, a band with holes: the window without the key just before the query (the banded kernel masks it)
    "skip_one": PatternKind(
        lambda c, q, k, span, d, r: (span < c.window) & (span != 1),
        ("window",),
        local_reach=lambda c: c.window - 1,
        fills_band=False,
    ),
    # sparse, two pieces at once: a window, every stride-th key and random key blocks (the sparse kernel)
    "window_stride_random": PatternKind(
        lambda c, q, k, span, d, r: (span < c.window) | (span % c.stride == 0) | in_random_blocks(c, q, k, r),
        ("window", "stride", "block_size", "num_random_blocks", "pattern_seed"),
        local_reach=lambda c: c.window - 1,
        pieces=lambda c: ("stride", "random") if c.num_random_blocks else ("stride",),
    ),
    # no band at all: the even key positions (key blocks over the whole range, masked by the predicate)
    "even_keys": PatternKind(lambda c, q, k, span, d, r: k % 2 == 0, (), fills_band=False),
}
PATHS = {"skip_one": "banded", "window_stride_random": "sparse", "even_keys": "blocks"}


@pytest.fixture
def toys(monkeypatch):
    """The toy patterns registered in :data:`PATTERNS` for one test, and the kernel paths that ran (banded, sparse
    pieces)."""
    import longseq.model.attention.kernels as kernels
    import longseq.model.attention.sparse as sparse

    for name, kind in TOYS.items():
        monkeypatch.setitem(PATTERNS, name, kind)
    ran = []
    banded, pieces = kernels.banded_attention, sparse.sparse_pieces

    def banded_ran(*args):
        out = banded(*args)
        ran.append("banded" if out is not None else "banded too short")
        return out

    def pieces_ran(mask, block):
        built = pieces(mask, block)
        ran.extend(["sparse", *(type(p).__name__ for p in built)])
        return built

    monkeypatch.setattr(kernels, "banded_attention", banded_ran)
    monkeypatch.setattr(sparse, "sparse_pieces", pieces_ran)
    return ran


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("name", list(TOYS))
def test_a_pattern_registered_in_one_entry_runs_every_kernel_exactly(name, causal, toys):
    """A pattern that exists only as a registry entry (registered by this test) runs through the dense reference,
    the rel_shift kernel's path its data chooses (banded band, sparse pieces, or key blocks) and Flex, with a
    memory, and each equals the reference in float64, outputs and every gradient; its pair count and its reach
    come from the same data."""
    p = pattern(name, causal)
    qlen, mlen = 23, 9
    slow = run_layer(make_layer("reference", 0), p, qlen, mlen)
    fast = run_layer(make_layer("rel_shift", 5), p, qlen, mlen)
    assert_same_run(fast, slow)
    path = PATHS[name]
    assert (toys[0] if toys else "blocks") == path, toys
    if path == "sparse":
        assert toys == ["sparse", "Band", "StrideColumns", "RandomBlocks"]
    inference = run_layer(make_layer("rel_shift", 5), p, qlen, mlen, grad=False)
    torch.testing.assert_close(inference[0], slow[0], rtol=0, atol=1e-10)
    if flex_available():
        assert_same_run(run_layer(make_layer("flex", 0), p, qlen, mlen), slow)
    mask = PatternMask(p, qlen, mlen)
    allowed = ~mask.forbidden().expand(1, N_HEAD, qlen, qlen + mlen)[0, 0]  # (T, K)
    assert p.allowed_pairs(qlen, qlen + mlen) == int(allowed.sum())
    distance = (mlen + torch.arange(qlen)[:, None] - torch.arange(qlen + mlen)[None, :]).abs()
    assert (p.reach is None) == (name != "skip_one")
    if p.reach is not None:
        assert int(distance[allowed].max()) <= p.reach


def test_a_registered_pattern_is_a_config_choice_with_its_parameters_checked(toys):
    """The toy is a name a model config may choose (the registry owns the names), a whole model with it and a
    memory reads two segments as the reference does, and the options it reads come from its entry alone."""
    from longseq.model.registry import ignored_options

    settings = dict(window=3, stride=4, block_size=4, num_random_blocks=1, attn_chunk=4)
    fast = pattern_lm(["window_stride_random", "skip_one"], **settings)
    slow = pattern_lm(["window_stride_random", "skip_one"], **settings, attn_impl="reference")
    ids = torch.randint(0, 40, (2, 16))
    with torch.no_grad():
        logits = []
        for model in (fast, slow):
            first = model(ids[:, :8])
            logits.append((first.logits, model(ids[:, 8:], first.mems).logits))  # the second segment reads memory
    for a, b in zip(*logits):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)
    assert "RandomBlocks" in toys and "banded" in toys  # the fast model took the toys' own paths
    assert ignored_options(fast.config) == []
    assert ignored_options(pattern_lm(["skip_one"], **settings).config) == [
        "pattern.stride=4",
        "pattern.block_size=4",
        "pattern.num_random_blocks=1",
    ]


PATTERN_NAMES_OUTSIDE = "longseq/model/attention/patterns.py"


def name_tests(source: str, names) -> list[str]:
    """The places in ``source`` that switch on a pattern's name: a comparison of something called ``name`` or
    ``attention`` (``pattern.name``, ``config.pattern.attention``) with a registered name, a ``match`` case of one,
    or a dict literal keyed by two or more (a hand table of patterns)."""

    def literals(node) -> set:
        items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
        return {e.value for e in items if isinstance(e, ast.Constant) and isinstance(e.value, str)} & set(names)

    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            named = any(re.search(r"\b(\w*name\w*|attention)\b", ast.unparse(s)) for s in sides)
            if named and any(literals(s) for s in sides):
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.MatchValue) and literals(node.value):
            found.append(f"line {node.lineno}: case {ast.unparse(node.value)}")
        elif isinstance(node, ast.Dict) and len(set().union(*(literals(k) for k in node.keys if k is not None))) > 1:
            found.append(f"line {node.lineno}: a dict keyed by patterns")
    return found


def test_no_module_outside_the_registry_switches_on_a_pattern_name():
    """Pattern behaviour is data: every name test that used to live in the kernels, the stack, the checks and the
    interop (these samples) is found by the scan, and no module of longseq but patterns.py has one."""
    samples = [
        'if pattern.name == "strided":\n    pass',
        'local = pattern is None or pattern.name == "full"',
        'x = self.name in ("window", "global")',
        'if set(p.attention) != {"full"}:\n    pass',
        'match pattern.name:\n    case "bigbird":\n        pass',
        'pieces = {"strided": 1, "block_sparse": 2}[pattern.name]',
    ]
    for sample in samples:
        assert name_tests(sample, PATTERNS), sample
    assert not name_tests('ok = key in ("window", "block_size", "stride")', PATTERNS)  # parameters, not patterns
    root = Path(__file__).resolve().parent.parent
    found = {
        str(path.relative_to(root)): name_tests(path.read_text(), PATTERNS)
        for path in sorted((root / "longseq").rglob("*.py"))
        if path.relative_to(root).as_posix() != PATTERN_NAMES_OUTSIDE
    }
    assert {path: lines for path, lines in found.items() if lines} == {}
    assert name_tests((root / PATTERN_NAMES_OUTSIDE).read_text(), PATTERNS) != []  # the registry itself has them
