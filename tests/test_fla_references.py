"""The linear-attention scans against code we did not write: flash-linear-attention's plain-PyTorch reference
functions (``fla/ops/*/naive.py``, from ``fla-core``, which the test extra installs: a test peer, not a dependency;
skipped without it).

``import fla`` imports its Triton kernels, and triton is not installed on a CPU machine, so the reference files are
loaded by path; they import only torch and einops.  Those that keep the input's dtype (``naive_chunk_linear_attn``,
``delta_rule_chunkwise``, ``delta_rule_parallel``) are held to 1e-10 in float64, gradients included; those that
compute in float32 whatever they are given (``naive_recurrent_linear_attn``, ``naive_recurrent_gla``,
``naive_retention``, ``naive_recurrent_simple_gla``, ``naive_chunk_simple_gla``, ``delta_rule_recurrence``) are
held, on float32 inputs, to our float64 result within float32's rounding (1e-5), gradients included.
"""

import importlib.util
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from longseq.model.mixers.delta_rule import delta_quadratic
from longseq.model.mixers.linear import LinearAttention
from longseq.model.mixers.linear_scan import scan_quadratic

B, T, H, K, V = 2, 64, 3, 4, 5  # fla's chunked references take whole chunks of 64 (linear) and 16 (delta)


def fla_naive(package: str):
    """``fla.ops.<package>.naive``, loaded from its file (skips the test when fla or einops is not installed)."""
    pytest.importorskip("einops")
    spec = importlib.util.find_spec("fla")  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("flash-linear-attention is not installed (pip install fla-core: its ops, einops only)")
    path = Path(spec.submodule_search_locations[0]) / "ops" / package / "naive.py"
    if not path.exists():
        pytest.skip(f"this flash-linear-attention has no {path}")
    module_spec = importlib.util.spec_from_file_location(f"fla_naive_{package}", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def inputs(dtype=torch.float64, length: int = T, seed: int = 0):
    torch.manual_seed(seed)
    q, k = torch.randn(B, length, H, K, dtype=dtype), torch.randn(B, length, H, K, dtype=dtype)
    v, state = torch.randn(B, length, H, V, dtype=dtype), torch.randn(B, H, K, V, dtype=dtype)
    return [t.requires_grad_() for t in (q, k, v, state)]


def grads(outputs, tensors):
    loss = sum((o.double() * torch.linspace(-1, 1, o.numel(), dtype=torch.float64).view_as(o)).sum() for o in outputs)
    return torch.autograd.grad(loss, tensors, retain_graph=True)


def assert_agree(ours, theirs, tensors, atol: float, rtol: float = 0.0):
    """Outputs and gradients agree (theirs cast to float64)."""
    theirs = [t.double() for t in theirs]
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol)
    for a, b in zip(grads(ours, tensors), grads(theirs, tensors)):
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol)


def test_linear_attention_against_fla_in_float64():
    """``naive_chunk_linear_attn`` (chunks of 64), plain and normalised (Katharopoulos's denominator), against the
    quadratic scan and our normalised form with elu + 1 features."""
    naive = fla_naive("linear_attn")
    q, k, v, _ = inputs()
    assert_agree([scan_quadratic(q, k, v)[0]], [naive.naive_chunk_linear_attn(q, k, v, scale=1.0)], [q, k, v], 1e-10)
    phi_q, phi_k = F.elu(q) + 1, F.elu(k) + 1
    mixer = LinearAttention(8, H, K, chunk=16, reset_every=0, rotary=False).double()
    ours = mixer.normalised(phi_q, phi_k, v, None, None, eps=1e-10)[0]
    theirs = naive.naive_chunk_linear_attn(phi_q, phi_k, v, scale=1.0, normalize=True)
    assert_agree([ours], [theirs], [q, k, v], 1e-10)


def test_the_delta_rule_against_fla_in_float64():
    """``delta_rule_chunkwise`` (the WY form, chunks of 16) and ``delta_rule_parallel``: outputs, the final state
    of the first, and the gradients of q, k, v and beta, against our whole-sequence triangular system."""
    naive = fla_naive("delta_rule")
    q, k_raw, v, _ = inputs()
    beta = torch.rand(B, T, H, dtype=torch.float64, requires_grad=True)
    k = F.normalize(k_raw, dim=-1)
    ours = delta_quadratic(q * K**-0.5, k, v, beta)  # fla scales the queries by 1 / sqrt(K) itself
    heads_first = [x.transpose(1, 2) for x in (q, k, v, beta)]  # fla's delta rule takes (B, H, T, .)
    o, state = naive.delta_rule_chunkwise(*heads_first, chunk_size=16)
    tensors = [q, k_raw, v, beta]
    assert_agree([ours[0], ours[1]], [o.transpose(1, 2), state], tensors, 1e-10)
    o, _ = naive.delta_rule_parallel(*heads_first, BM=32, BN=16)
    assert_agree([ours[0]], [o.transpose(1, 2)], tensors, 1e-10)


def float32_pair():
    """Inputs in float32 (what the float32 references compute in) and the same values in float64 (ours)."""
    small = inputs(torch.float32, length=19, seed=1)
    return small, [t.detach().double().requires_grad_() for t in small]


def assert_float32_agree(ours, ours_inputs, theirs, their_inputs):
    """Ours in float64 and theirs in float32 from the same values: outputs and gradients within float32 rounding."""
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(b.double(), a, rtol=1e-5, atol=1e-5)
    for a, b in zip(grads(ours, ours_inputs), grads(theirs, their_inputs)):
        torch.testing.assert_close(b.double(), a, rtol=1e-5, atol=1e-5)


def test_linear_attention_with_a_carried_state_against_fla_in_float32():
    """``naive_recurrent_linear_attn`` with an initial state: the outputs and the final state."""
    naive = fla_naive("linear_attn")
    (q, k, v, s), (q64, k64, v64, s64) = float32_pair()
    o, state = naive.naive_recurrent_linear_attn(q, k, v, scale=1.0, initial_state=s, output_final_state=True)
    assert_float32_agree(scan_quadratic(q64, k64, v64, None, s64), [q64, k64, v64, s64], [o, state], [q, k, v, s])


def test_gated_linear_attention_against_fla_in_float32():
    """``naive_recurrent_gla``: a log-decay per key channel, an initial state, queries scaled by 1 / sqrt(K)."""
    naive = fla_naive("gla")
    (q, k, v, s), (q64, k64, v64, s64) = float32_pair()
    g64 = F.logsigmoid(torch.randn(B, 19, H, K, dtype=torch.float64)).div(16).requires_grad_()
    g = g64.detach().float().requires_grad_()
    o, state = naive.naive_recurrent_gla(q, k, v, g, initial_state=s, output_final_state=True)
    ours = scan_quadratic(q64 * K**-0.5, k64, v64, g64, s64)
    assert_float32_agree(ours, [q64, k64, v64, g64, s64], [o, state], [q, k, v, g, s])


def test_retention_and_scalar_gated_attention_against_fla_in_float32():
    """``naive_retention``: RetNet's decays gamma_h = 1 - 2^(-5-h), queries scaled by 1 / sqrt(K) (no rotation: fla's
    retention op takes rotated inputs); ``naive_recurrent_simple_gla`` and ``naive_chunk_simple_gla``: a
    data-dependent log-decay per head with an initial state."""
    retention, simple = fla_naive("retention"), fla_naive("simple_gla")
    (q, k, v, s), (q64, k64, v64, s64) = float32_pair()
    gamma = 1 - 2.0 ** (-5.0 - torch.arange(H, dtype=torch.float64))
    ours = scan_quadratic(q64 * K**-0.5, k64, v64, gamma.log().expand(B, 19, H))[0]
    theirs = retention.naive_retention(*(x.transpose(1, 2) for x in (q, k, v))).transpose(1, 2)
    assert_float32_agree([ours], [q64, k64, v64], [theirs], [q, k, v])
    g64 = F.logsigmoid(torch.randn(B, 19, H, dtype=torch.float64)).requires_grad_()
    g = g64.detach().float().requires_grad_()
    ours = scan_quadratic(q64 * K**-0.5, k64, v64, g64, s64)
    theirs = simple.naive_recurrent_simple_gla(q, k, v, g, initial_state=s, output_final_state=True)
    assert_float32_agree(ours, [q64, k64, v64, g64, s64], theirs, [q, k, v, g, s])
    theirs = simple.naive_chunk_simple_gla(q, k, v, g, initial_state=s, output_final_state=True, chunk_size=8)
    assert_float32_agree(ours, [q64, k64, v64, g64, s64], theirs, [q, k, v, g, s])


def test_the_delta_rule_with_a_carried_state_against_fla_in_float32():
    """``delta_rule_recurrence`` with an initial state: outputs and the final state."""
    naive = fla_naive("delta_rule")
    (q, k_raw, v, s), (q64, k64_raw, v64, s64) = float32_pair()
    beta64 = torch.rand(B, 19, H, dtype=torch.float64, requires_grad=True)
    beta = beta64.detach().float().requires_grad_()
    k, k64 = F.normalize(k_raw, dim=-1), F.normalize(k64_raw, dim=-1)
    ours = delta_quadratic(q64 * K**-0.5, k64, v64, beta64, s64)
    o, state = naive.delta_rule_recurrence(*(x.transpose(1, 2) for x in (q, k, v, beta)), initial_state=s)
    assert_float32_agree(ours, [q64, k64_raw, v64, beta64, s64], [o.transpose(1, 2), state], [q, k_raw, v, beta, s])


def test_the_delta_mixer_is_fla_deltanet_layer_with_its_short_convolutions():
    """Our ``delta`` layer (``short_conv`` on, its default) against fla's ``DeltaNet.forward`` written out from
    torch's own depthwise ``conv1d`` (padding kernel - 1, cut to causal) and fla's ``delta_rule_chunkwise``:
    q, k, v = silu(conv(W h)); l2-normalised q and k; beta = sigmoid(W_b h); out = W_o RMSNorm(o).  Outputs and the
    gradients of the input and of every weight, at 1e-10 in float64."""
    from longseq.config.model import ModelConfig
    from longseq.model.mixers import MIXERS

    naive = fla_naive("delta_rule")
    torch.manual_seed(2)
    config = ModelConfig(vocab_size=8, d_model=12, n_head=H, d_head=K, conv_kernel=3, chunk=8)
    mixer = MIXERS["delta"].build(config).double()
    mixer.init_own_parameters()
    hidden = torch.randn(B, 32, 12, dtype=torch.float64, requires_grad=True)
    ours, _ = mixer(hidden, None)
    qkv = mixer.qkv(hidden).transpose(1, 2)  # (B, 3 H K, T): conv1d's layout
    weight = mixer.conv_weight[:, None, :]  # (C, 1, kernel): one filter per channel
    conv = F.conv1d(qkv, weight, padding=weight.size(-1) - 1, groups=qkv.size(1))[..., : hidden.size(1)]
    q, k, v = F.silu(conv).transpose(1, 2).unflatten(-1, (3, H, K)).unbind(2)  # (B, T, H, K) each
    q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
    beta = torch.sigmoid(mixer.beta(hidden))
    heads_first = [x.transpose(1, 2) for x in (q, k, v, beta)]
    o, _ = naive.delta_rule_chunkwise(*heads_first, chunk_size=16)  # scales q by 1 / sqrt(K) itself
    theirs = mixer.out_proj(mixer.norm(o.transpose(1, 2)).flatten(2))
    assert_agree([ours], [theirs], [hidden, *mixer.parameters()], 1e-10)
