"""The behaviours transformers' own model tests (``ModelTesterMixin``, the generation tests) ask of a model, on
longseq's transformers export, each held to a claim (issue 60, "transformers' own model tests"): attentions and
hidden states that keep their gradients, a tied model saved and reloaded whole, activation checkpointing switched on
and off, embeddings resized and replaced on every model kind, empty prompts refused by name, and an export that says
what to import."""

import json
import os
import subprocess
import sys

import pytest
import torch
from support import assert_names, raises_naming
from torch import nn

transformers = pytest.importorskip("transformers")
if int(transformers.__version__.split(".")[0]) < 5:
    pytest.skip(f"longseq.hf needs transformers 5, this is {transformers.__version__}", allow_module_level=True)

from transformers import AutoModelForCausalLM  # noqa: E402

import longseq.hf  # noqa: E402, F401  (registers the classes)
from longseq import ModelConfig  # noqa: E402
from longseq.hf import LongseqForCausalLM  # noqa: E402
from longseq.interop.hf_longseq import export_longseq_hf  # noqa: E402
from longseq.model import build_model  # noqa: E402

BASE = dict(vocab_size=50, n_layer=2, d_model=16, n_head=2, d_head=8, d_inner=32, mem_len=6, dropout=0.0)
ATTENDING = {  # every model kind that attends
    "xl": {},
    "window-untied-r": dict(attention=["window"], window=3, untie_r=True),
    "bigbird-global": dict(attention=["bigbird", "global"], window=2, block_size=2, num_global=1, num_random_blocks=1),
    "memory-tokens": dict(mem_tokens=2),
    "hybrid-ssm": dict(mixer=["ssm", "attention"], head_dim=8),
    "hourglass": dict(n_layer=4, shorten_layers=[1, 3]),
    "pre-ln-projected": dict(pre_lnorm=True, d_embed=8),
    "llama-block": dict(pos="rope", n_kv_head=1, qk_norm=True, norm="rmsnorm", ff="swiglu", pre_lnorm=True),
    "alibi": dict(pos="alibi"),
}
KINDS = {
    **ATTENDING,
    "learned-chunks": dict(n_layer=4, shorten_layers=[1, 3], boundaries="learned"),
    "gla": dict(mixer=["gla"], mem_len=0),
    "lstm": dict(arch="lstm"),
}
LSTM_FIELDS = ("vocab_size", "n_layer", "d_model", "dropout")


def tiny_config(name: str, **extra) -> ModelConfig:
    fields = {**BASE, **KINDS[name], **extra}
    if name == "lstm":
        fields = {k: v for k, v in fields.items() if k in LSTM_FIELDS or k == "arch"}
    return ModelConfig(**fields)


def hf_of(name: str = "xl", seed: int = 0, **extra) -> LongseqForCausalLM:
    torch.manual_seed(seed)
    model = build_model(tiny_config(name, **extra)).eval()
    return longseq.hf.from_longseq(model, segment_len=4, generate_mem_len=9)


# --- attentions and hidden states keep their gradients ------------------------------------------------------------


@pytest.mark.parametrize("name", list(ATTENDING))
def test_attentions_and_hidden_states_keep_their_gradients(name):
    """``ModelTesterMixin.test_retain_grad_hidden_states_attentions``: the first hidden state and the first
    attention map, ``retain_grad()``-ed, get gradients from a backward of the logits, and they are the gradients
    of the maps the output was computed from: the logits' gradient with respect to the attention map, taken by
    autograd, moves the logits as the map does (a first-order check of one entry), and asking for the maps leaves
    the logits as they were."""
    hf = hf_of(name)
    x = torch.randint(0, 50, (2, 7))
    with torch.no_grad():
        plain = hf(x).logits
    out = hf(x, output_attentions=True, output_hidden_states=True)
    torch.testing.assert_close(out.logits, plain, rtol=0, atol=1e-5)
    hidden, attention = out.hidden_states[0], out.attentions[0]
    hidden.retain_grad()
    attention.retain_grad()
    out.logits.flatten()[0].backward(retain_graph=True)
    assert attention.grad is not None and attention.grad.abs().sum() > 0
    assert hidden.grad is not None and hidden.grad.abs().sum() > 0
    every = torch.autograd.grad(out.logits.sum(), [*out.attentions, *out.hidden_states])  # each one read on
    assert all(g.abs().sum() > 0 for g in every)


def test_the_attention_gradient_is_that_of_the_map_applied():
    """The gradient of the output with respect to the returned attention map is the one of the map the layer
    applied: a layer output rebuilt from the map and the layer's values (o_net(P V), residual, norm) has the same
    gradient with respect to P as the returned map, in float64."""
    hf = hf_of("xl").double()
    layer = hf.model.transformer.stack.layers[0]
    seen = []
    handles = [
        layer.dec_attn.register_forward_pre_hook(lambda m, args: seen.append(args[0])),
        layer.dec_attn.register_forward_hook(lambda m, args, output: seen.append(output[1][1])),  # the values
        layer.pos_ff.register_forward_pre_hook(lambda m, args: seen.append(args[0])),  # the attention's output
    ]
    x = torch.randint(0, 50, (2, 7))
    out = hf(x, output_attentions=True)
    for handle in handles:
        handle.remove()
    probs = out.attentions[0]
    hidden, value, layer_out = seen[:3]
    layer = layer.dec_attn
    weight = torch.randn_like(layer_out)
    (returned,) = torch.autograd.grad((layer_out * weight).sum(), probs)
    copy = probs.detach().requires_grad_()
    mixed = (copy @ value.detach()).transpose(1, 2).reshape(2, 7, -1)
    rebuilt = layer.layer_norm(hidden.detach() + layer.o_net(mixed))
    torch.testing.assert_close(rebuilt, layer_out.detach(), rtol=0, atol=1e-12)
    (expected,) = torch.autograd.grad((rebuilt * weight).sum(), copy)
    torch.testing.assert_close(returned, expected, rtol=0, atol=1e-12)


# --- a tied model saved and reloaded ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["xl", "lstm", "pre-ln-projected"])
def test_a_tied_model_saved_and_reloaded_reports_no_missing_weights_and_the_same_logits(name, tmp_path):
    """``save_pretrained`` then ``from_pretrained(..., output_loading_info=True)`` of a model whose softmax is its
    embedding: nothing missing or unexpected, the head tied again (one tensor), the same logits."""
    hf = hf_of(name)
    assert hf.get_output_embeddings().weight is hf.get_input_embeddings().weight
    hf.save_pretrained(tmp_path / "m")
    loaded, info = AutoModelForCausalLM.from_pretrained(tmp_path / "m", output_loading_info=True)
    assert info["missing_keys"] in ([], set()) and info["unexpected_keys"] in ([], set()), info
    assert loaded.get_output_embeddings().weight is loaded.get_input_embeddings().weight
    x = torch.randint(0, 50, (2, 7))
    with torch.no_grad():
        assert torch.equal(loaded.eval()(x).logits, hf(x).logits)


# --- activation checkpointing on and off --------------------------------------------------------------------------


def gradients(hf, x) -> dict:
    hf.zero_grad()
    hf(x, labels=x).loss.backward()
    return {n: p.grad.clone() for n, p in hf.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("name", ["xl", "hybrid-ssm", "hourglass"])
def test_gradient_checkpointing_enable_then_disable_trains_as_before(name):
    """``gradient_checkpointing_enable()``: the same gradients as without (every layer recomputed); then
    ``gradient_checkpointing_disable()``: the model trains as before, no layer recomputed (counted)."""
    hf = hf_of(name, dropout=0.0).train()
    x = torch.randint(0, 50, (2, 9))
    plain = gradients(hf, x)
    layers = hf.model.transformer.stack.layers
    calls = []
    handles = [layer.register_forward_pre_hook(lambda m, a: calls.append(m)) for layer in layers]
    hf.gradient_checkpointing_enable()
    assert hf.is_gradient_checkpointing
    checkpointed = gradients(hf, x)
    recomputed = len(calls)
    hf.gradient_checkpointing_disable()
    assert not hf.is_gradient_checkpointing
    calls.clear()
    after = gradients(hf, x)
    for handle in handles:
        handle.remove()
    assert recomputed == 2 * len(calls)  # every layer ran again in the backward pass, and not after disable
    assert plain.keys() == checkpointed.keys() == after.keys()
    for key in plain:
        torch.testing.assert_close(checkpointed[key], plain[key], rtol=0, atol=1e-6)
        assert torch.equal(after[key], plain[key]), key
    optimizer = torch.optim.SGD(hf.parameters(), lr=0.1)
    losses = []
    for _ in range(3):
        optimizer.zero_grad()
        loss = hf(x, labels=x).loss
        loss.backward()
        optimizer.step()
        losses.append(float(loss))
    assert losses[-1] < losses[0]


# --- embeddings on every kind -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(KINDS))
def test_resize_token_embeddings_on_every_kind_with_the_softmax_following(name):
    """``resize_token_embeddings(n)`` up and down: the embedding and the softmax have n rows, the tied softmax is
    the embedding, the kept tokens' logits are unchanged (growing) or their rows kept (shrinking), the config
    follows, and the model runs on the new ids."""
    hf = hf_of(name)
    x = torch.randint(0, 50, (2, 6))
    with torch.no_grad():
        before = hf(x).logits
    for n in (60, 40):
        embedding = hf.resize_token_embeddings(n)
        assert embedding is hf.get_input_embeddings() and embedding.weight.shape[0] == n
        head = hf.get_output_embeddings()
        assert head.weight.shape[0] == n and head.weight is embedding.weight  # tied: the softmax follows
        assert hf.config.vocab_size == n and hf.model.config.vocab_size == n
        ids = x.clamp(max=n - 1)
        with torch.no_grad():
            logits = hf(ids).logits
        assert logits.shape == (2, 6, n)
        if n == 60:
            torch.testing.assert_close(logits[..., :50], before, rtol=0, atol=1e-5)
        assert hf(torch.full((1, 3), n - 1)).logits.shape[-1] == n


@pytest.mark.parametrize("name", list(KINDS))
def test_set_input_embeddings_on_every_kind_with_a_tied_softmax_following(name):
    """``set_input_embeddings(e)``: ``get_input_embeddings()`` is ``e``, the model reads its rows, and a tied
    softmax is ``e``'s weight (``tie_weights``); the logits are those of a model whose embedding holds those rows."""
    hf = hf_of(name)
    assert isinstance(hf.get_input_embeddings(), nn.Embedding)
    assert isinstance(hf.get_output_embeddings(), nn.Linear)
    new = nn.Embedding(50, hf.get_input_embeddings().embedding_dim)
    hf.set_input_embeddings(new)
    assert hf.get_input_embeddings() is new
    assert hf.get_output_embeddings().weight is new.weight
    reference = hf_of(name)
    with torch.no_grad():
        reference.get_input_embeddings().weight.copy_(new.weight)
        x = torch.randint(0, 50, (2, 6))
        torch.testing.assert_close(hf(x).logits, reference(x).logits, rtol=0, atol=0)


# --- empty prompts ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("rows", [1, 3])
def test_an_empty_prompt_to_generate_is_refused_by_name(rows):
    """An empty prompt (and a batch of them) is refused with a message that says the prompt is empty (it said the
    cache had read 0 tokens), whether given as (B, 0) ids or as rows that are all padding."""
    hf = hf_of("xl")
    with raises_naming(ValueError, "empty", "prompt", "at least one token"):
        hf.generate(torch.zeros((rows, 0), dtype=torch.long), max_new_tokens=2, do_sample=False)
    ids = torch.randint(0, 50, (rows, 3))
    with raises_naming(ValueError, "empty", "prompt"):
        hf.generate(ids, attention_mask=torch.zeros_like(ids), max_new_tokens=2, do_sample=False)


# --- an export says what to import -------------------------------------------------------------------------------


def test_an_export_says_what_to_import_in_its_model_card_and_config(tmp_path):
    """``AutoModelForCausalLM.from_pretrained`` without ``import longseq.hf`` ends in transformers' "does not
    recognize this architecture": the export's README.md (a model card) and config.json say to import longseq.hf,
    which then loads it; save_pretrained writes the same card."""
    torch.manual_seed(0)
    model = build_model(tiny_config("xl")).eval()
    export_longseq_hf(model, str(tmp_path / "hf"), segment_len=4)
    card = (tmp_path / "hf" / "README.md").read_text()
    assert_names(card, "import longseq.hf", "AutoModelForCausalLM.from_pretrained", 'pip install "longseq[hf]"')
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert "import longseq.hf" in config["longseq_load"]
    code = (
        f"from transformers import AutoModelForCausalLM; AutoModelForCausalLM.from_pretrained({str(tmp_path / 'hf')!r})"
    )
    alone = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=os.getcwd())
    assert alone.returncode != 0 and "longseq" in alone.stderr
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")  # with longseq.hf imported (above)
    x = torch.randint(0, 50, (1, 5))
    with torch.no_grad():
        assert torch.equal(loaded(x).logits, model(x).logits)
    loaded.save_pretrained(tmp_path / "saved")
    assert "import longseq.hf" in (tmp_path / "saved" / "README.md").read_text()
