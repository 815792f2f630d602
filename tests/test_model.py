"""Recurrence invariance, stop-gradient memory, adaptive softmax and input checks of the LM."""

import pytest
import torch

from longseq import ModelConfig, TransformerXLLM

SMALL = dict(vocab_size=40, n_layer=3, d_model=16, n_head=2, d_head=8, d_inner=32, dropout=0.1, dropatt=0.1)
ADAPTIVE = dict(SMALL, vocab_size=60, cutoffs=[10, 30], div_val=2, d_embed=16)


def model_for(seed=0, **overrides):
    torch.manual_seed(seed)
    return TransformerXLLM(ModelConfig(**{**SMALL, **overrides}))


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"pre_lnorm": True, "untie_r": True},
        {"clamp_len": 5},
        ADAPTIVE,
        {**ADAPTIVE, "div_val": 1, "d_embed": 8},
    ],
)
def test_chunked_with_memory_equals_whole(overrides):
    """Feeding a sequence in K segments with mem_len >= its length gives the logits of the whole."""
    length = 24
    model = model_for(**{**overrides, "mem_len": length}).eval()
    x = torch.randint(0, model.config.vocab_size, (2, length))
    whole = model(x).logits
    for bounds in ([0, 8, 16, 24], [0, 1, 7, 20, 24], [0, 12, 24]):
        mems, parts = None, []
        for lo, hi in zip(bounds, bounds[1:]):
            out = model(x[:, lo:hi], mems)
            parts.append(out.logits)
            mems = out.mems
        chunked = torch.cat(parts, dim=1)
        assert torch.allclose(chunked, whole, atol=1e-5, rtol=0), (chunked - whole).abs().max()


def test_loss_with_labels_matches_logits():
    model = model_for(**ADAPTIVE).eval()
    x = torch.randint(0, 60, (3, 7))
    y = torch.randint(0, 60, (3, 7))
    y[0, 2] = -100
    out = model(x, labels=y)
    log_probs = model(x).logits
    keep = y != -100
    expected = -log_probs[keep].gather(1, y[keep][:, None]).mean()
    assert torch.allclose(out.loss, expected, atol=1e-6)
    assert out.nll[0, 2] == 0


def test_memory_is_detached_and_bounded():
    model = model_for(mem_len=10).train()
    captured = []
    handle = model.transformer.word_emb.register_forward_hook(lambda module, args, output: captured.append(output))
    x = torch.randint(0, 40, (2, 30))
    out1 = model(x[:, :7], labels=x[:, 1:8])
    assert all(not m.requires_grad and m.grad_fn is None for m in out1.mems)
    out2 = model(x[:, 7:14], out1.mems, labels=x[:, 8:15])
    handle.remove()
    first_segment_embedding = captured[0]
    (grad,) = torch.autograd.grad(out2.loss, [first_segment_embedding], allow_unused=True)
    assert grad is None  # nothing of segment 2's loss flows back into segment 1
    # the same check sees the gradient when the memory is NOT detached (the test can fail)
    (grad_own,) = torch.autograd.grad(out1.loss, [first_segment_embedding], allow_unused=True)
    assert grad_own is not None and grad_own.abs().sum() > 0

    mems, seen = None, 0
    with torch.no_grad():
        for length in (3, 4, 9, 2, 11):
            mems = model(x[:, :length], mems).mems
            seen += length
            assert all(m.size(1) == min(10, seen) for m in mems)
            assert len(mems) == model.config.n_layer


def test_eval_mem_len_override_and_zero_memory():
    model = model_for(mem_len=4).eval()
    x = torch.randint(0, 40, (1, 6))
    assert model(x, mem_len=20).mems[0].size(1) == 6
    assert model(x, mem_len=0).mems[0].size(1) == 0
    with pytest.raises(ValueError, match="same_length"):
        model(x, mem_len=0, same_length=True)


@pytest.mark.parametrize(
    "div_val,cutoffs,d_embed", [(1, [10, 30], 16), (1, [10, 30], 8), (2, [10, 30], 16), (4, [5, 20, 40], 64)]
)
def test_adaptive_softmax_normalised_and_tied(div_val, cutoffs, d_embed):
    model = model_for(vocab_size=60, cutoffs=cutoffs, div_val=div_val, d_embed=d_embed).eval()
    log_probs = model(torch.randint(0, 60, (2, 5))).logits
    assert log_probs.shape == (2, 5, 60)
    assert torch.allclose(log_probs.logsumexp(-1), torch.zeros(2, 5), atol=1e-5)

    emb, crit = model.transformer.word_emb, model.crit
    for i, layer in enumerate(crit.out_layers):
        assert layer.weight is emb.emb_layers[i].weight  # tie_weight
    for i, tied in enumerate(model.config.proj_ties):
        if tied and div_val > 1:
            assert crit.out_projs[i] is emb.emb_projs[i]
    # sharing survives an optimizer step
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model.train()
    x = torch.randint(0, 60, (2, 5))
    model(x, labels=x).loss.backward()
    opt.step()
    assert torch.equal(crit.out_layers[0].weight, emb.emb_layers[0].weight)


def test_plain_softmax_logits_and_parameter_count():
    tied, untied = model_for(), model_for(tie_weight=False)
    assert tied.crit.n_clusters == 0
    x = torch.randint(0, 40, (2, 5))
    logits = tied.eval()(x).logits
    assert torch.allclose(logits, tied.crit.logits(tied.hidden_states(x, mem_len=0)[0].reshape(10, -1)).view(2, 5, 40))
    # the tied output weight is the embedding: counted once, so the tied model is one vocab x d_model matrix smaller
    assert untied.num_parameters() - tied.num_parameters() == 40 * 16


def test_initialisation_follows_the_paper():
    model = model_for(
        vocab_size=2000, d_model=64, d_head=16, n_head=4, d_inner=256, d_embed=64, cutoffs=[500], div_val=2
    )
    weight = model.transformer.layers[0].dec_attn.qkv_net.weight
    assert abs(weight.std().item() - 0.02) < 0.002
    proj = model.transformer.word_emb.emb_projs[0]
    assert abs(proj.std().item() - 0.01) < 0.001
    ln = model.transformer.layers[0].pos_ff.layer_norm
    assert abs(ln.weight.mean().item() - 1.0) < 0.02 and ln.bias.abs().sum() == 0


def test_bad_inputs_get_clear_errors():
    model = model_for(mem_len=4).eval()
    # ids and labels are checked on the device (no host read in the forward): at once on the CPU, asynchronously
    # on a GPU, where CUDA reports the assertion at the next synchronisation
    with pytest.raises(RuntimeError, match=r"token ids must lie in \[0, 40\)"):
        model(torch.tensor([[1, 2, 40]]))
    with pytest.raises(RuntimeError, match=r"token ids must lie"):
        model(torch.tensor([[-1, 2]]))
    with pytest.raises(RuntimeError, match=r"labels must lie in \[0, 40\) or be -100"):
        model(torch.tensor([[1, 2]]), labels=torch.tensor([[40, -100]]))
    with pytest.raises(ValueError, match=r"\(batch, time\)"):
        model(torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match="integer"):
        model(torch.zeros(1, 3))
    with pytest.raises(ValueError, match="labels shape"):
        model(torch.tensor([[1, 2]]), labels=torch.tensor([[1, 2, 3]]))
    mems = model(torch.tensor([[1, 2]])).mems
    with pytest.raises(ValueError, match=r"mems\[0\] must have shape"):
        model(torch.tensor([[1, 2], [3, 4]]), mems)
    with pytest.raises(ValueError, match="one tensor per layer"):
        model(torch.tensor([[1, 2]]), mems[:1])
