"""Rotary, ALiBi, T5 and NoPE positions with every memory, grouped-query attention and QK-norm.

Each encoding is held to code we did not write or to its paper's formula (rope against the complex-number form of
RoFormer, ALiBi's slopes against the paper's, T5's buckets against transformers' own function), its SDPA kernel to
the float64 reference (gradients included, patterns and blocks), and each model to the invariances of the memory:
chunked with memory equals the whole sequence in one pass, the key/value and ring memories give the hidden-state
memory's logits."""

import math
from unittest.mock import patch

import pytest
import torch
from support import in_segments, pattern, segments_and_steps

from longseq import ModelConfig, TransformerXLLM
from longseq.config import ConfigError
from longseq.config.stored import stored_weights
from longseq.model import KVMemory, Memory
from longseq.model.attention import RelativeMultiHeadAttention
from longseq.model.attention.kernels import blocked_attention, rel_shift_attention, sdpa_attention
from longseq.model.attention.module import plain_chunk
from longseq.model.attention.patterns import PatternMask
from longseq.model.attention.reference import reference_content_attention
from longseq.model.memory.context import HiddenContext
from longseq.model.positions import (
    RelativePositions,
    Shape,
    T5Bias,
    alibi_slopes,
    relative_distances,
    rotary_frequencies,
    t5_buckets,
)

ENCODINGS = ("rope", "alibi", "t5", "nope")
BASE = dict(vocab_size=30, n_layer=2, d_model=16, n_head=4, d_head=4, d_inner=32, dropout=0.0)


def model_for(pos: str, **extra) -> TransformerXLLM:
    torch.manual_seed(0)
    model = TransformerXLLM(ModelConfig(**{**BASE, "pos": pos, **extra})).double().eval()
    for module in model.modules():
        if isinstance(module, T5Bias):  # zeros at init: give the buckets something to say
            torch.nn.init.normal_(module.rel_bias, 0.0, 1.0)
        if isinstance(module, RelativeMultiHeadAttention):  # biases are zeros at init too
            for bias in (module.qkv_net.bias, module.o_net.bias):
                if bias is not None:
                    torch.nn.init.normal_(bias, 0.0, 0.5)
    return model


def test_rope_equals_the_complex_rotation_of_roformer():
    """RoFormer (Su et al., section 3.2): pair k of a head, as the complex number x_k + i x_{k+D/2}, is multiplied
    by exp(i m theta_k) at position m; the score of two rotated vectors depends only on their distance."""
    shape = Shape(16, 2, 8, rope_theta=500.0)
    layer = RelativeMultiHeadAttention(16, 2, 8, pos="rope", positions=shape).double()
    q, k = torch.randn(2, 1, 2, 3, 8, dtype=torch.float64).unbind(0)  # (B, H, T, D)
    key = torch.cat([torch.randn(1, 2, 4, 8, dtype=torch.float64), k], dim=2)  # 4 memory slots, then the segment
    rq, rk = layer.rel.rotate(q, key)
    freq = rotary_frequencies(shape, None, torch.float64)  # theta^(-2k/D)
    assert torch.allclose(freq, 500.0 ** (-torch.arange(0, 8, 2, dtype=torch.float64) / 8))

    def complex_rotation(x, positions):
        z = torch.complex(x[..., :4], x[..., 4:]) * torch.polar(
            torch.ones(4, dtype=torch.float64), positions[:, None] * freq
        )
        return torch.cat([z.real, z.imag], dim=-1)

    assert torch.allclose(rk, complex_rotation(key, torch.arange(7.0, dtype=torch.float64)), atol=1e-12)
    assert torch.allclose(rq, complex_rotation(q, torch.arange(4.0, 7.0, dtype=torch.float64)), atol=1e-12)
    shifted_q, shifted_k = layer.rel.rotate(q, torch.cat([torch.randn(1, 2, 9, 8, dtype=torch.float64), key], 2))
    assert torch.allclose(shifted_q @ shifted_k[:, :, 9:].transpose(-1, -2), rq @ rk.transpose(-1, -2), atol=1e-12)


def test_rope_scalings_stretch_the_positions_or_the_base():
    plain = rotary_frequencies(Shape(8, 1, 8), None, torch.float64)
    linear = rotary_frequencies(Shape(8, 1, 8, rope_scaling="linear", rope_factor=4.0), None, torch.float64)
    ntk = rotary_frequencies(Shape(8, 1, 8, rope_scaling="ntk", rope_factor=4.0), None, torch.float64)
    assert torch.allclose(linear, plain / 4)  # position m reads as m / 4
    assert torch.allclose(ntk, (10000.0 * 4.0 ** (8 / 6)) ** (-torch.arange(0, 8, 2, dtype=torch.float64) / 8))
    assert torch.isclose(ntk[0], plain[0]) and torch.isclose(ntk[-1], plain[-1] / 4)  # highest kept, lowest / 4


ROPE_KINDS = [  # transformers' rope_parameters, and longseq's options for them
    ({"rope_type": "linear", "factor": 4.0}, {"rope_scaling": "linear", "rope_factor": 4.0}),
    ({"rope_type": "dynamic", "factor": 3.0}, {"rope_scaling": "dynamic", "rope_factor": 3.0, "rope_original_len": 64}),
    (
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        },
        {"rope_scaling": "llama3", "rope_factor": 8.0, "rope_original_len": 16},
    ),
    (
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},
        {"rope_scaling": "yarn", "rope_factor": 4.0, "rope_original_len": 16},
    ),
    (
        {
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 32,
            "beta_fast": 16.0,
            "beta_slow": 2.0,
            "truncate": False,
            "attention_factor": 1.3,
        },
        {
            "rope_scaling": "yarn",
            "rope_factor": 4.0,
            "rope_original_len": 32,
            "rope_beta_fast": 16.0,
            "rope_beta_slow": 2.0,
            "rope_truncate": False,
            "rope_attention_factor": 1.3,
        },
    ),
]


@pytest.mark.parametrize("theirs, ours", ROPE_KINDS, ids=lambda kind: kind.get("rope_type", ""))
@pytest.mark.parametrize("klen", [10, 64, 200])
def test_rope_scalings_equal_transformers_formulas(theirs, ours, klen):
    """Each rope scaling's frequencies and attention factor are those of transformers' ``modeling_rope_utils`` (its
    ``ROPE_INIT_FUNCTIONS``, computed in float64); ``dynamic``'s follow the number of keys beyond the original
    context (transformers' sequence length)."""
    transformers = pytest.importorskip("transformers")
    from support import wide_transformers
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = transformers.LlamaConfig(
        hidden_size=64,
        num_attention_heads=4,
        max_position_embeddings=64,
        rope_parameters={"rope_theta": 500.0, **theirs},
    )
    with wide_transformers():
        inv_freq, factor = ROPE_INIT_FUNCTIONS[theirs["rope_type"]](config, "cpu", seq_len=klen)
    shape = Shape(64, 4, 16, rope_theta=500.0, **ours)
    layer = RelativeMultiHeadAttention(64, 4, 16, pos="rope", positions=shape)
    assert inv_freq.dtype == torch.float64
    assert torch.allclose(rotary_frequencies(shape, None, torch.float64, klen), inv_freq, rtol=1e-14, atol=0)
    assert layer.rel.attention_factor == pytest.approx(factor, rel=1e-15)


def test_every_rope_scaling_the_config_names_is_implemented():
    from longseq.config.model import ROPE_SCALINGS as NAMED
    from longseq.model.positions import ROPE_SCALINGS

    assert tuple(ROPE_SCALINGS) == NAMED


def test_alibi_slopes_are_the_papers():
    """Press et al. (2022), section 3: for 8 heads 1/2, 1/4, ..., 1/256; otherwise the slopes of the closest power
    of 2, then every other one of twice that many (the authors' get_slopes)."""
    assert alibi_slopes(8) == [2.0**-i for i in range(1, 9)]
    eight, sixteen = alibi_slopes(8), alibi_slopes(16)
    assert alibi_slopes(12) == eight + sixteen[0::2][:4]


@pytest.mark.parametrize("bidirectional", [False, True])
def test_t5_buckets_equal_transformers_function(bidirectional):
    t5 = pytest.importorskip("transformers.models.t5.modeling_t5")
    distances = torch.arange(-300, 301)  # query - key
    ours = t5_buckets(distances.float(), 32, 128, bidirectional)
    theirs = t5.T5Attention._relative_position_bucket(-distances, bidirectional, 32, 128)  # key - query
    mask = slice(None) if bidirectional else distances >= 0
    assert torch.equal(ours[mask], theirs[mask])


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("name, mlen, qlen", [("full", 5, 7), ("full", 0, 6), ("window", 6, 9), ("strided", 3, 8)])
def test_sdpa_kernel_equals_the_reference_with_gradients(name, mlen, qlen, with_bias):
    torch.manual_seed(0)
    q = torch.randn(2, 3, qlen, 4, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(2, 3, mlen + qlen, 4, dtype=torch.float64, requires_grad=True) for _ in range(2))
    bias = torch.randn(3, mlen + qlen + 1, dtype=torch.float64, requires_grad=True) if with_bias else None
    zeros = torch.zeros(3, 4, dtype=torch.float64)
    mask = PatternMask(pattern(name), qlen, mlen)
    inputs = [t for t in (q, k, v, bias) if t is not None]
    fast = sdpa_attention(q, k, v, bias, zeros, zeros, mask, 0.0, False)
    slow = reference_content_attention(q, k, v, bias, zeros, zeros, mask.forbidden(), 0.0, False)
    weights = torch.randn_like(fast)
    for a, b in zip(
        torch.autograd.grad((fast * weights).sum(), inputs), torch.autograd.grad((slow * weights).sum(), inputs)
    ):
        assert torch.allclose(a, b, atol=1e-10)
    assert torch.allclose(fast, slow, atol=1e-12)


@pytest.mark.parametrize("pos", ENCODINGS)
@pytest.mark.parametrize("kernel, chunk", [("sdpa", 0), ("sdpa", 4), ("reference", 0)])
def test_each_kernel_of_a_layer_equals_the_reference_layer(pos, kernel, chunk):
    """The layer with the SDPA kernel, whole or in blocks of 4 queries, gives the reference kernel's output and
    gradients over a memory (a window pattern reaches part of it)."""

    def run(kernel, chunk):
        torch.manual_seed(0)
        layer = RelativeMultiHeadAttention(16, 4, 4, kernel=kernel, chunk=chunk, pos=pos, n_kv_head=2).double()
        if pos == "t5":
            torch.nn.init.normal_(layer.rel.rel_bias)
        hidden = torch.randn(2, 9, 16, dtype=torch.float64, requires_grad=True)
        memory = torch.randn(2, 5, 16, dtype=torch.float64)
        positions = RelativePositions(relative_distances(14, -1), None, torch.float64)
        zeros = torch.zeros(4, 4, dtype=torch.float64)
        out, _, _ = layer(hidden, positions, zeros, zeros, PatternMask(pattern("window"), 9, 5), HiddenContext(memory))
        return out, torch.autograd.grad(out.square().sum(), [hidden, *layer.parameters()])

    (fast, fast_grads), (slow, slow_grads) = run(kernel, chunk), run("reference", 0)
    assert torch.allclose(fast, slow, atol=1e-12)
    for a, b in zip(fast_grads, slow_grads):
        assert torch.allclose(a, b, atol=1e-10)


def test_full_attention_on_sdpa_runs_in_blocks_of_128_queries_on_a_cpu_and_equals_the_reference():
    """Over every key (full causal attention) SDPA takes blocks of at least 128 queries on a CPU (and none on a GPU,
    where the lower-right causal mask reaches FlashAttention whole); 130 queries run as 128 + 2, with the
    reference's output and gradients."""
    assert plain_chunk(sdpa_attention, 64, "cpu") == 128 and plain_chunk(sdpa_attention, 64, "cuda") == 0
    assert plain_chunk(sdpa_attention, 0, "cpu") == 0 and plain_chunk(rel_shift_attention, 64, "cpu") == 64

    def run(kernel):
        torch.manual_seed(0)
        layer = RelativeMultiHeadAttention(8, 2, 4, kernel=kernel, chunk=64, pos="rope", n_kv_head=1).double()
        hidden = torch.randn(1, 130, 8, dtype=torch.float64, requires_grad=True)
        memory = torch.randn(1, 5, 8, dtype=torch.float64)
        positions = RelativePositions(relative_distances(135, -1), None, torch.float64)
        zeros = torch.zeros(2, 4, dtype=torch.float64)
        out, _, _ = layer(hidden, positions, zeros, zeros, PatternMask(pattern("full"), 130, 5), HiddenContext(memory))
        return out, torch.autograd.grad(out.square().sum(), [hidden, *layer.parameters()])

    calls = []
    with patch("longseq.model.attention.module.blocked_attention", wraps=blocked_attention) as spy:
        (fast, fast_grads), (slow, slow_grads) = run("sdpa"), run("reference")
        calls = [c.args[1] for c in spy.call_args_list]
    assert calls[0] == 128  # sdpa's blocks (the reference layer keeps the config's 64)
    assert torch.allclose(fast, slow, atol=1e-12)
    for a, b in zip(fast_grads, slow_grads):
        assert torch.allclose(a, b, atol=1e-10)


@pytest.mark.parametrize("pos", ENCODINGS)
@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"n_kv_head": 1, "qk_norm": True},
        {"same_length": True, "pre_lnorm": True},
        {"n_kv_head": 2, "qkv_bias": True, "attn_out_bias": True},
    ],
)
def test_chunked_with_memory_equals_the_whole_sequence_and_every_memory_agrees(pos, extra):
    """With a memory as long as the text, segments of 4 with the memory carried give the logits of one pass over
    the whole; a key/value memory (keys stored before rotation, projected with the keys' own bias) and generation's
    ring give the same logits."""
    model = model_for(pos, mem_len=24, **extra)
    x = torch.randint(0, 30, (2, 24))
    with torch.no_grad():
        chunked, stepped, _ = segments_and_steps(model, x, 4)
        kv, mems = in_segments(model, x, 4, Memory.empty(KVMemory))
        whole = model(x).logits
    assert torch.allclose(chunked, whole, atol=1e-10)
    assert torch.allclose(stepped, whole, atol=1e-10)
    assert torch.allclose(kv, chunked, atol=1e-10)
    if extra.get("n_kv_head"):
        assert mems.layers[0].keys.size(1) == extra["n_kv_head"]  # the cache holds the shared key/value heads only


@pytest.mark.parametrize("pos", ENCODINGS)
def test_a_compressed_memory_and_memory_tokens_stay_causal(pos):
    """A compressed memory (one position per compressed slot) and memory tokens: a later token changes no earlier
    logit, in the segment or in the segments after it, and a short memory differs from the whole pass."""
    model = model_for(pos, mem_len=4, cmem_len=3, cmem_rate=2, mem_tokens=2)
    x = torch.randint(0, 30, (2, 20))
    y = x.clone()
    y[:, 13:] = (y[:, 13:] + 1) % 30

    with torch.no_grad():
        (a, _), (b, _) = in_segments(model, x, 4), in_segments(model, y, 4)
    assert torch.equal(a[:, :13], b[:, :13]) and not torch.allclose(a[:, 13:], b[:, 13:])


def test_a_grouped_query_model_equals_full_heads_with_repeated_key_value_weights():
    """n_kv_head=2 of 4 heads is multi-head attention whose heads 2h and 2h+1 share key and value weights."""
    grouped = model_for("rope", n_kv_head=2, mem_len=8)
    full = model_for("rope", mem_len=8)
    state = grouped.state_dict()
    for i in range(2):
        w = state[f"transformer.stack.layers.{i}.dec_attn.qkv_net.weight"]
        q, k, v = w.split((16, 8, 8))
        k, v = (t.view(2, 4, 16).repeat_interleave(2, dim=0).reshape(16, 16) for t in (k, v))
        state[f"transformer.stack.layers.{i}.dec_attn.qkv_net.weight"] = torch.cat([q, k, v])
    full.load_state_dict(state)
    x = torch.randint(0, 30, (2, 10))
    with torch.no_grad():
        a, b = grouped(x[:, :5]), full(x[:, :5])
        assert torch.allclose(a.logits, b.logits, atol=1e-12)
        assert torch.allclose(grouped(x[:, 5:], a.mems).logits, full(x[:, 5:], b.mems).logits, atol=1e-12)


def test_qk_norm_normalises_every_query_and_key_head():
    layer = RelativeMultiHeadAttention(16, 4, 4, pos="nope", qk_norm=True).double()
    torch.nn.init.normal_(layer.q_norm.weight)
    torch.nn.init.normal_(layer.k_norm.weight)
    source = torch.randn(2, 5, 16, dtype=torch.float64)
    query, key, _ = layer.heads(source)
    raw_q, raw_k, _ = layer.qkv_net(source).view(2, 5, 3, 4, 4).permute(2, 0, 3, 1, 4)

    def rms(x, w):
        return x / torch.sqrt(x.square().mean(-1, keepdim=True) + 1e-5) * w

    assert torch.allclose(query, rms(raw_q, layer.q_norm.weight), atol=1e-12)
    assert torch.allclose(key, rms(raw_k, layer.k_norm.weight), atol=1e-12)


def test_alibi_scores_fall_by_the_slope_per_position_of_distance():
    """One head of equal keys: the probabilities over [memory; segment] are softmax(-slope * distance)."""
    layer = RelativeMultiHeadAttention(4, 1, 4, pos="alibi", kernel="sdpa").double()
    with torch.no_grad():
        layer.qkv_net.weight.zero_()
    probs = layer.probs(
        torch.randn(1, 3, 4, dtype=torch.float64),
        RelativePositions(relative_distances(8, -1), None, torch.float64),
        torch.zeros(1, 4),
        torch.zeros(1, 4),
        PatternMask(pattern("full"), 3, 5),
        HiddenContext(torch.randn(1, 5, 4, dtype=torch.float64)),
    )
    slope = alibi_slopes(1)[0]
    last = torch.softmax(-slope * torch.arange(7.0, -1, -1, dtype=torch.float64), dim=0)  # query 2 sees 8 keys
    assert torch.allclose(probs[0, 0, 2], last, atol=1e-12)
    assert math.isclose(slope, 2.0**-8)


def test_checkpoints_from_before_the_encodings_were_modules_load():
    model = model_for("sinusoidal", mem_len=4)
    state = model.state_dict()
    old = {k.replace(".rel.r_net.", ".r_net."): v for k, v in state.items()}
    assert any(".dec_attn.r_net." in k for k in old)
    fresh = TransformerXLLM(ModelConfig(**{**BASE, "mem_len": 4}))
    fresh.load_state_dict(stored_weights(model.config.to_dict(), old))  # as a checkpoint is read
    assert all(torch.equal(fresh.state_dict()[k].double(), v) for k, v in state.items())
    names = {"a.dec_attn.rel_table": 1, "a.dec_attn.r_net.weight": 2}
    assert stored_weights({}, names) == {"a.dec_attn.rel.rel_table": 1, "a.dec_attn.rel.r_net.weight": 2}


@pytest.mark.parametrize(
    "overrides, match",
    [
        ({"pos": "rope", "attn_impl": "rel_shift_x"}, "attn_impl"),
        ({"pos": "rope", "attn_impl": "flex"}, "attn_impl=flex"),
        ({"pos": "sinusoidal", "attn_impl": "sdpa"}, "attn_impl=sdpa"),
        ({"pos": "rope", "rope_scaling": "longrope"}, "rope_scaling"),
        ({"pos": "rope", "rope_scaling": "yarn"}, "rope_original_len"),
        ({"pos": "rope", "rope_factor": 0.5}, "rope_factor"),
        ({"n_kv_head": 3}, "n_kv_head"),
        ({"head_bias": False, "cutoffs": [10]}, "head_bias"),
    ],
)
def test_bad_position_and_head_options_are_named(overrides, match):
    with pytest.raises((ConfigError, ValueError), match=match):
        TransformerXLLM(ModelConfig(**{**BASE, "mem_len": 4, **overrides}))


def test_a_grouped_query_model_trains_a_learned_compressed_memory():
    """The attention-reconstruction loss reads the layer's key/value heads as grouped-query attention does: with
    key/value weights repeated per group it equals the full-head model's loss."""
    grouped = model_for("rope", n_kv_head=2, mem_len=4, cmem_len=2, cmem_rate=2, cmem_fn="conv")
    full = model_for("rope", mem_len=4, cmem_len=2, cmem_rate=2, cmem_fn="conv")
    state = grouped.state_dict()
    for i in range(2):
        name = f"transformer.stack.layers.{i}.dec_attn.qkv_net.weight"
        q, k, v = state[name].split((16, 8, 8))
        state[name] = torch.cat([q, *(t.view(2, 4, 16).repeat_interleave(2, 0).reshape(16, 16) for t in (k, v))])
    full.load_state_dict(state)
    grouped.train(), full.train()
    x = torch.randint(0, 30, (2, 12))
    mems_g = mems_f = None
    for lo in range(0, 12, 4):
        out_g, out_f = grouped(x[:, lo : lo + 4], mems_g), full(x[:, lo : lo + 4], mems_f)
        mems_g, mems_f = out_g.mems, out_f.mems
    assert out_g.aux_loss is not None and torch.allclose(out_g.aux_loss, out_f.aux_loss, atol=1e-12)


@pytest.mark.parametrize("pos, extra", [("rope", {"n_kv_head": 2, "qk_norm": True}), ("alibi", {}), ("t5", {})])
def test_the_transformers_export_carries_the_encodings(tmp_path, pos, extra):
    """Exported and loaded with AutoModelForCausalLM: the same logits in one pass, and greedy generation through
    its cache equals longseq's own segment-by-segment scores."""
    transformers = pytest.importorskip("transformers")
    import longseq.hf  # noqa: F401  (registers the model type)
    from longseq.interop.hf_longseq import export_longseq_hf

    model = model_for(pos, mem_len=8, **extra).float()
    export_longseq_hf(model, str(tmp_path / "hf"), segment_len=4)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf")).eval()
    x = torch.randint(0, 30, (2, 7))
    with torch.no_grad():
        assert torch.allclose(hf(x).logits, model(x).logits, atol=1e-5)
        tokens = hf.generate(x, max_new_tokens=5, do_sample=False, pad_token_id=0)
        scores, _ = in_segments(model, tokens[:, :-1], 1)  # longseq's own, one token at a time
    assert torch.equal(scores[:, 6:].argmax(-1), tokens[:, 7:])
