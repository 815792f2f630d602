"""Reverse complement (Caduceus, Schiff et al. 2024): the ``rc_ssm`` and ``rc_conv`` mixers are equivariant
(the output for the reverse complement is the reverse complement of the output, float64, to 1e-10), share their
parameters between the strands and the directions, keep padding out of both directions, and a causal language
model is refused them; reverse-complement augmentation reads a row of the stream as its other strand, whole
(the memory holds that strand's past), and a task's examples as theirs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from support import raises_naming

from longseq import ModelConfig
from longseq.config.base import ConfigError
from longseq.config.model import BIDIRECTIONAL_MIXERS
from longseq.model import build_model
from longseq.model.mixers import MIXERS
from longseq.model.mixers.conv import GatedConv
from longseq.model.mixers.reverse_complement import Bidirectional, reverse_complement
from longseq.model.mixers.ssm import Mamba2

SMALL = dict(vocab_size=7, n_layer=2, d_model=16, n_head=2, d_head=8, d_inner=32, mem_len=0, dropout=0.0,
             head_dim=8, bidirectional=True)  # fmt: skip
RC = sorted(BIDIRECTIONAL_MIXERS)


def mixer(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    layer = MIXERS[name].build(ModelConfig(**SMALL, mixer=[name])).double()
    with torch.no_grad():  # weights large enough that every part of the layer shows in its output
        for p in layer.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return layer


def test_the_registry_and_the_config_name_the_same_bidirectional_mixers():
    assert {name for name, kind in MIXERS.items() if kind.bidirectional} == set(BIDIRECTIONAL_MIXERS)


@pytest.mark.parametrize("name", RC)
def test_the_output_for_the_reverse_complement_is_the_reverse_complement_of_the_output(name):
    layer = mixer(name)
    h = torch.randn(3, 23, 16, dtype=torch.float64)
    out, _ = layer(h, None)
    flipped, _ = layer(reverse_complement(h), None)
    torch.testing.assert_close(flipped, reverse_complement(out), rtol=0, atol=1e-10)
    assert (out - reverse_complement(out)).abs().max() > 1e-2  # not trivially symmetric
    docs = (torch.tensor([[0] * 15 + [1] * 8, [0] * 23, [2] * 5 + [3] * 18]), torch.zeros(3, dtype=torch.long))
    out, _ = layer(h, None, docs)
    flipped, _ = layer(reverse_complement(h), None, (docs[0].flip(1), docs[0].flip(1)[:, 0]))
    torch.testing.assert_close(flipped, reverse_complement(out), rtol=0, atol=1e-10)


@pytest.mark.parametrize("name", RC)
def test_padding_reaches_neither_direction(name):
    """A row padded at its end (masked LM's padding, as a second document) reads its tokens as the row alone."""
    layer = mixer(name)
    h = torch.randn(1, 17, 16, dtype=torch.float64)
    alone, _ = layer(h[:, :12], None)
    docs = (torch.tensor([[0] * 12 + [1] * 5]), torch.zeros(1, dtype=torch.long))
    padded, _ = layer(h, None, docs)
    torch.testing.assert_close(padded[:, :12], alone, rtol=0, atol=1e-10)


def test_one_layer_serves_both_strands_and_both_directions():
    """The parameters are one inner layer's of half the width, and the layer is its definition written out."""
    layer = mixer("rc_conv")
    inner = layer.layer.inner.inner
    assert isinstance(inner, GatedConv) and inner.in_proj.in_features == 8
    assert sum(p.numel() for p in layer.parameters()) == sum(p.numel() for p in inner.parameters())
    h = torch.randn(2, 9, 16, dtype=torch.float64)

    def both_ways(x):
        return inner(x, None)[0] + inner(x.flip(1), None)[0].flip(1)

    expected = torch.cat([both_ways(h[..., :8]), both_ways(h[..., 8:].flip(1, 2)).flip(1, 2)], dim=-1)
    torch.testing.assert_close(layer(h, None)[0], expected, rtol=0, atol=1e-12)
    ssm = mixer("rc_ssm").layer.inner
    assert isinstance(ssm, Bidirectional) and isinstance(ssm.inner, Mamba2)


@pytest.mark.parametrize("name", RC)
def test_a_causal_language_model_is_refused_the_bidirectional_mixers(name):
    with raises_naming(ConfigError, name, "bidirectional=true", "masked LM"):
        ModelConfig(**{**SMALL, "bidirectional": False}, mixer=[name])
    with raises_naming(ConfigError, "ssm", "causal", "bidirectional"):
        ModelConfig(**SMALL, mixer=[name, "ssm"])


@pytest.mark.parametrize("name", RC)
def test_a_bidirectional_model_of_rc_layers_reads_later_tokens(name):
    model = build_model(ModelConfig(**SMALL, mixer=[name])).eval()
    x = torch.randint(2, 6, (1, 12))
    later = x.clone()
    later[0, 9] = 2 if x[0, 9] != 2 else 3
    assert not torch.allclose(model(x).logits[0, 3], model(later).logits[0, 3])
    state = model(x).mems
    assert all(t.shape == (1, 0) for layer in state.layers for t in layer.tensors)  # nothing carried


def complemented(ids: np.ndarray) -> np.ndarray:
    return np.asarray([0, 1, 5, 4, 3, 2, 6])[ids[::-1]]  # the nucleotide tokenizer's complement, reversed
