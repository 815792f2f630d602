"""The redesign's claims: format v1 checkpoints still load and score what they scored, the registries implement
exactly the names configs accept, every forward returns a new memory without touching the one it was given, and
the vanilla Transformer's fused path equals its readable reference."""

import json
import os

import pytest
import torch

from longseq.config import ConfigError, ModelConfig, apply_overrides, get_preset
from longseq.data.corpus import bundled_corpus_path
from longseq.eval import evaluate
from longseq.model import Memory, TransformerXLLM, build_model
from longseq.model.attention.kernels import ATTENTION_KERNELS
from longseq.model.attention.patterns import PATTERNS
from longseq.model.memory.compress import COMPRESSION_FUNCTIONS
from longseq.model.mixers import MIXERS
from longseq.model.positions import POSITION_ENCODINGS
from longseq.train import load_checkpoint

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")


@pytest.mark.parametrize("name", ["v1_plain", "v1_compact"])
def test_a_format_v1_checkpoint_loads_and_scores_the_same_loss(name):
    with open(os.path.join(FIXTURES, "v1_scores.json")) as f:
        record = json.load(f)
    model, tokenizer, run, _ = load_checkpoint(os.path.join(FIXTURES, name))
    with open(bundled_corpus_path(), encoding="utf-8") as f:
        ids = tokenizer.encode(f.read()[: record["text_chars"]])
    expected = record["scores"][name]
    result = evaluate(model, ids, batch_size=expected["batch_size"], tgt_len=expected["tgt_len"], kv_memory=False)
    assert result["tokens"] == expected["tokens"]
    assert result["loss"] == pytest.approx(expected["loss"], abs=1e-6)
    if name == "v1_compact":  # the renamed tensors arrived: compressors and memory tokens are not the init
        assert run.model.memory.cmem_len == 4 and run.model.memory.mem_tokens == 2
        assert not torch.equal(model.transformer.memory_tokens, torch.zeros_like(model.transformer.memory_tokens))


@pytest.mark.parametrize(
    "field, registry",
    [("attention", lambda: PATTERNS), ("attn_impl", lambda: ATTENTION_KERNELS), ("pos", lambda: POSITION_ENCODINGS),
     ("mixer", lambda: MIXERS), ("cmem_fn", lambda: COMPRESSION_FUNCTIONS)],
)  # fmt: skip
def test_a_config_may_name_what_a_registry_implements_and_nothing_else(field, registry):
    """The registries own the names: every registered name builds a model, an unknown one is refused by name at
    build time with the close matches (no list of names is kept anywhere else)."""
    base = dict(vocab_size=12, n_layer=2, d_model=16, n_head=2, d_head=8, d_inner=32, mem_len=4)
    extra = {"cmem_fn": dict(cmem_len=2, cmem_rate=2), "mixer": {}, "attention": dict(window=3)}.get(field, {})
    for name in registry():
        value = [name] if field in ("attention", "mixer") else name
        if name == "flex":
            continue  # a CUDA kernel (and PyTorch's eager path on CPU): test_flex holds it to the reference
        config = ModelConfig(**{**base, **extra, field: value, **({"mem_len": 0} if name == "absolute" else {})})
        build_model(config)
    wrong = ["windw"] if field in ("attention", "mixer") else "windw"
    with pytest.raises(ConfigError, match=r"unknown value 'windw'"):
        build_model(ModelConfig(**base, **{field: wrong}))


def test_old_flat_override_keys_and_dotted_section_keys_both_work():
    run = get_preset("tiny-shakespeare")
    sections = {"model": run.model, "data": run.data, "train": run.train}
    flat = apply_overrides(sections, ["mem_len=12", "attention=window", "pos=shaw", "cmem_len=2", "cmem_rate=2"])
    dotted = apply_overrides(
        sections,
        ["model.memory.mem_len=12", "pattern.attention=window", "positions.pos=shaw", "memory.cmem_len=2",
         "model.memory.cmem_rate=2"],
    )  # fmt: skip
    assert flat["model"] == dotted["model"]
    assert flat["model"].memory.mem_len == 12 and flat["model"].pattern.attention == ["window"]
    assert ModelConfig.from_dict(flat["model"].to_dict()) == flat["model"]  # nested JSON round trip


BASE = dict(vocab_size=30, n_layer=2, d_model=16, n_head=2, d_head=8, d_inner=32, dropout=0.0, mem_len=6)


def _snapshot(memory: Memory) -> list[torch.Tensor]:
    return [t.clone() for layer in memory.layers for t in layer.tensors()]


@pytest.mark.parametrize(
    "storage,overrides",
    [("hidden", {}), ("hidden", {"cmem_len": 4, "cmem_rate": 2, "mem_quant": "int8"}), ("hidden", {"mem_tokens": 2}),
     ("hidden", {"mem_select": "attention"}), ("kv", {})],
)  # fmt: skip
def test_every_call_returns_a_new_memory_and_leaves_its_input_untouched(storage, overrides):
    torch.manual_seed(0)
    model = TransformerXLLM(ModelConfig(**BASE, **overrides)).eval()
    x = torch.randint(0, 30, (2, 20))
    memory = Memory.empty(storage)
    for lo in range(0, 20, 5):
        before = _snapshot(memory)
        new = model(x[:, lo : lo + 5], memory).mems
        assert new is not memory
        after = _snapshot(memory)
        assert len(before) == len(after) and all(torch.equal(a, b) for a, b in zip(before, after))
        again = model(x[:, lo : lo + 5], memory).mems  # the old memory still gives the same answer
        assert all(torch.equal(a, b) for a, b in zip(_snapshot(new), _snapshot(again)))
        memory = new


def test_a_superseded_ring_memory_is_refused_by_name():
    model = TransformerXLLM(ModelConfig(**BASE)).eval()
    x = torch.randint(0, 30, (1, 4))
    first = model(x, Memory.empty("ring")).mems
    model(x, first)  # writes the ring in place: ``first`` is now stale
    with pytest.raises(ValueError, match="superseded"):
        model(x, first)


def test_vanilla_fused_attention_equals_its_readable_reference():
    torch.manual_seed(0)
    config = dict(BASE, mem_len=0, pos="absolute", dropout=0.0)
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
