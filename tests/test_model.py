"""The language model: recurrence invariance (chunked with memory equals whole), the stop-gradient memory, adaptive
softmax, the initialisation, activation checkpointing (same loss and gradients), absolute positions and the LSTM
baseline, input checks by name, and no host synchronisation in a forward and backward of any pattern, mixer or
memory option (counted on the CPU with :class:`longseq.diagnostics.syncs.HostSyncs`, which sees the operators a GPU
would wait on)."""

import dataclasses

import pytest
import torch
from support import SMALL_LM, raises_naming

from longseq import ConfigError, ModelConfig, TransformerXLLM
from longseq.config import Recurrence
from longseq.config.stored import stored_weights
from longseq.diagnostics.syncs import HostSyncs
from longseq.model import KVMemory, Memory, build_model

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
    recurrence = model.config.recurrence
    assert model(x, recurrence=recurrence(mem_len=20)).mems[0].size(1) == 6
    assert model(x, recurrence=recurrence(mem_len=0)).mems[0].size(1) == 0
    with pytest.raises(ValueError, match="same_length"):
        model(x, recurrence=recurrence(mem_len=0, same_length=True))


@pytest.mark.parametrize("given", [dict(mem_len=20, same_length=True), dict(clamp_len=3), dict(mem_len=0)])
def test_a_recurrence_is_what_the_models_own_with_those_values_means(given):
    """``forward(recurrence=Recurrence(...))`` gives what ``recurrence=config.recurrence(mem_len=..., clamp_len=...,
    same_length=...)`` gives (the model's own recurrence with those values): the same logits, losses and memory, bit
    for bit, over two segments; the helpers over ``forward`` (read, next_token_scores, hidden_states) agree with it
    too.  ``recurrence=`` is the one way a call takes them: the keywords themselves are refused."""
    model = model_for(mem_len=4, clamp_len=6).eval()
    own = model.config.recurrence()
    assert own == Recurrence(4, 6, False)
    recurrence = Recurrence(**{**dataclasses.asdict(own), **given})
    assert model.config.recurrence(**given) == recurrence
    x, y = torch.randint(0, 40, (2, 2, 5)).unbind(0)
    by_own = model.config.recurrence(**given)
    by_keywords = model(x, model(y, recurrence=by_own).mems, y, recurrence=by_own)
    by_object = model(x, model(y, recurrence=recurrence).mems, y, recurrence=recurrence)
    assert torch.equal(by_keywords.nll, by_object.nll) and torch.equal(by_keywords.loss, by_object.loss)
    assert all(torch.equal(by_keywords.mems[i], by_object.mems[i]) for i in range(3))
    logits = model(y, recurrence=recurrence)
    scores, mems = model.next_token_scores(y, recurrence=recurrence)
    assert torch.allclose(scores, logits.logits[:, -1], atol=1e-6, rtol=0)  # one row through the softmax: rounding
    assert torch.equal(model.read(y, recurrence=by_own)[0], logits.mems[0])
    assert torch.equal(model.hidden_states(y, recurrence=recurrence)[1][0], mems[0])
    with raises_naming(TypeError, "mem_len"):
        model(x, recurrence=recurrence, mem_len=3)
    with raises_naming(TypeError, "Recurrence", "dict"):
        model(x, recurrence={"mem_len": 3})
    with raises_naming(ValueError, "mem_len", ">= 0", "-1"):
        model(x, recurrence=model.config.recurrence(mem_len=-1))


def test_return_hidden_gives_the_states_that_the_head_scores():
    """With ``return_hidden`` the output holds the last layer's hidden states (B, T, E): the softmax over them
    (``model.head``) is the model's logits and loss, and without labels the softmax is not run at all."""
    model = model_for(**ADAPTIVE, mem_len=4).eval()
    x, y = torch.randint(0, 60, (2, 3, 7)).unbind(0)
    plain, kept = model(x, labels=y), model(x, labels=y, return_hidden=True)
    assert kept.hidden.shape == (3, 7, 16) and plain.hidden is None
    assert torch.equal(model.head(kept.hidden, y).nll, plain.nll) and torch.equal(kept.loss, plain.loss)
    alone = model(x, return_hidden=True)
    assert alone.logits is None and alone.loss is None and torch.equal(alone.hidden, kept.hidden)
    assert torch.equal(model.head(alone.hidden).logits, model(x).logits)
    assert torch.equal(model.hidden_states(x)[0], alone.hidden)
    assert all(torch.equal(alone.mems[i], plain.mems[i]) for i in range(3))


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
    assert torch.allclose(
        logits,
        tied.crit.logits(tied.hidden_states(x, recurrence=tied.config.recurrence(mem_len=0))[0].reshape(10, -1)).view(
            2, 5, 40
        ),
    )
    # the tied output weight is the embedding: counted once, so the tied model is one vocab x d_model matrix smaller
    assert untied.num_parameters() - tied.num_parameters() == 40 * 16


def test_initialisation_follows_the_paper():
    model = model_for(
        vocab_size=2000, d_model=64, d_head=16, n_head=4, d_inner=256, d_embed=64, cutoffs=[500], div_val=2
    )
    weight = model.transformer.stack.layers[0].dec_attn.qkv_net.weight
    assert abs(weight.std().item() - 0.02) < 0.002
    proj = model.transformer.word_emb.emb_projs[0]
    assert abs(proj.std().item() - 0.01) < 0.001
    ln = model.transformer.stack.layers[0].pos_ff.layer_norm
    assert abs(ln.weight.mean().item() - 1.0) < 0.02 and ln.bias.abs().sum() == 0


def test_bad_inputs_get_clear_errors():
    model = model_for(mem_len=4).eval()
    # ids and labels are checked on the device (no host read in the forward): at once on the CPU, asynchronously
    # on a GPU, where CUDA reports the assertion at the next synchronisation
    with raises_naming(RuntimeError, "token ids", "[0, 40)"):
        model(torch.tensor([[1, 2, 40]]))
    with pytest.raises(RuntimeError, match=r"token ids must lie"):
        model(torch.tensor([[-1, 2]]))
    with raises_naming(RuntimeError, "labels", "[0, 40)", "-100"):
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


def small_lm() -> TransformerXLLM:
    torch.manual_seed(0)
    return TransformerXLLM(ModelConfig(vocab_size=20, n_layer=2, d_model=16, n_head=2, d_head=8, d_inner=32))


def test_the_model_checks_the_dtypes_of_mems_and_labels_by_name():
    """float64 mems into a float32 model failed deep in linear.py; integer mems and float labels were cast in
    silence."""
    model = small_lm()
    ids = torch.randint(0, 20, (2, 6))
    mems = model(ids).mems
    for bad, dtype in (([m.double() for m in mems], "float64"), ([m.long() for m in mems], "int64")):
        with raises_naming(ValueError, "mems[0]", f"torch.{dtype}", "torch.float32"):
            model(ids, mems=bad)
    with raises_naming(ValueError, "labels", "integer"):
        model(ids, labels=ids.float())
    with torch.autocast("cpu", dtype=torch.bfloat16):  # under autocast a half-precision memory is the model's own
        assert torch.isfinite(model(ids, mems=[m.bfloat16() for m in mems], labels=ids).loss)


def test_a_loss_over_no_labelled_token_is_nan_not_zero():
    model = small_lm()
    ids = torch.randint(0, 20, (2, 6))
    out = model(ids, labels=torch.full_like(ids, -100))
    assert torch.isnan(out.loss) and torch.equal(out.nll, torch.zeros(2, 6))
    some = torch.full_like(ids, -100)
    some[0, 2] = 5
    assert torch.isfinite(model(ids, labels=some).loss)


def test_activation_checkpointing_gives_the_same_loss_and_gradients():
    config = ModelConfig(vocab_size=20, n_layer=3, d_model=16, n_head=2, d_head=8, d_inner=32, dropout=0.2, mem_len=6)
    torch.manual_seed(0)
    model = TransformerXLLM(config).double().train()
    ids = torch.randint(0, 20, (2, 10))
    mems = model(ids[:, :4]).mems
    results = []
    for every in (0, 1, 2):
        model.transformer.stack.activation_checkpointing = every
        model.zero_grad()
        torch.manual_seed(5)  # the same dropout masks
        loss = model(ids[:, 4:], mems, ids[:, 4:]).loss
        loss.backward()
        results.append((loss.detach(), [p.grad.clone() for p in model.parameters()]))
    for loss, grads in results[1:]:
        assert torch.equal(loss, results[0][0])
        for a, b in zip(grads, results[0][1]):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_dropout_on_r_and_the_uv_initialisation_are_their_own_settings():
    base = dict(vocab_size=20, n_layer=1, d_model=16, n_head=2, d_head=8, d_inner=32, dropout=0.0, mem_len=4)
    x = torch.randint(0, 20, (2, 6))

    def two_draws(**extra):
        torch.manual_seed(0)
        model = TransformerXLLM(ModelConfig(**base, **extra)).train()
        return model(x).logits, model(x).logits

    a, b = two_draws()
    assert torch.equal(a, b)  # no dropout anywhere
    a, b = two_draws(dropout_r=0.5)
    assert not torch.equal(a, b)  # only R is dropped
    torch.manual_seed(0)
    zeros = TransformerXLLM(ModelConfig(**base, uv_init="zeros"))
    normal = TransformerXLLM(ModelConfig(**base))
    assert not zeros.transformer.stack.r_w_bias.any() and not zeros.transformer.stack.r_r_bias.any()
    assert normal.transformer.stack.r_w_bias.abs().sum() > 0


@pytest.mark.parametrize(
    "overrides",
    [
        *({"mixer": [name], "mem_len": 0} for name in ("ssm", "conv", "rnn", "linear", "gla", "delta")),
        {"mixer": ["gla"], "mem_len": 0, "untie_r": True},
        {"n_layer": 4, "mixer": ["gla", "attention", "attention", "gla"], "hourglass": {"shorten_layers": [1, 3]}},
        {"mixer": ["gla", "attention", "gla"], "untie_r": True},
    ],
)
def test_every_parameter_of_a_stack_gets_a_gradient(overrides):
    """A parameter that no layer reads gets no gradient, which DDP refuses at its second step: a stack whose layers
    do not attend (an hourglass's outer stack of mixers included) holds no u and v."""
    model = model_for(**{**overrides, "dropout": 0.0, "dropatt": 0.0}).train()
    x = torch.randint(0, 40, (2, 8))
    first = model(x, labels=x)
    model(x, mems=first.mems, labels=x).loss.backward()
    assert [name for name, p in model.named_parameters() if p.grad is None] == []
    if "attention" not in overrides["mixer"]:
        assert model.transformer.stack.r_w_bias is None and model.transformer.stack.r_r_bias is None


def test_a_checkpoint_of_a_stack_without_attention_that_holds_u_and_v_still_loads():
    """Saved before a stack without attention dropped u and v: the unread tensors are dropped when it loads."""
    model = model_for(mixer=["gla"], mem_len=0)
    state = {**model.state_dict(), "transformer.stack.r_w_bias": torch.zeros(2, 8)}
    state["transformer.stack.r_r_bias"] = torch.zeros(2, 8)
    other = model_for(seed=1, mixer=["gla"], mem_len=0)
    other.load_state_dict(stored_weights(model.config.to_dict(), state))  # strict, as a checkpoint is read
    x = torch.randint(0, 40, (2, 8))
    assert torch.equal(other.eval()(x).logits, model.eval()(x).logits)


def vanilla(**extra):
    torch.manual_seed(0)
    return TransformerXLLM(ModelConfig(**{**SMALL_LM, "mem_len": 0, "pos": "absolute", **extra})).double().eval()


def test_absolute_positions_make_the_model_order_aware_and_refuse_memory():
    model = vanilla()
    ids = torch.tensor([[1, 2, 3, 4, 5, 6]])
    # the same token at two positions gets different outputs only through the position embedding
    same = torch.tensor([[7, 7]])
    hidden = model.hidden_states(same)[0]
    assert not torch.allclose(hidden[0, 0], hidden[0, 1])
    assert torch.isfinite(model(ids).logits).all()
    with pytest.raises(ConfigError, match="mem_len=0"):
        ModelConfig(**{**SMALL_LM, "mem_len": 8, "pos": "absolute"})


def test_lstm_baseline_carries_its_state_like_a_memory():
    torch.manual_seed(0)
    config = ModelConfig(**{**SMALL_LM, "arch": "lstm"})
    model = build_model(config).double().eval()
    ids = torch.randint(0, 30, (2, 12))
    whole = model(ids, None, ids).nll
    first = model(ids[:, :5], None, ids[:, :5])
    second = model(ids[:, 5:], first.mems, ids[:, 5:])
    torch.testing.assert_close(torch.cat([first.nll, second.nll], 1), whole, rtol=0, atol=1e-12)
    assert first.mems[0][0].shape == first.mems[0][1].shape == (2, 16)  # (h, c) of layer 0


def test_the_lstm_takes_the_transformers_call_options_and_refuses_the_rest_by_name():
    """The per-call recurrence is the transformer's and changes nothing for an LSTM; a keyword only the
    transformer's layers read, or a misspelt one, is a TypeError naming it (it was swallowed)."""
    torch.manual_seed(0)
    model = build_model(ModelConfig(**{**SMALL_LM, "arch": "lstm"})).double().eval()
    ids = torch.randint(0, 30, (2, 6))
    plain = model(ids, None, ids)
    for options in (dict(recurrence=Recurrence(3)), dict(recurrence=Recurrence(0, 2, True))):
        assert torch.equal(model(ids, None, ids, **options).nll, plain.nll)
        assert torch.equal(model.read(ids, **options)[0][0], plain.mems[0][0])
        last = model.next_token_scores(ids, **options)[0]  # the decoder on one position: rounded as a GEMM of one row
        torch.testing.assert_close(last, model(ids).logits[:, -1], rtol=0, atol=1e-12)
    for call in (model, model.read, model.next_token_scores):
        for keyword in ("mem_lenn", "global_mask", "layer_outputs"):
            with pytest.raises(TypeError, match=f"'{keyword}'"):
                call(ids, **{keyword: None})
        with pytest.raises(TypeError, match="'mem_len'"):
            call(ids, recurrence=Recurrence(3), mem_len=2)
        with pytest.raises(ValueError, match="documents apart"):
            call(ids, doc_ids=torch.zeros_like(ids))


SYNC_BASE = dict(vocab_size=50, n_layer=2, d_model=32, n_head=2, d_head=16, d_inner=64, mem_len=16, attn_chunk=8)


SYNC_CASES = {  # a name: (model settings, call settings); attn_chunk 8 over 32 queries takes the banded and sparse paths
    "full": ({}, {}),
    "window": ({"attention": ["window"], "window": 4}, {}),
    "dilated": ({"attention": ["dilated"], "window": 4, "dilation": [1, 2]}, {}),
    "strided": ({"attention": ["strided"], "window": 4, "stride": 4}, {}),
    "block_sparse": ({"attention": ["block_sparse"], "block_size": 4}, {}),
    "global": ({"attention": ["global"], "window": 4, "num_global": 2}, {}),
    "bigbird": ({"attention": ["bigbird"], "window": 4, "block_size": 4, "num_global": 1, "num_random_blocks": 1}, {}),
    "shaw": ({"pos": "shaw"}, {}),
    "absolute": ({"pos": "absolute", "mem_len": 0}, {}),
    "ssm": ({"mixer": ["ssm"]}, {}),
    "conv": ({"mixer": ["conv"]}, {"docs": True}),
    "rnn": ({"mixer": ["rnn"]}, {}),
    "hybrid with documents": ({"mixer": ["ssm", "attention"]}, {"docs": True}),
    "hourglass": ({"n_layer": 3, "shorten_layers": [1, 2], "mem_len": 8}, {}),
    "compressive (learned)": ({"cmem_len": 4, "cmem_rate": 2, "cmem_fn": "conv"}, {}),
    "8-bit memory": ({"mem_quant": "int8"}, {}),
    "pruned memory": ({"mem_select": "attention"}, {}),
    "memory tokens": ({"mem_tokens": 2}, {}),
    "memory dropout": ({"mem_dropout": 0.1}, {}),
    "gradient through the memory": ({"mem_bptt": 2}, {}),
    "documents": ({}, {"docs": True}),
    "key/value memory (evaluation)": ({}, {"kv": True, "train": False}),
    "llama block, capped": ({"norm": "rmsnorm", "ff": "swiglu", "bias": False, "final_norm": True, "pre_lnorm": True,
                             "attn_softcap": 5.0, "logit_softcap": 10.0, "n_kv_head": 1, "qk_norm": True}, {}),
    "capped content scores": ({"pos": "rope", "attn_softcap": 5.0}, {}),
    "capped sparse pieces": ({"attention": ["strided"], "window": 4, "stride": 4, "attn_softcap": 5.0}, {}),
    "linear, restarted and rotated": ({"mixer": ["linear"]}, {"docs": True}),
    "performer": ({"mixer": ["performer"]}, {}),
}  # fmt: skip


def syncs_of(settings: dict, kv=False, train=True, docs=False) -> list[str]:
    torch.manual_seed(0)
    model = TransformerXLLM(ModelConfig(**{**SYNC_BASE, **settings})).train(train)
    ids = torch.randint(0, 50, (2, 33))
    extra = {"doc_ids": torch.zeros(2, 32, dtype=torch.long)} if docs else {}
    memory = model(ids[:, :32], Memory.empty(KVMemory) if kv else None, **extra).mems  # a full memory
    with HostSyncs() as syncs:
        out = model(ids[:, :32], memory, ids[:, 1:], **extra)
        if train:
            out.loss.backward()
    return syncs.where


@pytest.mark.parametrize("name", list(SYNC_CASES))
def test_a_forward_and_backward_read_nothing_back_from_the_device(name):
    settings, call = SYNC_CASES[name]
    assert syncs_of(settings, **call) == []


def test_the_counter_sees_what_a_gpu_would_wait_on():
    """The claim above can fail: each kind of read is counted."""
    x = torch.arange(6.0)
    with HostSyncs() as syncs:
        int(x.max()), x[x > 2], x.nonzero(), x.tolist(), bool((x > 1).any())
    kinds = [w.split(" at ")[0] for w in syncs.where]
    assert kinds == ["_local_scalar_dense", "boolean indexing", "nonzero", "Tensor.tolist", "_local_scalar_dense"]
    with HostSyncs() as syncs:  # an output whose size is the data's
        torch.unique(x, return_inverse=True), torch.unique(x, dim=0), torch.unique_consecutive(x)
    assert syncs.count == 3, syncs.where


def test_known_reads_are_the_documented_ones():
    """Two inputs are data the model must see on the host, each read once per forward: a user's ``global_mask``
    (the sparse kernel lays its global columns out by it; the first ``num_global`` tokens need no read) and the
    document starts of the rnn mixer (PyTorch's LSTM cannot reset inside a sequence, so the run is cut there)."""
    torch.manual_seed(0)
    model = TransformerXLLM(ModelConfig(**{**SYNC_BASE, "attention": ["global"], "window": 4}))
    ids = torch.randint(0, 50, (2, 32))
    mask = torch.zeros(2, 32, dtype=torch.bool).index_fill_(1, torch.tensor([3]), True)
    with HostSyncs() as syncs:
        model(ids, global_mask=mask)
    assert [w.split(" at ")[0] for w in syncs.where] == ["Tensor.tolist"]
    rnn = syncs_of({"mixer": ["rnn"], "n_layer": 1}, docs=True)
    assert len(rnn) == 2 and all("rnn.py" in w for w in rnn)


@pytest.mark.parametrize("boundaries", ["learned", "entropy"])
def test_a_dynamic_hourglass_reads_its_chunk_count_once(boundaries):
    """The number of chunks of a segment is the coarse stack's shape: one read per forward, in select_chunks."""
    settings = {"n_layer": 3, "shorten_layers": [1, 2], "mem_len": 8, "boundaries": boundaries}
    reads = syncs_of(settings, docs=True)
    assert len(reads) == 1 and "boundaries.py" in reads[0], reads


def test_a_low_rank_encoder_reads_the_number_of_documents_once():
    """Linformer projects each document apart; how many a segment holds is read once per forward, for every
    layer (two here), and not at all without documents."""
    settings = {"mem_len": 0, "bidirectional": True, "lowrank": 4, "lowrank_len": 32, "pos": "rope"}
    reads = syncs_of(settings, docs=True)
    assert len(reads) == 1 and "lowrank.py" in reads[0], reads
    assert syncs_of(settings) == []
