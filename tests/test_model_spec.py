"""What the trainer asks of an architecture (``model/spec.py``, one ``ModelSpec`` per architecture): each function
gives what the trainer computed itself before it asked (the FSDP units, the depth of every parameter for layer-wise
learning-rate decay, the stack whose layers activation checkpointing recomputes, the tied softmax's name) for the
Transformer-XL, with an hourglass (fixed or learned boundaries), a hybrid of mixers, a llama-style block and a tied
adaptive softmax, for the LSTM baseline, and for a task's model that holds either."""

from __future__ import annotations

import re

import pytest
import torch
from support import tiny_lstm_config, tiny_model_config

from longseq.config import ConfigError
from longseq.model import build_model
from longseq.model.heads import DocumentClassifier, MaskedLM
from longseq.model.registry import ARCHITECTURES, MODEL_SPECS, model_spec
from longseq.model.stack import LayerStack

XL_VARIANTS = {
    "plain": {},
    "hourglass": dict(n_layer=4, shorten_layers=[1, 3]),
    "hybrid": dict(n_layer=4, mixer=["ssm", "attention", "conv", "rnn"]),
    "learned boundaries": dict(n_layer=4, shorten_layers=[1, 3], shorten_factor=3, boundaries="learned"),
    "llama block": dict(norm="rmsnorm", ff="swiglu", final_norm=True, pre_lnorm=True, pos="rope", qk_norm=True),
    "adaptive, tied": dict(
        vocab_size=60, cutoffs=[20, 40], div_val=2, d_embed=16, tie_projs=[False, True, True], untie_r=True
    ),
}


def old_layer_of(name: str, n_layer: int) -> int:
    """The trainer's rule before the spec (train/optim.py, parsing names, as it read the backbone's stack at
    ``transformer.stack``), kept here as the reference."""
    name = name.removeprefix("lm.")
    if name.startswith(("transformer.word_emb", "embedding")):
        return 0
    for prefix in (
        "transformer.stack.layers.",
        "lstm.weight_ih_l",
        "lstm.weight_hh_l",
        "lstm.bias_ih_l",
        "lstm.bias_hh_l",
    ):
        if name.startswith(prefix):
            return int(name[len(prefix) :].split(".")[0].split("_")[0]) + 1
    return n_layer + 1


def models():
    """(name, model) for every variant, alone and inside a task's model."""
    torch.manual_seed(0)
    out = [(f"xl {name}", build_model(tiny_model_config(**extra))) for name, extra in XL_VARIANTS.items()]
    out.append(("lstm", build_model(tiny_lstm_config())))
    out.append(("lstm, untied", build_model(tiny_lstm_config().replace(tie_weight=False))))
    out.append(("classifier over xl", DocumentClassifier(build_model(tiny_model_config()), 3)))
    out.append(("masked LM over xl hourglass", MaskedLM(build_model(tiny_model_config(**XL_VARIANTS["hourglass"])))))
    return out


@pytest.mark.parametrize("name, model", models(), ids=lambda v: v if isinstance(v, str) else "")
def test_layer_depths_are_the_old_name_rule(name, model):
    depths = model_spec(model.config.arch).layer_depths(model)
    old = {n: old_layer_of(n, model.config.n_layer) for n, _ in model.named_parameters()}
    assert depths == old
    assert set(depths.values()) >= {0, 1, model.config.n_layer + 1}  # the embedding, a layer and the top all occur


@pytest.mark.parametrize(
    "name, model", [m for m in models() if "lstm" not in m[0]], ids=lambda v: v if isinstance(v, str) else ""
)
def test_fsdp_units_are_the_stacks_layers_then_the_language_model(name, model):
    """The old shard_model: ``fully_shard`` on each of ``lm.transformer.stack.layers``, then on the language model, then
    (a task's model) on the whole."""
    lm = getattr(model, "lm", model)
    assert model_spec("transformer").fsdp_units(model) == [*lm.transformer.stack.layers, lm]
    assert MODEL_SPECS["lstm"].fsdp_units is None


@pytest.mark.parametrize("name, model", models(), ids=lambda v: v if isinstance(v, str) else "")
def test_activation_checkpointing_is_set_on_the_outer_stack_only(name, model):
    """The old trainer set ``activation_checkpointing`` on ``lm.transformer.stack`` (an hourglass's inner stack kept
    0) and skipped the LSTM silently; the LSTM's spec now refuses a k > 0 by name."""
    spec = model_spec(model.config.arch)
    if model.config.arch == "lstm":
        spec.set_activation_checkpointing(model, 0)
        with pytest.raises(ConfigError, match="arch=lstm"):
            spec.set_activation_checkpointing(model, 2)
        return
    stacks = [m for m in model.modules() if isinstance(m, LayerStack)]
    assert all(s.activation_checkpointing == 0 for s in stacks)
    spec.set_activation_checkpointing(model, 2)
    assert stacks[0] is getattr(model, "lm", model).transformer.stack and stacks[0].activation_checkpointing == 2
    assert [s.activation_checkpointing for s in stacks[1:]] == [0] * (len(stacks) - 1)


def test_the_tied_heads_name_the_embedding_a_tied_softmax_shares():
    """Each pattern of ``tied_heads`` matches exactly the softmax weights that are the embedding's tensor."""
    for name, model in models()[: len(XL_VARIANTS) + 2]:
        tied = {n for n, _ in model.named_parameters(remove_duplicate=False)} - set(dict(model.named_parameters()))
        params = dict(model.named_parameters(remove_duplicate=False))
        heads = {
            n: re.sub(pattern, target, n)
            for n in tied
            for pattern, target in model_spec(model.config.arch).tied_heads.items()
            if re.fullmatch(pattern, n)
        }
        softmax = {n for n in tied if n.startswith(("crit.out_layers", "decoder"))}
        assert set(heads) == softmax, name
        assert all(params[n] is params[source] for n, source in heads.items()), name


def test_the_registry_builds_each_architecture_by_its_spec():
    assert ARCHITECTURES == {name: spec.build for name, spec in MODEL_SPECS.items()}
    assert set(MODEL_SPECS) == {"transformer", "lstm"}
    with pytest.raises(ConfigError, match="transformer"):
        model_spec("transformr")
