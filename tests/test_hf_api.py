"""What a transformers user reaches for beyond loading and sampling, through transformers' own API, held to
longseq's own outputs: hidden states and attentions, the deprecated ``past_key_values``, embeddings (resize, untie),
activation checkpointing through the Trainer, ``torch.export`` of a decode step, a compiled ``generate()``, and
PEFT's LoRA (padding and beam search: tests/test_hf_padding.py)."""

import tempfile
import warnings

import pytest
import torch
from support import raises_naming

transformers = pytest.importorskip("transformers")
if int(transformers.__version__.split(".")[0]) < 5:
    pytest.skip(f"longseq.hf needs transformers 5, this is {transformers.__version__}", allow_module_level=True)

from transformers import AutoModelForCausalLM  # noqa: E402

import longseq.hf  # noqa: E402, F401  (registers the classes)
from longseq import ModelConfig  # noqa: E402
from longseq.hf import LongseqConfig, LongseqForCausalLM  # noqa: E402
from longseq.interop.hf_longseq import export_longseq_hf, load_longseq_hf  # noqa: E402
from longseq.model import KVMemory, RingMemory, build_model  # noqa: E402
from longseq.model.adaptive import AdaptiveEmbedding  # noqa: E402

BASE = dict(vocab_size=50, n_layer=2, d_model=16, n_head=2, d_head=8, d_inner=32, mem_len=6, dropout=0.0)
KINDS = {
    "xl": {},
    "window-untied-r": dict(attention=["window"], window=3, untie_r=True),
    "bigbird-global": dict(attention=["bigbird", "global"], window=2, block_size=2, num_global=1, num_random_blocks=1),
    "memory-tokens": dict(mem_tokens=2),
    "hybrid-ssm": dict(mixer=["ssm", "attention"], head_dim=8),
    "hourglass": dict(n_layer=4, shorten_layers=[1, 3]),
    "learned-chunks": dict(n_layer=4, shorten_layers=[1, 3], boundaries="learned"),
    "pre-ln-projected": dict(pre_lnorm=True, d_embed=8),
}
SEGMENT = 4


def tiny(name: str = "xl", seed: int = 0, **extra):
    torch.manual_seed(seed)
    return build_model(ModelConfig(**{**BASE, **KINDS[name], **extra})).eval()


def hf_of(name: str = "xl", **extra) -> LongseqForCausalLM:
    return longseq.hf.from_longseq(tiny(name, **extra), segment_len=SEGMENT, generate_mem_len=9)


@pytest.mark.parametrize("name", ["xl", "memory-tokens", "hybrid-ssm", "hourglass", "learned-chunks"])
def test_hidden_states_are_the_embeddings_and_every_layers_output(name):
    """``output_hidden_states``: the layers' input, then each layer's output (the segment's positions, memory
    tokens cut away); the last is what the softmax reads.  ``config.output_hidden_states`` asks for them too; in
    generate, every step's states are those of the token it fed."""
    hf = hf_of(name)
    layers = hf.model.transformer.stack.layers
    inputs = []
    handles = [layer.register_forward_pre_hook(lambda m, args: inputs.append(args[0])) for layer in layers]
    x, y = torch.randint(0, 50, (2, 7)), torch.randint(0, 50, (2, 5))
    with torch.no_grad():
        cache = hf(x).cache
        inputs.clear()
        out = hf(y, cache=cache, output_hidden_states=True)
    for handle in handles:
        handle.remove()
    states = out.hidden_states
    rows = slice(hf.model.config.memory.mem_tokens, hf.model.config.memory.mem_tokens + 5)
    assert len(states) == len(layers) + 1 and all(h.shape == (2, 5, 16) for h in states)
    assert all(torch.equal(h, seen[:, rows]) for h, seen in zip(states, inputs))  # layer i's input is state i
    assert torch.equal(states[0], hf.model.transformer.word_emb(y))
    assert torch.equal(hf.model.head(states[-1]).logits, out.logits)
    hf.config.output_hidden_states = True
    with torch.no_grad():
        tuple_out = hf(y, cache=cache, return_dict=False)
    assert all(torch.equal(a, b) for a, b in zip(tuple_out[2], states))
    hf.config.output_hidden_states = False
    options = dict(output_hidden_states=True, output_logits=True, return_dict_in_generate=True)
    made = hf.generate(x, max_new_tokens=3, do_sample=False, **options)
    assert len(made.hidden_states) == 3
    for step, logits in zip(made.hidden_states, made.logits):  # each step: the token fed, through every layer
        assert len(step) == len(layers) + 1
        assert torch.allclose(hf.model.head(step[-1][:, -1:]).logits[:, -1], logits, atol=1e-6)
    assert torch.equal(made.sequences, hf.generate(x, max_new_tokens=3, do_sample=False))
    lstm = longseq.hf.from_longseq(build_model(ModelConfig(**BASE, arch="lstm")))
    with pytest.raises(ValueError, match="LSTM baseline returns no hidden states"):
        lstm(x, output_hidden_states=True)


def attention_layers(hf):
    return [layer.dec_attn for layer in hf.model.transformer.stack.layers if layer.attends]


def record_attention(hf) -> tuple[list, list]:
    """Forward hooks that keep each attention module's input and output (out, its keys and values), cloned (a ring
    memory's views are written again later)."""
    seen = []

    def hook(module, args, output):
        out, (key, value), _ = output
        seen.append((module, args[0].clone(), out.clone(), value.clone()))

    return seen, [module.register_forward_hook(hook) for module in attention_layers(hf)]


def reapply(module, hidden, probs, value):
    """The attention module's output from its probabilities and values: o_net(P V), the residual, the norm."""
    batch, heads, qlen, _ = probs.shape
    mixed = (probs @ value).transpose(1, 2).reshape(batch, qlen, -1)  # (B, T, H*D)
    return hidden + module.o_net(mixed) if module.pre_lnorm else module.layer_norm(hidden + module.o_net(mixed))


@pytest.mark.parametrize("name", ["xl", "window-untied-r", "bigbird-global", "pre-ln-projected"])
def test_attentions_are_the_probabilities_the_layers_apply(name):
    """``output_attentions``: each attention layer's (B, H, T, K) probabilities over [memory; segment], causal and
    summing to one, which applied to the layer's values give the layer's output, whatever kernel computed it; in
    generate too, over its ring memory, without changing what it draws."""
    hf = hf_of(name)
    x, y = torch.randint(0, 50, (2, 7)), torch.randint(0, 50, (2, 5))
    with torch.no_grad():
        cache = hf(x).cache
        seen, handles = record_attention(hf)
        out = hf(y, cache=cache, output_attentions=True)
        assert len(out.attentions) == len(seen) == len(attention_layers(hf))
        for probs, (module, hidden, output, value) in zip(out.attentions, seen):
            mlen = value.size(2) - 5
            assert probs.shape == (2, 2, 5, mlen + 5)
            assert torch.allclose(probs.sum(-1), torch.ones(2, 2, 5), atol=1e-5)
            assert not probs[..., mlen:].triu(1).any()  # no key after the query
            assert torch.allclose(reapply(module, hidden, probs, value), output, atol=1e-5)
        seen.clear()
        made = hf.generate(x, max_new_tokens=3, do_sample=False, output_attentions=True, return_dict_in_generate=True)
        for handle in handles:
            handle.remove()
    steps = [a for step in made.attentions for a in step]
    seen = [s for s in seen if s[1].size(1) == 1]  # the steps, not the prompt read into the memory before them
    assert len(steps) == len(seen) == 3 * len(attention_layers(hf))
    for probs, (module, hidden, output, value) in zip(steps, seen):
        assert torch.allclose(reapply(module, hidden, probs, value), output, atol=1e-5)
    assert torch.equal(made.sequences, hf.generate(x, max_new_tokens=3, do_sample=False))


def test_past_key_values_is_the_deprecated_cache():
    hf = hf_of("hybrid-ssm")
    x, y = torch.randint(0, 50, (2, 7)), torch.randint(0, 50, (2, 3))
    with torch.no_grad():
        cache = hf(x).cache
        expected = hf(y, cache=cache).logits
        with pytest.warns(FutureWarning, match=r"`past_key_values` is deprecated .* Use `cache` instead"):
            assert torch.equal(hf(y, past_key_values=cache).logits, expected)
    first = hf.generate(x, max_new_tokens=2, do_sample=False, return_dict_in_generate=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        more = hf.generate(first.sequences, past_key_values=first.cache, max_new_tokens=3, do_sample=False)
    assert torch.equal(more, hf.generate(x, max_new_tokens=5, do_sample=False))


def test_transformers_caches_are_taken_when_empty_and_refused_by_name_otherwise():
    """What a transformers user passes as ``past_key_values``: an empty ``DynamicCache``, tuple or list is no memory
    (the same logits and tokens as none); one that holds keys and values in transformers' layout, or anything else,
    is a TypeError naming it and what to pass (a LongseqCache), before the model runs."""
    from transformers import DynamicCache

    hf = hf_of("hybrid-ssm")
    x = torch.randint(0, 50, (2, 7))
    expected, tokens = hf(x).logits, hf.generate(x, max_new_tokens=3, do_sample=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        for empty in (DynamicCache(), (), []):
            assert torch.equal(hf(x, past_key_values=empty).logits, expected)
            assert torch.equal(hf.generate(x, past_key_values=empty, max_new_tokens=3, do_sample=False), tokens)
        held = DynamicCache()
        held.update(torch.zeros(2, 2, 3, 8), torch.zeros(2, 2, 3, 8), 0)
        legacy = ((torch.zeros(2, 2, 3, 8), torch.zeros(2, 2, 3, 8)),)
        for given, name in ((held, "DynamicCache"), (legacy, "tuple"), ({"layers": []}, "dict")):
            with raises_naming(TypeError, name, "LongseqCache"):
                hf(x, past_key_values=given)
            with raises_naming(TypeError, name, "LongseqCache"):
                hf.generate(x, past_key_values=given, max_new_tokens=2)


def test_input_embeddings_and_resizing(tmp_path):
    """``get_input_embeddings()`` is the vocabulary's ``nn.Embedding`` under longseq's own tensor name;
    ``resize_token_embeddings`` keeps every old token's logits, serves the new ids, and saves and loads; a model
    with adaptive clusters is refused."""
    hf = hf_of("pre-ln-projected")
    embedding = hf.get_input_embeddings()
    assert isinstance(embedding, torch.nn.Embedding)
    assert embedding.weight is dict(hf.named_parameters())["model.transformer.word_emb.emb_layers.0.weight"]
    x = torch.randint(0, 50, (2, 7))
    before = hf(x).logits
    hf(x, labels=x).loss.backward()  # a backward before the resize: the new parameters must not mind
    assert hf.resize_token_embeddings(61, pad_to_multiple_of=8).num_embeddings == 64
    assert (hf.config.vocab_size, hf.model.config.vocab_size, hf.config.longseq["vocab_size"]) == (64, 64, 64)
    assert torch.allclose(hf(x).logits[..., :50], before, atol=1e-6)
    assert hf.model.crit.out_layers[0].weight is hf.get_input_embeddings().weight  # still tied
    z = torch.randint(0, 64, (2, 7))
    hf.zero_grad()
    hf(z, labels=z).loss.backward()
    assert hf.get_input_embeddings().weight.grad.shape == (64, 8)
    hf.save_pretrained(str(tmp_path / "resized"))
    again = AutoModelForCausalLM.from_pretrained(str(tmp_path / "resized"))
    assert torch.equal(again(z).logits, hf(z).logits)
    hf.resize_token_embeddings(40, mean_resizing=False)
    assert hf(torch.randint(0, 40, (1, 3))).logits.shape == (1, 3, 40)
    adaptive = longseq.hf.from_longseq(tiny("xl", cutoffs=[10, 30], div_val=2))
    assert isinstance(adaptive.get_input_embeddings(), AdaptiveEmbedding)
    with pytest.raises(ValueError, match=r"adaptive clusters at \[10, 30\]"):
        adaptive.resize_token_embeddings(60)


def test_tie_word_embeddings_false_unties_the_softmax(tmp_path):
    """``from_pretrained(DIR, tie_word_embeddings=False)`` on a tied export: a softmax of its own, starting as the
    embedding (the same logits), trained apart, and saved and loaded untied."""
    model = tiny("xl")
    export_longseq_hf(model, str(tmp_path / "hf"), segment_len=SEGMENT)
    hf = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"), tie_word_embeddings=False)
    head, embedding = hf.get_output_embeddings(), hf.get_input_embeddings()
    assert head.weight is not embedding.weight and torch.equal(head.weight, embedding.weight)
    x = torch.randint(0, 50, (2, 7))
    assert torch.equal(hf(x).logits, model(x).logits)
    hf.train()
    hf(x, labels=x).loss.backward()
    torch.optim.SGD(hf.parameters(), lr=1.0).step()
    assert not torch.equal(head.weight, embedding.weight)
    hf.save_pretrained(str(tmp_path / "untied"))
    _, _, config = load_longseq_hf(str(tmp_path / "untied"))
    assert config["tie_word_embeddings"] is False and config["longseq"]["tie_weight"] is False
    again = AutoModelForCausalLM.from_pretrained(str(tmp_path / "untied")).train()
    assert torch.equal(again(x).logits, hf(x).logits)
    built = LongseqForCausalLM(LongseqConfig(longseq=BASE, tie_word_embeddings=False))
    assert built.get_output_embeddings().weight is not built.get_input_embeddings().weight


def train_with_trainer(checkpointing: bool, tmp_path) -> tuple[LongseqForCausalLM, list, list]:
    pytest.importorskip("accelerate")  # transformers' Trainer needs it (the test extra has it)
    from transformers import Trainer, TrainingArguments

    hf = hf_of("hybrid-ssm", dropout=0.1).train()  # dropout: the recomputation must draw the same masks
    calls, states = [], []
    hf.model.transformer.stack.layers[1].register_forward_pre_hook(lambda *a: calls.append(1))
    hf.model.transformer.stack.layers[1].register_forward_pre_hook(
        lambda *a: states.append(hf.model.transformer.stack.activation_checkpointing)
    )
    rows = torch.randint(0, 50, (8, 12), generator=torch.Generator().manual_seed(0)).tolist()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # gradient_checkpointing: transformers' deprecated alias
        args = TrainingArguments(
            output_dir=str(tmp_path / f"run-{checkpointing}"),
            per_device_train_batch_size=4,
            max_steps=2,
            gradient_checkpointing=checkpointing,
            use_cpu=True,
            report_to="none",
            save_strategy="no",
            logging_strategy="no",
            disable_tqdm=True,
            seed=0,
        )
        Trainer(model=hf, args=args, train_dataset=[{"input_ids": r, "labels": r} for r in rows]).train()
    return hf, calls, states


def test_trainer_gradient_checkpointing_is_longseqs_activation_checkpointing(tmp_path):
    """``TrainingArguments(gradient_checkpointing=True)`` switches longseq's activation checkpointing on: every
    layer runs again in the backward pass, and the weights after training are those trained without it."""
    plain, plain_calls, plain_states = train_with_trainer(False, tmp_path)
    checked, calls, states = train_with_trainer(True, tmp_path)
    assert (len(plain_calls), set(plain_states)) == (2, {0})  # two steps, one forward each
    assert (len(calls), set(states)) == (4, {1})  # and the recomputation in each backward
    assert checked.is_activation_checkpointing and not plain.is_activation_checkpointing
    for (name, a), b in zip(plain.named_parameters(), checked.parameters()):
        assert torch.allclose(a, b, atol=1e-6), name
    checked.activation_checkpointing_disable()
    assert checked.model.transformer.stack.activation_checkpointing == 0 and not checked.is_activation_checkpointing
    with pytest.raises(ValueError, match="use_reentrant=False"):
        checked.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": True})
    checked.activation_checkpointing_enable(every_n_layers=2)
    assert checked.model.transformer.stack.activation_checkpointing == 2
    hourglass = hf_of("hourglass")
    hourglass.activation_checkpointing_enable()
    inner = hourglass.model.transformer.stack.layers[1].inner
    assert inner.activation_checkpointing == hourglass.model.transformer.stack.activation_checkpointing == 1
    with pytest.raises(ValueError, match="LSTMLM baseline has no activation checkpointing"):
        longseq.hf.from_longseq(build_model(ModelConfig(**BASE, arch="lstm"))).activation_checkpointing_enable()


@pytest.mark.parametrize("name", ["xl", "hybrid-ssm"])
def test_torch_export_covers_a_decode_step(name):
    """``torch.export`` of ``forward`` over a cache (a registered pytree): the exported step, run on the cache it
    returns, gives eager's logits and memory step after step; a ring cache and a rebuilt cache are refused by
    name."""
    hf = hf_of(name)
    x = torch.randint(0, 50, (2, 9))
    with torch.no_grad():
        cache = hf(x).cache  # a full memory: every step after it has the same shapes
        step = torch.export.export(hf, (x[:, :1],), {"cache": cache}).module()
        eager = exported = cache
        for token in torch.randint(0, 50, (3, 2, 1)):
            a, b = hf(token, cache=eager), step(token, cache=exported)
            assert torch.equal(a.logits, b.logits)
            held, got = a.cache.memory.all_tensors(), b.cache.memory.all_tensors()
            assert len(held) == len(got) and all(torch.equal(p, q) for p, q in zip(held, got))
            eager, exported = a.cache, b.cache
    with pytest.raises(ValueError, match="does not know how many tokens"):
        hf.generate(x, cache=exported, max_new_tokens=1)
    ring = hf.generate(x, max_new_tokens=1, return_dict_in_generate=True).cache
    with pytest.raises(ValueError, match="a ring memory .* cannot be flattened"):
        torch.export.export(hf, (x[:, :1],), {"cache": ring})


def test_torch_export_refuses_learned_chunks_by_name():
    """The number of chunks a dynamic hourglass cuts depends on the data: ``torch.export`` is refused, naming the
    option, where eager reads and generates."""
    hf = hf_of("learned-chunks")
    x = torch.randint(0, 50, (2, 9))
    with torch.no_grad():
        cache = hf(x).cache
        with pytest.raises(Exception, match="boundaries=learned or entropy"):
            torch.export.export(hf, (x[:, :1],), {"cache": cache})
    assert hf.generate(x, max_new_tokens=3, do_sample=False).shape == (2, 12)


def compiled_generate(backend: str | None):
    hf = hf_of("xl")
    x = torch.randint(0, 50, (2, 9))
    expected = hf.generate(x, max_new_tokens=8, do_sample=False, return_dict_in_generate=True)
    torch._dynamo.reset()
    try:
        hf.forward = torch.compile(hf.forward, **({"backend": backend} if backend else {}))
        made = hf.generate(x, max_new_tokens=8, do_sample=False, return_dict_in_generate=True)
    finally:
        torch._dynamo.reset()
    assert torch.equal(made.sequences, expected.sequences)
    assert (expected.cache.memory.kind, made.cache.memory.kind) == (RingMemory, KVMemory)


def test_compiled_forward_generates_the_same_tokens_from_a_key_value_memory():
    """``model.forward = torch.compile(model.forward)``: generate reads the memory into concatenated keys and
    values (a ring's host-side indices break inductor's dynamic shapes) and draws eager's tokens (traced by the
    eager backend here; the slow test runs inductor)."""
    compiled_generate("eager")


@pytest.mark.slow  # inductor compiles four graphs: 15-20 s on two cores
def test_default_torch_compile_generates_the_same_tokens():
    compiled_generate(None)


def test_lora_through_peft():
    """PEFT's LoRA on the target modules docs/transformers.md names: the adapted model starts as the base one,
    trains only the adapters, and merges into a plain LongseqForCausalLM computing what the adapted one does."""
    peft = pytest.importorskip("peft")
    hf = hf_of("hybrid-ssm")
    base = {k: v.clone() for k, v in hf.state_dict().items()}
    x = torch.randint(0, 50, (2, 7))
    expected = hf(x).logits
    targets = ["qkv_net", "o_net", "core_net.0", "core_net.3", "in_proj", "out_proj"]
    adapted = peft.get_peft_model(hf, peft.LoraConfig(r=2, lora_alpha=4, target_modules=targets))
    assert torch.equal(adapted(input_ids=x).logits, expected)
    trainable = {n for n, p in adapted.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    assert {n.split(".lora_")[0].split(".")[-1] for n in trainable} >= {"qkv_net", "o_net", "in_proj", "out_proj"}
    optimizer = torch.optim.SGD([p for p in adapted.parameters() if p.requires_grad], lr=1.0)
    for _ in range(2):
        adapted(input_ids=x, labels=x).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    tuned = adapted(input_ids=x).logits
    assert not torch.allclose(tuned, expected)
    drawn = adapted.generate(input_ids=x, max_new_tokens=4, do_sample=False)
    merged = adapted.merge_and_unload()
    assert isinstance(merged, LongseqForCausalLM)
    assert torch.allclose(merged(x).logits, tuned, atol=1e-5)
    assert torch.equal(merged.generate(x, max_new_tokens=4, do_sample=False), drawn)
    changed = {k for k, v in merged.state_dict().items() if not torch.equal(v, base[k])}
    assert changed and all(any(t in k for t in targets) for k in changed)
    with tempfile.TemporaryDirectory() as directory:
        merged.save_pretrained(directory)
        assert torch.equal(AutoModelForCausalLM.from_pretrained(directory)(x).logits, merged(x).logits)


def test_a_linear_model_exported_before_its_restarts_existed_loads_as_it_ran(tmp_path):
    """An export of ``mixer=linear,delta`` whose longseq section has no ``reset_every``, ``rotary`` or ``short_conv``
    (written before they existed) loads, through longseq and through ``from_pretrained``, unbounded, unrotated and
    without delta's short convolution: the saved model's logits.  A config written by hand with a partial mixers
    section is not taken for an old one: it gets today's defaults."""
    import json

    model = tiny("xl", mixer=["linear", "delta"], reset_every=0, rotary=False, short_conv=[])
    export_longseq_hf(model, str(tmp_path / "hf"), segment_len=SEGMENT)
    path = tmp_path / "hf" / "config.json"
    config = json.loads(path.read_text())
    for key in ("reset_every", "rotary", "short_conv"):
        del config["longseq"]["mixers"][key]
    path.write_text(json.dumps(config))
    by_hand = LongseqConfig(longseq={"vocab_size": 50, "mixer": ["delta"], "mixers": {"chunk": 16}}).model_config()
    assert by_hand.mixers.short_conv == ["delta"] and by_hand.mixers.reset_every == 64
    x = torch.randint(0, 50, (2, 7))
    loaded, _, _ = load_longseq_hf(str(tmp_path / "hf"))
    hf = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"))
    assert hf.config.longseq["mixers"]["reset_every"] == 0 and loaded.config.mixers.rotary is False
    assert hf.config.longseq["mixers"]["short_conv"] == [] == loaded.config.mixers.short_conv
    with torch.no_grad():
        for logits in (loaded(x).logits, hf(x).logits):
            torch.testing.assert_close(logits, model(x).logits, rtol=0, atol=0)
