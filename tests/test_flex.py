"""FlexAttention (attn_impl=flex) against the dense masked reference: every pattern, with and without memory,
causal and bidirectional, sinusoidal and Shaw positions, outputs and every gradient in float64 (Flex's uncompiled
implementation on CPU); bf16 against float64; the block mask built at exactly (T, K), bottom-right aligned."""

import pytest
import torch
from support import assert_same_run, make_layer, pattern, pattern_lm, run_layer

from longseq.model.attention.flex import flex_available
from longseq.model.attention.patterns import PATTERNS
from longseq.model.memory import HiddenContext

pytestmark = pytest.mark.skipif(not flex_available(), reason="this PyTorch has no FlexAttention")


def global_mask(p, qlen):
    if not p.has_global:
        return None
    flags = torch.zeros(2, qlen, dtype=torch.bool)
    flags[0, 6] = flags[1, 12] = True
    return flags


@pytest.mark.parametrize("pos", ["sinusoidal", "shaw"])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("mlen", [0, 9])
@pytest.mark.parametrize("name", PATTERNS)
def test_flex_equals_dense_reference(name, mlen, causal, pos):
    p = pattern(name, causal, num_global=1 if name == "bigbird" else 0)
    qlen = 17
    flex = run_layer(make_layer("flex", 0, pos), p, qlen, mlen, global_mask(p, qlen))
    slow = run_layer(make_layer("reference", 0, pos), p, qlen, mlen, global_mask(p, qlen))
    assert_same_run(flex, slow)


def test_flex_keeps_documents_apart_and_runs_without_gradients():
    """Document ids make the block mask per batch row; the inference path is PyTorch's public flex_attention."""
    p = pattern("window")
    docs = torch.tensor([[0] * 10 + [1] * 12, [2] * 22])  # (B, K): memory 5, segment 17
    args = (p, 17, 5, None, (docs[:, 5:], docs))
    slow = run_layer(make_layer("reference", 0), *args)
    flex = run_layer(make_layer("flex", 0), *args)
    assert_same_run(flex, slow)
    inference = run_layer(make_layer("flex", 0), *args, grad=False)
    torch.testing.assert_close(inference[0], slow[0], rtol=0, atol=1e-10)


def test_flex_block_mask_is_built_at_the_exact_lengths_once_per_forward(monkeypatch):
    """Queries are shorter than keys (memory first): the block mask has shape (T, K), so Flex never crops one with
    BlockMask._adjust (upper-left, which would drop the memory offset), and the layers sharing a mask share it."""
    import torch.nn.attention.flex_attention as flex_module

    shapes = []
    original = flex_module.create_block_mask

    def recording(*args, **kwargs):
        block_mask = original(*args, **kwargs)
        shapes.append(tuple(block_mask.shape[-2:]))
        return block_mask

    monkeypatch.setattr(flex_module, "create_block_mask", recording)
    model = lm_pair("window", n_layer=3)[0]
    ids = torch.randint(0, 40, (2, 20))
    mems = model(ids[:, :10]).mems
    model(ids[:, 10:], mems)
    assert shapes == [(10, 10), (10, 20)]  # one per forward for three layers; then 10 queries over 10 + 10 keys


def lm_pair(name: str, **extra):
    flex, fast = pattern_lm([name], attn_impl="flex", **extra), pattern_lm([name], attn_impl="rel_shift", **extra)
    fast.load_state_dict(flex.state_dict())
    return flex, fast


@pytest.mark.parametrize("name", ["full", "window", "block_sparse"])
def test_flex_model_equals_rel_shift_model_across_segments(name):
    """End to end, two segments with the XL memory: logits, loss and every parameter's gradient."""
    flex, fast = lm_pair(name, window=4, block_size=4, attn_chunk=4)
    ids = torch.randint(0, 40, (2, 21))
    results = []
    for model in (flex, fast):
        first = model(ids[:, :10], labels=ids[:, 1:11])
        second = model(ids[:, 10:20], first.mems, labels=ids[:, 11:21])
        (first.loss + second.loss).backward()
        results.append((second.logits, [p.grad for p in model.parameters()]))
    torch.testing.assert_close(results[0][0], results[1][0], rtol=0, atol=1e-10)
    for a, b in zip(results[0][1], results[1][1]):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


def test_flex_in_bf16_is_the_float64_reference_to_bf16_rounding():
    p = pattern("window")
    slow = run_layer(make_layer("reference", 0), p, 17, 9, grad=False)[0]
    layer = make_layer("flex", 0).bfloat16()
    torch.manual_seed(1)
    hidden = torch.randn(2, 17, 16, dtype=torch.float64)
    memory = torch.randn(2, 9, 16, dtype=torch.float64)
    u, v = torch.randn(4, 4, dtype=torch.float64), torch.randn(4, 4, dtype=torch.float64)
    from longseq.model.attention.patterns import PatternMask
    from longseq.model.positions import RelativePositions, relative_distances, sinusoidal_embedding

    distances = relative_distances(26, -1)
    rel = RelativePositions(distances, sinusoidal_embedding(distances, 16, torch.float64).bfloat16(), torch.bfloat16)
    with torch.no_grad():
        out, _, _ = layer(
            hidden.bfloat16(), rel, u.bfloat16(), v.bfloat16(), PatternMask(p, 17, 9), HiddenContext(memory.bfloat16())
        )
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), slow, rtol=0, atol=0.1)  # post-LN outputs of unit scale


def test_auto_is_flex_on_cuda_for_full_and_local_patterns_only():
    """``attn_impl=auto`` (the default): rel_shift on CPU; on CUDA, Flex where its blocks and bias stay in proportion
    (full, window, dilated, global without tokens), the sparse pieces elsewhere; never Flex with attention dropout."""
    from longseq.config import ConfigError, ModelConfig
    from longseq.model.attention.kernels import resolve_kernel

    patterns = {name: pattern(name) for name in PATTERNS}  # decided when the layer is built or moved
    assert {resolve_kernel("auto", "cpu", p, False) for p in patterns.values()} == {"rel_shift"}
    on_cuda = {name: resolve_kernel("auto", "cuda", p, False) for name, p in patterns.items()}
    assert on_cuda == {"full": "flex", "window": "flex", "dilated": "flex", "strided": "rel_shift",
                       "block_sparse": "rel_shift", "global": "flex", "bigbird": "rel_shift"}  # fmt: skip
    assert resolve_kernel("auto", "cuda", patterns["full"], True) == "rel_shift"  # a layer with attention dropout
    assert resolve_kernel("flex", "cpu", patterns["strided"], False) == "flex"  # a named kernel is what it says
    assert resolve_kernel("auto", "cuda", patterns["full"], False, "content") == "sdpa"  # rope, alibi, t5, nope
    assert ModelConfig().attn_impl == "auto"
    with pytest.raises(ConfigError, match="no attention dropout"):
        ModelConfig(attn_impl="flex", dropatt=0.1)


def test_compiled_flex_does_not_compile_again_for_new_lengths(monkeypatch):
    """Lengths and block counts marked dynamic: over five (segment, memory) lengths dynamo builds two graphs (the
    first segment, where K = T, and the rest; or one), not one per length.  Checked with the aot_eager backend, which runs
    the same dynamo tracing and guards as the CUDA compile without building kernels."""
    import torch.nn.attention.flex_attention as flex_api
    from torch._dynamo.utils import counters

    import longseq.model.attention.flex as flex
    from longseq.config.model import PatternConfig
    from longseq.model.attention.patterns import AttentionPattern, PatternMask

    torch._dynamo.reset()
    compiled = torch.compile(flex_api.flex_attention, dynamic=True, backend="aot_eager")
    monkeypatch.setattr(flex, "_flex", lambda *args: flex.compiled_flex_call(compiled, *args))
    counters.clear()
    heads, d_head = 2, 16
    for qlen, mlen in [(256, 0), (256, 256), (384, 256), (512, 128), (640, 300)]:
        q, k, v = (torch.randn(1, heads, n, d_head) for n in (qlen, qlen + mlen, qlen + mlen))
        rel, u, w = torch.randn(heads, qlen + mlen + 1, d_head), torch.randn(heads, d_head), torch.randn(heads, d_head)
        mask = PatternMask(AttentionPattern("window", PatternConfig(window=16)), qlen, mlen)
        with torch.no_grad():
            flex.flex_relative_attention(q, k, v, rel, u, w, mask, 0.0, False)
    assert 1 <= counters["stats"]["unique_graphs"] <= 2


@pytest.fixture
def flex_compiled_on_cpu(monkeypatch):
    """The CUDA branch of attn_impl=flex (Flex compiled, lengths marked dynamic) taken on CPU with the eager backend."""
    import longseq.model.attention.flex as flex

    torch._dynamo.reset()
    monkeypatch.setattr(flex, "COMPILED_ON", ("cuda", "cpu"))
    monkeypatch.setattr(flex, "FLEX_BACKEND", "eager")
    flex._compiled_flex.cache_clear()
    flex._compiled_block_mask.cache_clear()
    yield flex
    flex._compiled_flex.cache_clear()
    flex._compiled_block_mask.cache_clear()
    torch._dynamo.reset()


@pytest.mark.slow
def test_a_fullgraph_compiled_model_traces_flex_on_the_cuda_path(flex_compiled_on_cpu):
    """``torch.compile(model, fullgraph=True)`` with attn_impl=flex crashed on CUDA: compiled_flex_call called
    ``torch._dynamo.maybe_mark_dynamic`` while dynamo traced it ("Attempt to trace forbidden callable")."""
    model = pattern_lm(["window", "full"], window=6, attn_impl="flex")
    ids = torch.randint(0, 40, (2, 24))
    with torch.no_grad():
        memory = model(ids[:, :12]).mems
        want = model(ids[:, 12:], memory).logits  # eager, the compiled Flex of the CUDA path
        got = torch.compile(model, fullgraph=True, backend="eager")(ids[:, 12:], memory).logits
        reference = pattern_lm(["window", "full"], window=6, attn_impl="reference")(ids[:, 12:], memory).logits
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got, reference)


def test_the_compiled_flex_fails_loudly_at_its_recompile_limit(flex_compiled_on_cpu, monkeypatch):
    """Past dynamo's recompile limit (8, reached at gpu_check's 13th flex case) flex_attention ran uncompiled, on CUDA
    building the whole score matrix, with one log line.  The limit is raised where longseq compiles Flex
    (FLEX_RECOMPILE_LIMIT), and hitting it is an error naming it."""
    from longseq.model.attention.patterns import AttentionPattern, PatternMask

    flex = flex_compiled_on_cpu

    def call(heads: int, dtype) -> None:
        q, k, v = (torch.randn(1, heads, 16, 8, dtype=dtype) for _ in range(3))
        rel, u, w = torch.randn(heads, 17, 8, dtype=dtype), torch.zeros(heads, 8, dtype=dtype), torch.zeros(heads, 8)
        with torch.no_grad():
            flex.flex_relative_attention(q, k, v, rel, u, w.to(dtype), PatternMask(AttentionPattern("window"), 16, 0),
                                         0.0, False)  # fmt: skip

    shapes = [(h, d) for h in (1, 2, 3) for d in (torch.float32, torch.float64)]  # a graph each (dtype, head count)
    for heads, dtype in shapes:  # within the raised limit (more than dynamo's 8 graphs in gpu_check): all compiled
        call(heads, dtype)
    monkeypatch.setattr(flex, "FLEX_RECOMPILE_LIMIT", 2)
    torch._dynamo.reset()
    call(1, torch.float32)
    call(2, torch.float32)
    with pytest.raises(flex.FlexRecompileLimitError, match="FLEX_RECOMPILE_LIMIT"):
        call(3, torch.float32)


def test_flex_inside_a_compiled_model_traces_and_equals_the_uncompiled_call(monkeypatch):
    """``torch.compile`` of the whole model (the GPU check's compiled_speed) reaches the compiled Flex call while
    dynamo traces: marking sizes dynamic there is refused ("forbidden callable maybe_mark_dynamic", seen on an
    H200), so the call hands the plain operator to the outer trace.  aot_eager on CPU runs the same tracing."""
    import longseq.model.attention.flex as flex
    from longseq.config.model import PatternConfig
    from longseq.model.attention.patterns import AttentionPattern, PatternMask

    torch._dynamo.reset()
    heads, d_head, qlen, mlen = 2, 16, 64, 32
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, heads, n, d_head) for n in (qlen, qlen + mlen, qlen + mlen))
    rel, u, w = torch.randn(heads, qlen + mlen + 1, d_head), torch.randn(heads, d_head), torch.randn(heads, d_head)
    mask = PatternMask(AttentionPattern("window", PatternConfig(window=16)), qlen, mlen)

    def attend(q, k, v):
        return flex.flex_relative_attention(q, k, v, rel, u, w, mask, 0.0, False)

    with torch.no_grad():
        eager = attend(q, k, v)  # the CPU path: Flex uncompiled
        monkeypatch.setattr(flex, "_flex", lambda *args: flex.compiled_flex_call(flex._compiled_flex(), *args))
        compiled = torch.compile(attend, backend="aot_eager", fullgraph=True)(q, k, v)
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-6)
