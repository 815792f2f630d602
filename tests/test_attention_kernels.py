"""Relative attention equals a naive loop over (i, j) that spells out the paper's four terms; the kernels (rel_shift,
its inference path, query chunking, the readable reference) agree with each other, outputs and gradients, and the
vanilla Transformer's fused path equals its reference."""

import math

import pytest
import torch

from longseq import ModelConfig, TransformerXLLM
from longseq.model.attention import ATTENTION_KERNELS, RelativeMultiHeadAttention, causal_mask, rel_shift
from longseq.model.memory import HiddenContext
from longseq.model.positions import RelativePositions, relative_distances, sinusoidal_embedding

D_MODEL, N_HEAD, D_HEAD = 12, 3, 4


def naive_attention(layer, hidden, memory, u, v, clamp_len, span):
    """Scores A_ij = (a) + (b) + (c) + (d) for every (i, j), as written in Dai et al. (2019), eq. after 3.3."""
    batch, qlen, _ = hidden.shape
    mlen = 0 if memory is None else memory.size(1)
    context = hidden if memory is None else torch.cat([memory, hidden], 1)
    klen = context.size(1)
    ctx_in = layer.layer_norm(context) if layer.pre_lnorm else context
    w_q, w_k, w_v = layer.qkv_net.weight.split(N_HEAD * D_HEAD, dim=0)
    w_r = layer.rel.r_net.weight
    out = torch.zeros(batch, qlen, N_HEAD * D_HEAD, dtype=hidden.dtype)
    inv_freq = 1.0 / (10000 ** (torch.arange(0.0, D_MODEL, 2.0, dtype=torch.float64) / D_MODEL))
    for b in range(batch):
        for h in range(N_HEAD):
            sl = slice(h * D_HEAD, (h + 1) * D_HEAD)
            for i in range(qlen):
                x_i = ctx_in[b, mlen + i]
                q = w_q[sl] @ x_i
                scores = []
                for j in range(klen):
                    dist = mlen + i - j
                    visible = dist >= 0 and (span is None or dist < span)
                    if not visible:
                        scores.append(torch.tensor(-math.inf, dtype=torch.float64))
                        continue
                    d = min(dist, clamp_len) if clamp_len > 0 else dist
                    angles = d * inv_freq
                    r = torch.cat([angles.sin(), angles.cos()]).to(hidden.dtype)  # R_{i-j}
                    k_e = w_k[sl] @ ctx_in[b, j]  # W_{k,E} E_{x_j}
                    k_r = w_r[sl] @ r  # W_{k,R} R_{i-j}
                    term_a = q @ k_e
                    term_b = q @ k_r
                    term_c = u[h] @ k_e
                    term_d = v[h] @ k_r
                    scores.append((term_a + term_b + term_c + term_d) / math.sqrt(D_HEAD))
                probs = torch.softmax(torch.stack(scores), dim=0)
                values = torch.stack([w_v[sl] @ ctx_in[b, j] for j in range(klen)])
                out[b, i, sl] = probs.to(hidden.dtype) @ values
    attn_out = out @ layer.o_net.weight.T
    return hidden + attn_out if layer.pre_lnorm else layer.layer_norm(hidden + attn_out)


@pytest.mark.parametrize("kernel", ["rel_shift", "reference", "rel_shift-inference"])
@pytest.mark.parametrize(
    "mlen,same_length,clamp_len,pre_lnorm",
    [(0, False, -1, False), (5, False, -1, False), (5, True, -1, False), (6, False, 3, True), (4, True, 2, True)],
)
def test_attention_matches_naive_four_terms(kernel, mlen, same_length, clamp_len, pre_lnorm):
    """``rel_shift-inference``: the fast kernel without gradients, where the softmax runs inside PyTorch's fused
    scaled_dot_product_attention with the shifted position term as its bias."""
    kernel, _, mode = kernel.partition("-")
    torch.manual_seed(0)
    layer = RelativeMultiHeadAttention(D_MODEL, N_HEAD, D_HEAD, pre_lnorm=pre_lnorm, kernel=kernel).double().eval()
    for p in layer.parameters():
        torch.nn.init.normal_(p, 0, 0.5)
    qlen, batch = 4, 2
    hidden = torch.randn(batch, qlen, D_MODEL, dtype=torch.float64)
    memory = torch.randn(batch, mlen, D_MODEL, dtype=torch.float64) if mlen else None
    u = torch.randn(N_HEAD, D_HEAD, dtype=torch.float64)
    v = torch.randn(N_HEAD, D_HEAD, dtype=torch.float64)
    span = 6 if same_length else None
    pos_emb = sinusoidal_embedding(relative_distances(mlen + qlen, clamp_len), D_MODEL, torch.float64)
    mask = causal_mask(qlen, mlen, span)
    with torch.set_grad_enabled(mode != "inference"):
        table = layer.relative_keys(RelativePositions(None, pos_emb, pos_emb.dtype))
        fast, _, _ = layer(hidden, table, u, v, mask, HiddenContext(memory))
    naive = naive_attention(layer, hidden, memory, u, v, clamp_len, span)
    assert torch.allclose(fast, naive, atol=1e-10, rtol=0), (fast - naive).abs().max()


@pytest.mark.parametrize("qlen, mlen", [(3, 2), (1, 4)])
def test_rel_shift_places_each_distance_under_its_key(qlen, mlen):
    """Every visible key reads the row of its distance; one query (generation's: a view of its own) too."""
    klen = qlen + mlen
    rows = torch.arange(klen + 1, dtype=torch.float64)  # row r holds distance klen - r
    scores = (klen - rows).expand(1, 1, qlen, klen + 1)
    shifted = rel_shift(scores, qlen)[0, 0]
    assert shifted.shape == (qlen, klen)
    for i in range(qlen):
        for j in range(mlen + i + 1):  # visible keys only
            assert shifted[i, j] == mlen + i - j


def test_same_length_gives_every_query_mem_len_keys():
    mask = causal_mask(qlen=4, mlen=6, span=6)
    assert ((~mask).sum(dim=1) == 6).all()
    assert not causal_mask(qlen=4, mlen=0, span=None).diagonal().any()


def test_model_kernels_agree_end_to_end():
    cfg = dict(vocab_size=30, n_layer=2, d_model=16, n_head=2, d_head=8, d_inner=32, mem_len=6, dropout=0.0)
    torch.manual_seed(1)
    fast = TransformerXLLM(ModelConfig(**cfg, same_length=True, clamp_len=4)).double().eval()
    ref = TransformerXLLM(ModelConfig(**cfg, same_length=True, clamp_len=4, attn_impl="reference")).double().eval()
    ref.load_state_dict(fast.state_dict())
    x = torch.randint(0, 30, (2, 5))
    out_f, out_r = fast(x), ref(x)
    out_f2, out_r2 = fast(x, out_f.mems), ref(x, out_r.mems)
    assert torch.allclose(out_f2.logits, out_r2.logits, atol=1e-10, rtol=0)


@pytest.mark.parametrize("mlen,span", [(0, None), (5, None), (5, 6)])
def test_fast_kernel_gradients_match_reference(mlen, span):
    """The hand-written backward of the rel-shift kernel gives the reference kernel's gradients."""
    torch.manual_seed(3)
    qlen, batch = 4, 2
    klen = qlen + mlen

    def leaves():
        g = torch.Generator().manual_seed(7)
        shapes = [(batch, N_HEAD, qlen, D_HEAD), (batch, N_HEAD, klen, D_HEAD), (batch, N_HEAD, klen, D_HEAD)]
        shapes += [(N_HEAD, klen + 1, D_HEAD), (N_HEAD, D_HEAD), (N_HEAD, D_HEAD)]
        return [torch.randn(*s, generator=g, dtype=torch.float64).requires_grad_() for s in shapes]

    mask = causal_mask(qlen, mlen, span)
    grads = {}
    for name in ("rel_shift", "reference"):
        inputs = leaves()
        out = ATTENTION_KERNELS[name](*inputs, mask, 0.0, True)
        weight = torch.linspace(-1, 1, out.numel(), dtype=torch.float64).view_as(out)
        (out * weight).sum().backward()
        grads[name] = [t.grad for t in inputs]
    for fast, ref in zip(grads["rel_shift"], grads["reference"]):
        assert torch.allclose(fast, ref, atol=1e-10, rtol=0), (fast - ref).abs().max()


@pytest.mark.parametrize("chunk", [1, 3, 5])
def test_query_chunking_is_exact(chunk):
    cfg = dict(vocab_size=30, n_layer=2, d_model=16, n_head=2, d_head=8, d_inner=32, mem_len=7, dropout=0.0)
    torch.manual_seed(2)
    whole = TransformerXLLM(ModelConfig(**cfg, attn_chunk=0, same_length=True)).double()
    chunked = TransformerXLLM(ModelConfig(**cfg, attn_chunk=chunk, same_length=True)).double()
    chunked.load_state_dict(whole.state_dict())
    x = torch.randint(0, 30, (2, 9))
    first = whole(x, labels=x)
    second = chunked(x, labels=x)
    assert torch.allclose(whole(x, first.mems).logits, chunked(x, second.mems).logits, atol=1e-12, rtol=0)
    first.loss.backward()
    second.loss.backward()
    for (name, p), q in zip(whole.named_parameters(), chunked.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-12, rtol=0), name


VANILLA_BASE = dict(vocab_size=30, n_layer=2, d_model=16, n_head=2, d_head=8, d_inner=32, dropout=0.0, mem_len=6)


def test_vanilla_fused_attention_equals_its_readable_reference():
    torch.manual_seed(0)
    config = dict(VANILLA_BASE, mem_len=0, pos="absolute", dropout=0.0)
    fused = TransformerXLLM(ModelConfig(**config, attn_impl="rel_shift")).double().eval()
    reference = TransformerXLLM(ModelConfig(**config, attn_impl="reference")).double().eval()
    reference.load_state_dict(fused.state_dict())
    x = torch.randint(0, 30, (2, 11))
    torch.testing.assert_close(fused(x).logits, reference(x).logits, rtol=0, atol=1e-10)
    window = ModelConfig(**config, attention=["window"], window=3)  # a dense mask instead of the causal flag
    fused_w, reference_w = (
        TransformerXLLM(window).double().eval(),
        TransformerXLLM(window.replace(attn_impl="reference")).double().eval(),
    )
    reference_w.load_state_dict(fused_w.state_dict())
    torch.testing.assert_close(fused_w(x).logits, reference_w(x).logits, rtol=0, atol=1e-10)
