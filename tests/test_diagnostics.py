"""Diagnostics (``longseq diagnose``): the report writes what it promises (attention maps, entropy, distance,
gradient norms, memory statistics), reads a hybrid stack's attention layers by their own index, flags collapsed
heads, measures the memory share of attention per layer and head (the uniform share for a uniform attention), adds
the context curves, and names what it cannot read or write."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
from support import (
    SMALL_LM,
    assert_names,
    checkpoint_and_valid_ids,
    cli_json,
    large_weight_lm,
    raises_naming,
    tiny_corpus,
    tiny_model,
    tiny_model_config,
)

from longseq.cli import main
from longseq.config import ModelConfig
from longseq.eval.context import per_position_losses
from longseq.model import TransformerXLLM

SEGMENT = 8  # the segment length of the memory-share measurements


def test_diagnostics_write_what_they_promise(tmp_path):
    from longseq.diagnostics import attention_maps, diagnose

    torch.manual_seed(0)
    model = TransformerXLLM(ModelConfig(**{**SMALL_LM, "mem_len": 6, "n_layer": 3}))
    ids = np.random.default_rng(2).integers(0, 30, 200)
    report = diagnose(model, ids, str(tmp_path), tgt_len=8, warmup=2)
    names = set(os.listdir(tmp_path))
    assert {"attention_layer0.png", "attention_layer1.png", "attention_layer2.png"} <= names
    assert {"entropy.png", "distance.png", "grad_norms.png", "report.md", "report.json"} <= names
    saved = json.loads((tmp_path / "report.json").read_text())
    assert np.array(saved["entropy_bits"]).shape == (3, 2)  # layers x heads
    assert len(saved["grad_norms"]) == 3 and all(g > 0 for g in saved["grad_norms"])
    assert saved["mem_len"] == 6 and report["warnings"] == []
    for mass in saved["mass_by_distance"]:
        assert sum(mass) == pytest.approx(1.0)
    maps, _ = attention_maps(model, torch.as_tensor(ids[:8])[None], None)
    for probs in maps:
        assert probs.shape == (1, 2, 8, 8)
        torch.testing.assert_close(probs.sum(-1), torch.ones(1, 2, 8))


def test_diagnose_reads_the_attention_layers_of_a_hybrid_stack_by_their_own_index(tmp_path):
    """ssm, attention, conv, attention: the maps, warnings, tables and files name layers 1 and 3; the ssm and conv
    layers' states appear in the memory statistics (diagnose refused every stack that was not all attention)."""
    from longseq.diagnostics import attention_maps, diagnose

    torch.manual_seed(0)
    model = TransformerXLLM(
        ModelConfig(**{**SMALL_LM, "mem_len": 6, "n_layer": 4, "mixer": "ssm,attention,conv,attention"})
    )
    with torch.no_grad():  # the shared position bias v made huge: both attention layers collapse onto one distance
        model.transformer.stack.r_r_bias.normal_(0.0, 1e5)
    ids = np.random.default_rng(2).integers(0, 30, 400)
    report = diagnose(model, ids, str(tmp_path), tgt_len=8, warmup=2, batch_size=2)
    assert report["layers"] == 4 and report["attention_layers"] == [1, 3]
    assert np.array(report["entropy_bits"]).shape == np.array(report["memory_share"]).shape == (2, 2)
    collapsed = {w.split(" head")[0] for w in report["warnings"] if "collapsed" in w}
    assert collapsed == {"layer 1", "layer 3"}
    names = set(os.listdir(tmp_path))
    assert {"attention_layer1.png", "attention_layer3.png"} <= names and "attention_layer0.png" not in names
    assert report["memory_attention"]["layers"] == [1, 3]
    assert np.array(report["memory_attention"]["memory_share"]).shape == (2, 2)
    slots = [m["slots"] for m in report["memory"]]
    assert slots == [0, 6, 0, 6] and all(m["std"] > 0 and m["non_finite"] == 0 for m in report["memory"])
    assert len(report["grad_norms"]) == 4 and all(g > 0 for g in report["grad_norms"])
    assert "| 3 |" in (tmp_path / "report.md").read_text()
    maps, _ = attention_maps(model, torch.as_tensor(ids[:8])[None], None)
    assert [m.shape for m in maps] == [(1, 2, 8, 8)] * 2
    for probs in maps:
        torch.testing.assert_close(probs.sum(-1), torch.ones(1, 2, 8))


def test_diagnostics_flag_collapsed_heads(tmp_path):
    from longseq.diagnostics import diagnose

    torch.manual_seed(0)
    model = TransformerXLLM(ModelConfig(**{**SMALL_LM, "mem_len": 4, "n_layer": 1}))
    with torch.no_grad():  # a huge position bias v: every query puts all its mass on one distance
        model.transformer.stack.r_r_bias.normal_(0.0, 1000.0)
    report = diagnose(model, np.arange(100) % 30, str(tmp_path), tgt_len=8, warmup=1)
    assert any("collapsed" in w for w in report["warnings"])


def test_memory_share_is_the_mass_on_the_memory_keys_per_layer_and_head():
    from longseq.diagnostics import summarize_attention

    probs = torch.zeros(1, 2, 3, 5)  # (B, H, T, K): 2 memory keys, then the 3 segment keys
    probs[0, 0, :, 0], probs[0, 0, :, 2] = 0.25, 0.75  # head 0: a quarter in the memory
    probs[0, 1, :, 1] = 1.0  # head 1: all of it
    assert summarize_attention([probs, probs.flip(1)], mlen=2)["memory_share"] == [[0.25, 1.0], [1.0, 0.25]]


@pytest.mark.parametrize("mixer", ["attention", "ssm,attention"])
@pytest.mark.parametrize("same_length", [False, True])
def test_memory_share_of_a_uniform_attention_is_the_uniform_share(same_length, mixer):
    """With zero queries, keys and u, v every score is 0: each query spreads its mass evenly over the keys it sees,
    so the measured share in the memory must equal the uniform share, for every attention layer and head (a hybrid
    stack's ssm layer has no map and is left out)."""
    from longseq.diagnostics import attention_layers, memory_attention_share

    net = large_weight_lm(mem_len=12, same_length=same_length, mixer=mixer)
    with torch.no_grad():
        for i in attention_layers(net):
            net.transformer.stack.layers[i].dec_attn.qkv_net.weight.zero_()
        net.transformer.stack.r_w_bias.zero_()
        net.transformer.stack.r_r_bias.zero_()
    ids = np.random.default_rng(5).integers(0, 30, 3 * 60)
    share = memory_attention_share(net, ids, tgt_len=SEGMENT, batch_size=3, segments=4)
    assert share["mem_len"] == 12 and share["segments"] == 4
    expected = np.mean([(12 - t - 1) / 12 if same_length else 12 / (12 + t + 1) for t in range(SEGMENT)])
    assert share["uniform_share"] == pytest.approx(expected, abs=1e-12)
    layers = 2 if mixer == "attention" else 1
    np.testing.assert_allclose(share["memory_share"], np.full((layers, 2), expected), rtol=0, atol=1e-9)


def test_diagnose_command_adds_the_curves_and_the_memory_share_per_head(trained_checkpoint, tmp_path, capsys):
    out = tmp_path / "report"
    result = cli_json(["diagnose", "--checkpoint", trained_checkpoint, "--out", str(out), "--contexts", "0,8,16",
                       "--max-segments", "6", "--json", "--quiet"], capsys)  # fmt: skip
    report = json.loads((out / "report.json").read_text())
    net, ids = checkpoint_and_valid_ids(trained_checkpoint)
    expected = per_position_losses(net, ids, tgt_len=8, batch_size=2, max_segments=6)
    np.testing.assert_allclose(report["per_position"]["loss_memory"], expected["loss_memory"], rtol=0, atol=1e-9)
    assert report["context_curve"]["contexts"] == result["context_curve"]["contexts"] == [0, 8, 16]
    share = np.array(report["memory_share"])
    assert share.shape == (2, 2) and ((share > 0) & (share < 1)).all()
    from longseq.diagnostics import memory_attention_share

    averaged = memory_attention_share(net, ids, tgt_len=8, batch_size=2)
    np.testing.assert_allclose(report["memory_attention"]["memory_share"], averaged["memory_share"], atol=1e-9)
    # what it prints as memory_share is what memory_share.png draws (it printed the one segment's share)
    assert result["memory_share"] == report["memory_attention"]["memory_share"] != report["memory_share"]
    assert result["memory_share_of"] == f"{averaged['segments']} segments of 2 streams"
    assert {"memory_share.png", "per_position.png", "context_curve.png"} <= set(result["files"])
    markdown = (out / "report.md").read_text()
    assert "Loss by position inside the segment" in markdown and "per head" in markdown


def test_diagnose_names_what_it_cannot_read_or_write(tmp_path, text_corpus, lm_checkpoint, capsys, monkeypatch):
    """diagnose of an LSTM or of a stack without attention was an AttributeError or TypeError traceback, a negative
    --tgt-len or --warmup 'input_ids must be a non-empty integer tensor', an --out that cannot be made a bare OSError
    traceback."""
    from longseq.diagnostics import diagnose
    from longseq.model.lstm import LSTMLM

    ids = tiny_corpus().valid
    for overrides, words in (({"mixer": "ssm,rnn"}, ("no attention layer", "ssm,rnn", "--per-position")),
                             ({"arch": "lstm"}, ("LSTMLM",))):  # fmt: skip
        model = LSTMLM(tiny_model_config(**overrides)) if "arch" in overrides else tiny_model(**overrides)
        with raises_naming(ValueError, *words):
            diagnose(model, ids, str(tmp_path / "d"), tgt_len=8)
    for setting, value in (("tgt_len", -5), ("warmup", -1), ("batch_size", 0), ("max_segments", -1)):
        with raises_naming(ValueError, setting, ">="):
            diagnose(tiny_model(), ids, str(tmp_path / "d"), **{"tgt_len": 8, setting: value})
    assert not (tmp_path / "d").exists()  # refused before anything was written
    (tmp_path / "file").write_text("x")
    argv = ["diagnose", "--checkpoint", lm_checkpoint, "--data", str(text_corpus), "--quiet"]
    assert main([*argv, "--out", str(tmp_path / "file")]) == 2
    err = capsys.readouterr().err
    assert str(tmp_path / "file") in err and "Traceback" not in err
    import longseq.diagnostics.report as report

    def read_only(path, *args, **kwargs):
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(report.os, "makedirs", read_only)
    assert main([*argv, "--out", "/ro/d"]) == 2
    err = capsys.readouterr().err
    assert_names(err, "diagnose", "Permission denied", "/ro/d")
    assert "Traceback" not in err
