"""The block's options (norm, ff, bias, final_norm, attn_softcap, logit_softcap) and the llama-xl preset.

Each part is held to its formula written out here in float64 (RMSNorm, the gated feed-forwards of Shazeer (2020),
Gemma 2's soft cap on a loop over pairs), every kernel that caps the attention logits to the float64 reference
(outputs and gradients, over a memory, in blocks, on the banded and sparse paths and Flex's score_mod), and every
combination to the memory's invariances: chunked with memory equals the whole sequence, and the hidden-state,
key/value and ring memories give the same logits.  The options reach transformers' AutoModelForCausalLM, options
that do not apply are refused by name, and llama-xl trains from the command line and resumes bit for bit."""

import dataclasses
import math

import pytest
import torch
from support import (
    assert_names,
    assert_resumes_exactly,
    assert_same_run,
    in_segments,
    last_json,
    make_layer,
    pattern,
    raises_naming,
    run_layer,
    segments_and_steps,
)

from longseq import ModelConfig, TransformerXLLM
from longseq.cli import main
from longseq.config import ConfigError, DataConfig, RunConfig, TrainConfig, get_preset
from longseq.model import KVMemory, Memory, build_model
from longseq.model.adaptive import AdaptiveLogSoftmax
from longseq.model.attention import RelativeMultiHeadAttention
from longseq.model.attention.flex import flex_available
from longseq.model.attention.kernels import blocked_attention, rel_shift_attention
from longseq.model.attention.patterns import PatternMask
from longseq.model.attention.reference import attention_probs, causal_mask, content_probs, reference_attention
from longseq.model.layers import PositionwiseFF
from longseq.model.memory.context import HiddenContext
from longseq.model.positions import RelativePositions, relative_distances
from longseq.model.registry import ignored_options

BASE = dict(vocab_size=30, n_layer=2, d_model=16, n_head=4, d_head=4, d_inner=24, dropout=0.0)
CAP = 0.25  # below the kernel harness's typical scores (about 0.3-1): the cap bends them


def double_model(pos: str = "sinusoidal", **extra) -> TransformerXLLM:
    """A float64 model whose weights are large enough (init_std 0.3) that the caps change its outputs."""
    torch.manual_seed(0)
    return TransformerXLLM(ModelConfig(**{**BASE, "pos": pos, "init_std": 0.3, **extra})).double().eval()


# --- RMSNorm and the feed-forwards against their formulas --------------------------------------------------------


def test_rmsnorm_is_the_hand_formula_in_every_norm_of_the_model():
    """x / sqrt(mean(x^2) + eps) * g, no centring and no bias: the attention's, the feed-forward's and the final
    norm; every norm scale starts at 1 +- init_std (QK-norm's too)."""
    model = double_model(norm="rmsnorm", final_norm=True, pre_lnorm=True, pos="rope", qk_norm=True)
    norms = [model.transformer.final_norm]
    for layer in model.transformer.stack.layers:
        norms += [layer.dec_attn.layer_norm, layer.pos_ff.layer_norm, layer.dec_attn.q_norm]
    x = torch.randn(3, 5, 16, dtype=torch.float64) * 3 + 1
    for norm in norms:
        assert isinstance(norm, torch.nn.RMSNorm) and not [n for n, _ in norm.named_parameters() if "bias" in n]
        assert abs(float(norm.weight.detach().mean()) - 1) < 0.3
        if norm.weight.numel() == 16:
            expected = x / torch.sqrt(x.square().mean(-1, keepdim=True) + 1e-5) * norm.weight
            torch.testing.assert_close(norm(x), expected, rtol=0, atol=1e-12)


def naive_activation(name: str, gate: torch.Tensor) -> torch.Tensor:
    if name in ("relu",):
        return gate.clamp(min=0)
    if name in ("swiglu",):
        return gate / (1 + torch.exp(-gate))  # SiLU: x sigmoid(x)
    return 0.5 * gate * (1 + torch.erf(gate / math.sqrt(2)))  # the exact GELU


@pytest.mark.parametrize("ff", ["relu", "gelu", "swiglu", "geglu"])
@pytest.mark.parametrize("pre_lnorm", [False, True])
def test_each_feed_forward_is_its_naive_formula(ff, pre_lnorm):
    """relu and gelu: W2 act(W1 x + b1) + b2; swiglu and geglu (Shazeer, 2020): W2 (act(W1 x + b1) * (W3 x + b3))
    + b2, W1 and W3 the two halves of the first projection; then the residual and the norm, before or after."""
    torch.manual_seed(0)
    block = PositionwiseFF(8, 12, 0.0, pre_lnorm, 1e-5, ff=ff).double()
    for param in block.parameters():
        torch.nn.init.normal_(param, 0.0, 0.5)
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    first, second = block.core_net[0], block.core_net[3]
    assert first.out_features == (24 if ff in ("swiglu", "geglu") else 12) and second.in_features == 12  # d_inner
    source = block.layer_norm(x) if pre_lnorm else x
    projected = source @ first.weight.T + first.bias
    if ff in ("swiglu", "geglu"):
        gate, value = projected[..., :12], projected[..., 12:]
        hidden = naive_activation(ff, gate) * value
    else:
        hidden = naive_activation(ff, projected)
    out = hidden @ second.weight.T + second.bias
    expected = x + out if pre_lnorm else block.layer_norm(x + out)
    torch.testing.assert_close(block(x), expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_bias_false_leaves_no_bias_in_any_layer(norm):
    """bias=False: no bias parameter in any layer (attention and mixer layers, feed-forwards, norms, the final
    norm); with bias=True the feed-forward's and LayerNorm's biases are exactly the difference in size."""
    extra = dict(norm=norm, final_norm=True, pos="rope", mixer=["attention", "conv"], d_inner=24)
    with_bias, without = double_model(**extra), double_model(bias=False, **extra)
    layers = [n for n, _ in without.transformer.named_parameters() if n.endswith("bias") and ".mixer." not in n]
    assert layers == []
    per_norm = 16 if norm == "layernorm" else 0
    ff_biases = 24 + 16
    # each layer: its feed-forward's two biases and two norms (attention's or the mixer's, the feed-forward's)
    expected = 2 * (ff_biases + 2 * per_norm) + per_norm  # and the final norm
    assert with_bias.num_parameters() - without.num_parameters() == expected


# --- the soft caps ---------------------------------------------------------------------------------------------


def test_the_references_cap_every_score_with_gemmas_formula():
    """softmax over the allowed keys of cap * tanh(s / cap), s the pair's score written out one pair at a time:
    (q_i + u).k_j + (q_i + v).W_R R_{i-j} over sqrt(D) (the relative family), q_i.k_j / sqrt(D) + bias_{i-j} (the
    content family)."""
    torch.manual_seed(0)
    heads, qlen, mlen, dim, cap = 2, 3, 2, 4, 0.7
    klen = qlen + mlen
    q, k = torch.randn(1, heads, qlen, dim, dtype=torch.float64) * 2, torch.randn(1, heads, klen, dim).double() * 2
    table, bias = torch.randn(heads, klen + 1, dim, dtype=torch.float64), torch.randn(heads, klen + 1).double()
    u, v = torch.randn(heads, dim, dtype=torch.float64), torch.randn(heads, dim, dtype=torch.float64)
    mask = causal_mask(qlen, mlen, None)
    relative, content = attention_probs(q, k, table, u, v, mask, cap), content_probs(q, k, bias, mask, cap)
    for h in range(heads):
        for i in range(qlen):
            keys = range(mlen + i + 1)  # causal: up to the query's own position
            row = qlen - i  # row T - i + j of the table holds the distance of pair (i, j)
            rel = [((q[0, h, i] + u[h]) @ k[0, h, j] + (q[0, h, i] + v[h]) @ table[h, row + j]) / 2 for j in keys]
            con = [q[0, h, i] @ k[0, h, j] / 2 + bias[h, row + j] for j in keys]
            for probs, scores in ((relative, rel), (content, con)):
                capped = torch.stack([cap * torch.tanh(s / cap) for s in scores])
                torch.testing.assert_close(probs[0, h, i, : len(keys)], torch.softmax(capped, 0), rtol=0, atol=1e-12)
                assert float(probs[0, h, i, len(keys) :].sum()) == 0.0


RELATIVE_CASES = [  # kernel, chunk, pattern, memory, queries: every path that caps the relative scores
    ("rel_shift", 0, "full", 5, 7),
    ("rel_shift", 4, "full", 5, 9),  # blocks of queries
    ("rel_shift", 4, "window", 6, 12),  # the banded kernel
    ("rel_shift", 4, "strided", 3, 12),  # the sparse pieces under one softmax
    ("rel_shift", 4, "global", 3, 12),  # ... with global columns and rows
    ("rel_shift", 4, "bigbird", 3, 12),
    ("flex", 0, "full", 5, 7),  # the score_mod
    ("flex", 0, "window", 6, 9),
]


@pytest.mark.parametrize("kernel, chunk, name, mlen, qlen", RELATIVE_CASES)
def test_every_relative_kernel_caps_the_scores_as_the_reference(kernel, chunk, name, mlen, qlen):
    """Outputs and every gradient (hidden, memory, u, v, weights) of the capped layer equal the capped float64
    reference; without gradients too (rel_shift's inference path leaves SDPA for the capped scores)."""
    if kernel == "flex" and not flex_available():
        pytest.skip("this PyTorch has no FlexAttention")
    p = pattern(name)
    flags = None
    if p.has_global:
        flags = torch.zeros(2, qlen, dtype=torch.bool)
        flags[0, :2] = flags[1, 7] = True
    fast = run_layer(make_layer(kernel, chunk, softcap=CAP), p, qlen, mlen, flags)
    slow = run_layer(make_layer("reference", 0, softcap=CAP), p, qlen, mlen, flags)
    assert_same_run(fast, slow)
    uncapped = run_layer(make_layer("reference", 0), p, qlen, mlen, flags)
    assert (uncapped[0] - slow[0]).abs().max() > 1e-2  # the cap bites at these scores
    inference = run_layer(make_layer(kernel, chunk, softcap=CAP), p, qlen, mlen, flags, grad=False)
    torch.testing.assert_close(inference[0], slow[0], rtol=0, atol=1e-10)


@pytest.mark.parametrize("name, chunk", [("full", 0), ("strided", 8)])
def test_half_precision_caps_the_scores_in_float32(name, chunk):
    """rel_shift's half-precision path (and the sparse pieces, upcast) cap the float32 scores: bf16 inputs give the
    capped float64 reference within bf16's rounding, and not the uncapped one."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, n, 4, dtype=torch.float64) * 2 for n in (24, 30, 30))
    rel, u = torch.randn(2, 31, 4, dtype=torch.float64), torch.randn(2, 4, dtype=torch.float64)
    w = torch.zeros(2, 4, dtype=torch.float64)
    mask = PatternMask(pattern(name), 24, 6)
    half = (t.bfloat16() for t in (q, k, v, rel, u, w))
    fast = blocked_attention(rel_shift_attention, chunk, *half, mask, 0.0, False, softcap=CAP)
    exact = reference_attention(q, k, v, rel, u, w, mask.forbidden(), 0.0, False, softcap=CAP)
    uncapped = reference_attention(q, k, v, rel, u, w, mask.forbidden(), 0.0, False)
    assert fast.dtype == torch.bfloat16
    torch.testing.assert_close(fast.double(), exact, rtol=0, atol=0.05)
    assert (uncapped - exact).abs().max() > 0.2


@pytest.mark.parametrize("pos", ["rope", "alibi", "t5", "nope"])
@pytest.mark.parametrize("chunk", [0, 4])
def test_the_content_family_caps_on_the_reference_whole_or_in_blocks(pos, chunk):
    """``auto`` chooses the reference kernel for a capped content layer (SDPA has no hook for the scores); in blocks
    of 4 queries over a memory it equals the whole reference, gradients included, and differs from the uncapped."""

    def run(chunk, cap):
        torch.manual_seed(0)
        layer = RelativeMultiHeadAttention(16, 4, 4, chunk=chunk, pos=pos, n_kv_head=2, softcap=cap).double()
        assert layer.kernel.__name__ == ("reference_content_attention" if cap else "sdpa_attention")
        if pos == "t5":
            torch.nn.init.normal_(layer.rel.rel_bias)
        hidden = torch.randn(2, 9, 16, dtype=torch.float64, requires_grad=True)
        memory = torch.randn(2, 5, 16, dtype=torch.float64, requires_grad=True)
        positions = RelativePositions(relative_distances(14, -1), None, torch.float64)
        zeros = torch.zeros(4, 4, dtype=torch.float64)
        out, _, _ = layer(hidden, positions, zeros, zeros, PatternMask(pattern("window"), 9, 5), HiddenContext(memory))
        return out, torch.autograd.grad(out.square().sum(), [hidden, memory, *layer.parameters()])

    (fast, fast_grads), (slow, slow_grads) = run(chunk, CAP), run(0, CAP)
    torch.testing.assert_close(fast, slow, rtol=0, atol=1e-12)
    for a, b in zip(fast_grads, slow_grads):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)
    assert (run(0, 0.0)[0] - slow).abs().max() > 1e-3


@pytest.mark.parametrize("name", ["sdpa", "rel_shift"])  # both name sdpa_attention for the content family
def test_a_layer_that_caps_is_refused_sdpa_when_it_is_built(name):
    """SDPA does not check the cap on every call: the layer's kernel choice is the one guard, naming the kernel."""
    with pytest.raises(ValueError, match=f"attn_impl={name} runs sdpa_attention.*attn_softcap"):
        RelativeMultiHeadAttention(16, 4, 4, pos="rope", kernel=name, softcap=CAP)
    assert RelativeMultiHeadAttention(16, 4, 4, pos="rope", kernel=name).kernel.__name__ == "sdpa_attention"


@pytest.mark.parametrize("cutoffs", [[], [7, 15]])
def test_logit_softcap_caps_each_clusters_logits_before_its_softmax(cutoffs):
    """Without clusters the logits are cap * tanh(z / cap); with clusters log p(token) is the head's log-softmax of
    its capped logits (its cluster logits included) plus the tail's log-softmax of its own capped logits, and the
    NLL reads the same numbers."""
    torch.manual_seed(0)
    plain = AdaptiveLogSoftmax(30, 8, 8, cutoffs, 1).double()
    capped = AdaptiveLogSoftmax(30, 8, 8, cutoffs, 1, softcap=1.5).double()
    for param in plain.parameters():
        torch.nn.init.normal_(param, 0.0, 1.0)
    capped.load_state_dict(plain.state_dict())
    hidden, target = torch.randn(6, 8, dtype=torch.float64), torch.randint(0, 30, (6,))

    def cap(z):
        return 1.5 * torch.tanh(z / 1.5)

    weight, bias = plain.out_layers[0].weight, plain.out_layers[0].bias
    if not cutoffs:
        torch.testing.assert_close(capped.logits(hidden), cap(hidden @ weight.T + bias), rtol=0, atol=1e-12)
        expected = torch.log_softmax(cap(hidden @ weight.T + bias), -1)
    else:
        head_w = torch.cat([weight[:7], plain.cluster_weight])
        head = torch.log_softmax(cap(hidden @ head_w.T + torch.cat([bias[:7], plain.cluster_bias])), -1)
        parts = [head[:, :7]]
        for i, (lo, hi) in enumerate([(7, 15), (15, 30)]):
            tail = torch.log_softmax(cap(hidden @ weight[lo:hi].T + bias[lo:hi]), -1)
            parts.append(head[:, 7 + i, None] + tail)
        expected = torch.cat(parts, -1)
    torch.testing.assert_close(capped.log_prob(hidden), expected, rtol=0, atol=1e-12)
    torch.testing.assert_close(
        capped.nll(hidden, target), -expected.gather(1, target[:, None])[:, 0], rtol=0, atol=1e-12
    )
    assert not torch.allclose(plain.log_prob(hidden), expected)


# --- every option with the memory --------------------------------------------------------------------------------

LLAMA_BLOCK = dict(norm="rmsnorm", ff="swiglu", bias=False, final_norm=True, pre_lnorm=True)
OPTION_SETS = [
    ("sinusoidal", LLAMA_BLOCK),
    ("rope", {**LLAMA_BLOCK, "n_kv_head": 2, "qk_norm": True}),
    ("sinusoidal", dict(ff="geglu", attn_softcap=0.5, logit_softcap=1.0)),
    ("sinusoidal", dict(ff="gelu", attn_softcap=0.5, attention=["window"], window=6, attn_chunk=4)),
    ("rope", dict(ff="gelu", attn_softcap=0.5, logit_softcap=1.0, same_length=True, attn_chunk=4)),
    ("alibi", dict(norm="rmsnorm", ff="swiglu", attn_softcap=0.5, attention=["window"], window=6)),
]


@pytest.mark.parametrize("pos, extra", OPTION_SETS)
def test_chunked_with_memory_equals_the_whole_and_every_memory_agrees(pos, extra):
    """With a memory as long as the text, segments of 4 give the logits of one pass over all 24 tokens; the ring
    (token by token) and the key/value memory give the same."""
    model = double_model(pos, mem_len=24, **extra)
    x = torch.randint(0, 30, (2, 24))
    with torch.no_grad():
        chunked, stepped, _ = segments_and_steps(model, x, 4)
        kv, _ = in_segments(model, x, 4, Memory.empty(KVMemory))
        whole = model(x).logits
    torch.testing.assert_close(chunked, whole, rtol=0, atol=1e-10)
    torch.testing.assert_close(stepped, whole, rtol=0, atol=1e-10)
    torch.testing.assert_close(kv, whole, rtol=0, atol=1e-10)


@pytest.mark.parametrize("pos", ["sinusoidal", "rope"])
def test_the_attention_mass_and_the_probabilities_a_layer_reports_are_capped(pos):
    """What else reads the scores caps them too: the attention mass of every key (memory pruning) is the capped
    probabilities of ``probs`` (the reference) summed over heads and queries, and differs from the uncapped mass."""
    torch.manual_seed(0)
    hidden, memory = torch.randn(2, 6, 16, dtype=torch.float64), torch.randn(2, 5, 16, dtype=torch.float64)
    positions = RelativePositions(relative_distances(11, -1), None, torch.float64)
    if pos == "sinusoidal":
        positions = RelativePositions(positions.distances, torch.randn(12, 16, dtype=torch.float64), torch.float64)
    u, v = torch.randn(4, 4, dtype=torch.float64), torch.randn(4, 4, dtype=torch.float64)
    args = (hidden, positions, u, v, PatternMask(pattern("full"), 6, 5))
    masses = []
    for cap in (CAP, 0.0):
        torch.manual_seed(1)
        layer = RelativeMultiHeadAttention(16, 4, 4, pos=pos, softcap=cap).double()
        _, _, mass = layer(*args, HiddenContext(memory, with_mass=True))
        torch.testing.assert_close(mass, layer.probs(*args, HiddenContext(memory)).sum((1, 2)), rtol=0, atol=1e-12)
        masses.append(mass)
    assert (masses[0] - masses[1]).abs().max() > 1e-2


def test_a_pre_rmsnorm_model_trains_a_learned_compressed_memory():
    """The attention-reconstruction loss normalises the compressor's inputs with the layer's RMSNorm (detached)."""
    x = torch.randint(0, 30, (2, 16))
    model = double_model(mem_len=4, cmem_len=2, cmem_rate=2, cmem_fn="conv", norm="rmsnorm", pre_lnorm=True).train()
    mems = None
    for lo in range(0, 16, 4):
        out = model(x[:, lo : lo + 4], mems)
        mems = out.mems
    out.aux_loss.backward()
    compressor = model.transformer.stack.memory.compression.compressors[0].conv.weight
    norm = model.transformer.stack.layers[0].dec_attn.layer_norm
    assert isinstance(norm, torch.nn.RMSNorm) and norm.weight.grad is None  # the norm is read, not trained by it
    assert compressor.grad is not None and compressor.grad.abs().max() > 0


# --- options that do not apply, and names ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides, words",
    [
        ({"norm": "rms"}, ["norm", "rmsnorm"]),
        ({"ff": "swish"}, ["ff", "swiglu"]),
        ({"attn_softcap": -1.0}, ["attn_softcap", ">= 0"]),
        ({"logit_softcap": -0.5}, ["logit_softcap"]),
        ({"pos": "rope", "attn_softcap": 30.0, "attn_impl": "sdpa"}, ["attn_impl=sdpa", "attn_softcap", "reference"]),
        ({"pos": "alibi", "attn_softcap": 30.0, "attn_impl": "rel_shift"}, ["attn_softcap", "no hook"]),
    ],
)
def test_bad_block_options_are_named(overrides, words):
    with raises_naming(ConfigError, *words):
        build_model(ModelConfig(**{**BASE, **overrides}))


def test_options_a_component_does_not_read_are_refused_by_name(tmp_path, capsys):
    """The LSTM baseline reads none of the block's options; a stack without attention layers reads no
    attn_softcap; the command line refuses them by name."""
    lstm = ModelConfig(arch="lstm", ff="swiglu", norm="rmsnorm", bias=False, attn_softcap=2.0, logit_softcap=3.0)
    assert ignored_options(lstm) == ["norm=rmsnorm", "ff=swiglu", "bias=False", "attn_softcap=2.0", "logit_softcap=3.0"]
    assert ignored_options(ModelConfig(mixer=["gla"], ff="swiglu", norm="rmsnorm", attn_softcap=2.0)) == [
        "attn_softcap=2.0"
    ]
    assert main(["train", "--out", str(tmp_path / "r"), "--quiet", "--set", "arch=lstm", "ff=swiglu"]) == 2
    assert_names(capsys.readouterr().err, "ff=swiglu")


@pytest.mark.parametrize("option", [{"norm": "rmsnorm"}, {"ff": "geglu"}, {"bias": False}, {"logit_softcap": 5.0}])
def test_the_transfo_xl_format_refuses_a_block_it_cannot_hold(option):
    from longseq.interop.transfo_xl import ConversionError, hf_config_from_model

    key, value = next(iter(option.items()))
    with raises_naming(ConversionError, "TransfoXL", f"{key}={value}"):
        hf_config_from_model(ModelConfig(**BASE, **option))


def test_checkpoints_and_configs_without_the_options_read_as_the_papers_block():
    config = ModelConfig(**BASE).to_dict()
    for key in ("norm", "ff", "bias", "final_norm", "attn_softcap", "logit_softcap"):
        del config[key]
    old = ModelConfig.from_dict(config)
    assert (old.norm, old.ff, old.bias, old.final_norm, old.attn_softcap, old.logit_softcap) == (
        "layernorm",
        "relu",
        True,
        False,
        0.0,
        0.0,
    )
    model = TransformerXLLM(old)
    assert isinstance(model.transformer.stack.layers[0].pos_ff.core_net[1], torch.nn.ReLU)
    assert isinstance(model.transformer.stack.layers[0].dec_attn.layer_norm, torch.nn.LayerNorm)
    assert model.transformer.final_norm is None


# --- transformers --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "pos, extra",
    [
        ("sinusoidal", {}),  # the capped rel_shift kernel
        ("rope", {"n_kv_head": 2, "qk_norm": True}),  # the capped content reference
    ],
)
def test_the_transformers_export_carries_the_block(tmp_path, pos, extra):
    """RMSNorm, SwiGLU, no biases, a final norm and both caps, exported and loaded with AutoModelForCausalLM: the
    same logits in one pass, and greedy generation through its cache equals longseq's own segment-by-segment
    scores."""
    transformers = pytest.importorskip("transformers")
    import longseq.hf  # noqa: F401  (registers the model type)
    from longseq.interop.hf_longseq import export_longseq_hf

    options = {**LLAMA_BLOCK, "attn_softcap": 0.5, "logit_softcap": 2.0, **extra}
    model = double_model(pos, mem_len=12, **options).float()  # a memory as long as prompt and tokens: one context
    export_longseq_hf(model, str(tmp_path / "hf"), segment_len=4)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf")).eval()
    assert hf.model.config == model.config
    x = torch.randint(0, 30, (2, 7))
    with torch.no_grad():
        torch.testing.assert_close(hf(x).logits, model(x).logits, rtol=0, atol=1e-5)
        last = hf(x, output_hidden_states=True).hidden_states[-1]  # after the final norm, as the head reads it
        torch.testing.assert_close(model.crit.logits(last.reshape(14, 16)).view(2, 7, 30), model(x).logits)
        tokens = hf.generate(x, max_new_tokens=5, do_sample=False, pad_token_id=0)
        scores, _ = in_segments(model, tokens[:, :-1], 1)  # longseq's own, one token at a time
    assert torch.equal(scores[:, 6:].argmax(-1), tokens[:, 7:])


# --- the llama-xl preset -------------------------------------------------------------------------------------------


def test_llama_xl_is_the_default_presets_run_with_todays_block_at_its_size():
    """Only the model differs from the default preset (data and training recipe are the same), and its parameter
    count at the bundled corpus's 65 characters is within 0.1% of the default's."""
    default, llama = get_preset("tiny-shakespeare"), get_preset("llama-xl")
    assert llama.data == default.data and llama.train == default.train
    m = llama.model
    assert (m.positions.pos, m.norm, m.ff, m.bias, m.pre_lnorm, m.final_norm) == (
        "rope",
        "rmsnorm",
        "swiglu",
        False,
        True,
        True,
    )
    assert 0 < m.n_kv_head < m.n_head and m.memory.mem_len == default.model.memory.mem_len
    sizes = [TransformerXLLM(r.model.replace(vocab_size=65)).num_parameters() for r in (default, llama)]
    assert abs(sizes[1] / sizes[0] - 1) < 1e-3 and ignored_options(llama.model.replace(vocab_size=65)) == []


def test_llama_xl_trains_from_the_command_line_and_resumes_bit_for_bit(tmp_path, capsys):
    """``longseq train --preset llama-xl`` trains, evaluates and generates on the bundled corpus; stopped and
    resumed, its training gives the uninterrupted run's losses bit for bit (the key/value heads in the memory)."""
    short = ["max_steps=3", "eval_interval=3", "eval_max_segments=2", "batch_size=2", "tgt_len=16", "eval_tgt_len=16"]
    out = str(tmp_path / "cli")
    assert main(["train", "--preset", "llama-xl", "--out", out, "--json", "--quiet", "--set", *short]) == 0
    assert math.isfinite(last_json(capsys)["loss"])
    assert main(["eval", "--checkpoint", f"{out}/best", "--json", "--quiet", "--set", "max_segments=2"]) == 0
    assert math.isfinite(last_json(capsys)["bpc"])
    args = ["generate", "--checkpoint", f"{out}/best", "--prompt", "ROMEO:", "--max-new-tokens", "6", "--json"]
    assert main(args) == 0 and len(last_json(capsys)["text"]) == 6

    def run():
        config = get_preset("llama-xl")  # dropout 0.1: resumed with the random state
        data = {**config.data.to_dict(), "tgt_len": 8, "batch_size": 2, "eval_tgt_len": 8}
        train = {**config.train.to_dict(), "max_steps": 6, "eval_interval": 3, "eval_max_segments": 2}
        return dataclasses.replace(config, data=DataConfig.from_dict(data), train=TrainConfig.from_dict(train))

    assert_resumes_exactly(run, tmp_path, stop_after=3)


def test_a_soft_cap_beyond_the_largest_number_of_its_dtype_is_refused_by_name_not_a_nan_loss(tmp_path, capsys):
    """attn_softcap=3.5e38 is infinite in float32: c * tanh(x / c) = inf * 0 made every score NaN, and training
    stopped with the NaN guard's advice to lower the learning rate.  float32's largest number still caps (finite
    logits); beyond it, the config names the option, here and on the command line; under precision=fp16 the
    attention scores are float16, whose largest number is 65,504."""
    from longseq.config import RunConfig
    from longseq.config.checks import check_run
    from longseq.model.block import softcap

    scores = torch.tensor([1.0, -3.0, 40.0])
    assert softcap(scores, 3.5e38).isnan().all() and torch.allclose(softcap(scores, 3.4e38), scores)  # why the bound
    torch.manual_seed(0)
    edge = TransformerXLLM(ModelConfig(**{**BASE, "attn_softcap": 3.4e38, "logit_softcap": 3.4e38}))
    assert edge(torch.randint(0, BASE["vocab_size"], (2, 6))).logits.isfinite().all()
    for name in ("attn_softcap", "logit_softcap"):
        with raises_naming(ConfigError, name, "3.5e+38", "float32", "NaN", "0 for no cap"):
            ModelConfig(**{**BASE, name: 3.5e38})
    assert main(["train", "--out", str(tmp_path / "r"), "--quiet", "--set", "attn_softcap=1e39"]) == 2
    assert_names(capsys.readouterr().err, "attn_softcap=1e+39", "float32")
    fp16 = RunConfig(ModelConfig(**{**BASE, "attn_softcap": 1e5}), DataConfig(), TrainConfig(precision="fp16"))
    with raises_naming(ConfigError, "attn_softcap", "precision=fp16", "float16", "65504"):
        check_run(fp16)
    check_run(RunConfig(fp16.model.replace(attn_softcap=65504.0), fp16.data, fp16.train))
    check_run(RunConfig(fp16.model, fp16.data, fp16.train.replace(precision="bf16")))  # bfloat16: float32's range


def test_a_gated_feed_forward_at_the_presets_width_says_the_model_grows_and_names_the_d_inner_that_keeps_it(
    tmp_path, capsys
):
    """``ff=swiglu`` with the default d_inner grew the model from 865,217 to 1,129,409 parameters without a word,
    where llama-xl resizes d_inner to keep the size.  A new run says it, with the growth the built models have, and
    names the d_inner that keeps the size; nothing is said when d_inner was chosen with the gate, for an ungated
    ff, or over a preset that is gated already."""
    from longseq.config import RunConfig
    from longseq.train.config_check import follow_changes, parameter_count

    preset = get_preset("tiny-shakespeare")
    base = RunConfig(preset.model.replace(vocab_size=65), preset.data, preset.train)
    run = RunConfig(base.model.replace(ff="swiglu"), base.data, base.train)
    said = [m for m in follow_changes(run, base)[1] if m.startswith("ff=")]
    plain, gated = parameter_count(base.model), parameter_count(run.model)
    assert (plain, gated) == (865_217, 1_129_409)  # the figures the issue measured
    assert len(said) == 1 and f"{plain:,} -> {gated:,}" in said[0] and f"{gated - plain:,}" in said[0]
    keep = int(said[0].split("set d_inner=")[1].split()[0])
    per_unit = parameter_count(run.model.replace(d_inner=keep + 1)) - parameter_count(run.model.replace(d_inner=keep))
    assert abs(parameter_count(run.model.replace(d_inner=keep)) - plain) <= per_unit / 2  # the closest width
    geglu = RunConfig(base.model.replace(ff="geglu"), base.data, base.train)
    assert any(m.startswith("ff=geglu") for m in follow_changes(geglu, base)[1])
    quiet = [
        RunConfig(base.model.replace(ff="swiglu", d_inner=341), base.data, base.train),  # chosen with the gate
        RunConfig(base.model.replace(ff="gelu"), base.data, base.train),
    ]
    llama = get_preset("llama-xl")
    quiet.append(RunConfig(llama.model.replace(ff="geglu"), llama.data, llama.train))
    for other, over in zip(quiet, (base, base, llama)):
        assert not [m for m in follow_changes(other, over)[1] if m.startswith("ff=")]
    argv = ["train", "--out", str(tmp_path / "r"), "--quiet", "--set", "ff=swiglu", "max_steps=1", "eval_interval=1",
            "eval_max_segments=1", "n_layer=1", "d_model=16", "n_head=2", "d_head=8", "batch_size=2", "tgt_len=8",
            "eval_tgt_len=8", "mem_len=8"]  # fmt: skip
    assert main(argv) == 0
    assert_names(capsys.readouterr().err, "ff=swiglu", "d_inner=512", "grows by", "set d_inner=")


def test_the_preset_options_a_stack_does_not_read_are_said_as_dropped(tmp_path, capsys):
    """``--preset llama-xl --set mixer=gla`` dropped the preset's attention options without a word (issue 60, item
    14): the run says each by name; what the user sets that is unread is still refused."""
    from longseq.config import get_preset
    from longseq.train.config_check import check_options_apply

    base = get_preset("llama-xl")
    run = RunConfig(base.model.replace(mixer=["gla"]), base.data, base.train)
    said = check_options_apply(run, base)
    assert len(said) == 1
    assert_names(said[0], "mixer=gla", "n_kv_head=2", "qk_norm=True", "positions.pos=rope", "preset", "dropped")
    assert check_options_apply(base, base) == []  # the preset as it is: nothing dropped
    argv = ["train", "--preset", "llama-xl", "--out", str(tmp_path / "r"), "--quiet", "--set", "mixer=gla"]
    assert main([*argv, "n_layer=1", "max_steps=1", "eval_max_segments=1"]) == 0
    assert_names(capsys.readouterr().err, "n_kv_head=2", "qk_norm=True", "positions.pos=rope", "dropped")
    with raises_naming(ConfigError, "attn_softcap=2.0"):  # the user's own: refused
        check_options_apply(RunConfig(run.model.replace(attn_softcap=2.0), base.data, base.train), base)
