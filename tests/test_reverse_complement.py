"""Reverse complement (Caduceus, Schiff et al. 2024): the ``rc_ssm`` and ``rc_conv`` mixers are equivariant
(the output for the reverse complement is the reverse complement of the output, float64, to 1e-10), share their
parameters between the strands and the directions, keep padding out of both directions, and a causal language
model is refused them; reverse-complement augmentation reads a row of the stream as its other strand, whole
(the memory holds that strand's past), and a task's examples as theirs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from support import assert_names, raises_naming

from longseq import ModelConfig
from longseq.config.base import ConfigError
from longseq.config.model import BIDIRECTIONAL_MIXERS
from longseq.data.batching import OrderedStream
from longseq.model import build_model
from longseq.model.mixers import MIXERS
from longseq.model.mixers.conv import GatedConv
from longseq.model.mixers.reverse_complement import Bidirectional, reverse_complement
from longseq.model.mixers.ssm import Mamba2
from longseq.tasks.base import reverse_complements

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


def test_a_stream_row_is_read_whole_as_its_other_strand():
    """rc_prob=1: every row's segments, one after the other, are its reverse complement from its start, inputs and
    labels alike; the memory of a row therefore always holds that strand's past."""
    ids = np.random.default_rng(0).integers(2, 7, size=2 * 41)
    comp = np.asarray([0, 1, 5, 4, 3, 2, 6])
    stream = OrderedStream(ids, batch_size=2, tgt_len=8, complement=comp, rc_prob=1.0)
    segments = [stream.next_segment(cycle=False) for _ in range(5)]
    inputs = torch.cat([s.input_ids for s in segments], dim=1).numpy()
    labels = torch.cat([s.labels for s in segments], dim=1).numpy()
    for row in range(2):
        strand = complemented(ids[row * 41 : (row + 1) * 41])
        assert np.array_equal(inputs[row], strand[:-1]) and np.array_equal(labels[row], strand[1:])


def test_each_pass_draws_its_strands_and_a_resumed_stream_reads_the_same():
    ids = np.random.default_rng(1).integers(2, 7, size=16 * 20)
    comp = np.asarray([0, 1, 5, 4, 3, 2, 6])
    stream = OrderedStream(ids, batch_size=16, tgt_len=19, complement=comp, rc_prob=0.5, seed=3)
    passes = []
    for _ in range(3):
        first = stream.next_segment()
        flips = stream.flipped_rows()
        rows = np.stack([complemented(r)[:-1] if f else r[:-1] for r, f in zip(ids.reshape(16, 20), flips)])
        assert np.array_equal(first.input_ids.numpy(), rows)
        passes.append(flips)
    assert 0 < passes[0].sum() < 16 and not all(np.array_equal(passes[0], p) for p in passes[1:])
    again = OrderedStream(ids, batch_size=16, tgt_len=19, complement=comp, rc_prob=0.5, seed=3)
    again.load_state_dict(stream.state_dict())
    stream.next_segment(), again.next_segment()
    assert np.array_equal(stream.next_segment().input_ids, again.next_segment().input_ids)


def test_a_tasks_examples_are_turned_by_seed_and_step():
    comp = np.asarray([0, 1, 5, 4, 3, 2, 6])
    docs = [list(np.random.default_rng(i).integers(2, 7, size=5 + i)) for i in range(40)]
    assert reverse_complements(docs, comp, 0.0, 0, 0) is docs
    assert reverse_complements(docs, comp, 1.0, 0, 0) == [complemented(np.asarray(d)).tolist() for d in docs]
    half = reverse_complements(docs, comp, 0.5, 0, 7)
    assert half == reverse_complements(docs, comp, 0.5, 0, 7) != reverse_complements(docs, comp, 0.5, 0, 8)
    assert 5 < sum(h != list(d) for h, d in zip(half, docs)) < 35


def test_rc_prob_needs_a_tokenizer_with_a_complement(tmp_path, capsys):
    from support import TINY_CLI_8

    from longseq.cli import main

    (tmp_path / "text.txt").write_text("some text to read " * 200)
    argv = ["train", "--data", str(tmp_path / "text.txt"), "--out", str(tmp_path / "r"), *TINY_CLI_8, "rc_prob=0.5"]
    assert main(argv) == 2
    assert_names(capsys.readouterr().err, "rc_prob", "char", "complement", "nucleotide")
