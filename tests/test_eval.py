"""Evidence that the context is used: loss by position inside the segment, and loss against evaluation memory."""

import json
import math
import os

import numpy as np
import pytest
import torch

from longseq.config import ModelConfig
from longseq.eval.context import context_curve, per_position_losses
from longseq.eval.evaluate import evaluate
from longseq.model import TransformerXLLM

BASE = dict(vocab_size=30, n_layer=2, d_model=16, n_head=2, d_head=8, d_inner=32, dropout=0.0)
T, B, STEPS = 8, 2, 41  # segments of 8, 2 streams of 41 tokens: 40 targets, 5 segments per stream


def model(**extra):
    """A tiny random model with large weights, so that its losses depend clearly on what it reads."""
    torch.manual_seed(0)
    net = TransformerXLLM(ModelConfig(**{**BASE, **extra})).double().eval()
    with torch.no_grad():
        for param in net.parameters():
            param.normal_(0.0, 0.3)
    return net


def streams(seed=0):
    """The ids, and the (B, STEPS) streams an ordered pass cuts them into."""
    ids = np.random.default_rng(seed).integers(0, 30, B * STEPS)
    return ids, torch.as_tensor(ids).view(B, STEPS)


@torch.no_grad()
def whole_nll(net, data):
    """Per-token NLL (B, STEPS - 1) of one forward over each whole stream: every token sees its whole past."""
    return net(data[:, :-1], None, data[:, 1:], mem_len=0).nll


@torch.no_grad()
def segment_nll(net, data):
    """Per-token NLL (B, S, T) with every segment read alone, as one batch of B * S independent segments."""
    x = data[:, :-1].reshape(B * 5, T)  # (B*S, T)
    y = data[:, 1:].reshape(B * 5, T)
    return net(x, None, y, mem_len=0).nll.view(B, 5, T)


def test_per_position_curves_equal_one_whole_forward_and_independent_segments():
    """With a memory longer than the text, the ordered pass with memory is one forward over the whole stream
    (chunked with memory == whole), and the pass without it is every segment read alone."""
    net = model(mem_len=64)
    ids, data = streams()
    result = per_position_losses(net, ids, tgt_len=T, batch_size=B, skip_segments=1)
    whole = whole_nll(net, data).view(B, 5, T)[:, 1:]  # segments after the first
    alone = segment_nll(net, data)[:, 1:]
    assert result["positions"] == list(range(T)) and result["tokens"] == [B * 4] * T and result["segments"] == 4
    np.testing.assert_allclose(result["loss_memory"], whole.mean(dim=(0, 1)).numpy(), rtol=0, atol=1e-10)
    np.testing.assert_allclose(result["loss_no_memory"], alone.mean(dim=(0, 1)).numpy(), rtol=0, atol=1e-10)
    # the first position reads nothing without memory: the two differ there
    assert abs(result["loss_memory"][0] - result["loss_no_memory"][0]) > 1e-6  # float64: far above rounding


def test_per_position_skips_the_segments_that_fill_the_memory_and_counts_a_short_last_segment():
    net = model(mem_len=16)
    ids = np.random.default_rng(1).integers(0, 30, B * 38)  # 37 targets per stream: 4 segments of 8 and one of 5
    result = per_position_losses(net, ids, tgt_len=T, batch_size=B)
    assert result["skip_segments"] == 2  # ceil(16 / 8): the memory is full from the third segment on
    assert result["segments"] == 3 and result["tokens"] == [B * 3] * 5 + [B * 2] * 3
    with pytest.raises(ValueError, match="no segment left"):
        per_position_losses(net, ids, tgt_len=T, batch_size=B, max_segments=2)


def test_without_memory_the_two_curves_coincide():
    net = model(mem_len=0)
    ids, _ = streams(2)
    result = per_position_losses(net, ids, tgt_len=T, batch_size=B)
    np.testing.assert_allclose(result["loss_memory"], result["loss_no_memory"], rtol=0, atol=1e-12)


def test_per_position_restores_the_training_mode():
    net = model(mem_len=8).train()
    per_position_losses(net, streams()[0], tgt_len=T, batch_size=B)
    assert net.training


def test_context_curve_is_evaluate_at_each_memory_length():
    net = model(mem_len=8)
    ids, data = streams(3)
    curve = context_curve(net, ids, [0, 4, 16, 64], tgt_len=T, batch_size=B, same_length=True)
    assert curve["contexts"] == [0, 4, 16, 64] and curve["tokens"] == B * 40
    for c, loss in zip([4, 16], curve["loss"][1:3]):
        expected = evaluate(net, ids, batch_size=B, tgt_len=T, mem_len=c, same_length=True)["loss"]
        assert loss == pytest.approx(expected, abs=1e-12)
    # context 0: every segment alone; a context longer than the text with same_length: the whole stream
    assert curve["loss"][0] == pytest.approx(float(segment_nll(net, data).mean()), abs=1e-10)
    assert curve["loss"][3] == pytest.approx(float(whole_nll(net, data).mean()), abs=1e-10)


def test_context_curve_names_what_a_model_carries_beyond_its_attention_memory():
    """Context 0 is the segment alone for a plain XL model; a hybrid carries its ssm state at every point, so its
    context 0 is not the segment alone, and the curve says so under ``kept``."""
    ids, data = streams(5)
    plain = context_curve(model(mem_len=8), ids, [0, 8], tgt_len=T, batch_size=B)
    assert plain["kept"] == []
    assert plain["loss"][0] == pytest.approx(float(segment_nll(model(mem_len=8), data).mean()), abs=1e-10)
    hybrid = model(mem_len=8, mixer="ssm,attention")
    curve = context_curve(hybrid, ids, [0, 8], tgt_len=T, batch_size=B)
    assert curve["kept"] == ["ssm state"]
    assert abs(curve["loss"][0] - float(segment_nll(hybrid, data).mean())) > 1e-6  # the state reached context 0
    compressive = model(mem_len=8, cmem_len=4, cmem_rate=2)
    assert context_curve(compressive, ids, [0], tgt_len=T, batch_size=B)["kept"] == ["compressed memory (4 slots)"]


def test_context_curve_skip_scores_the_same_later_tokens_at_every_length():
    net = model(mem_len=8)
    ids, data = streams(4)
    curve = context_curve(net, ids, [0, 64], tgt_len=T, batch_size=B, same_length=False, skip_segments=2)
    assert curve["tokens"] == B * 3 * T
    assert curve["loss"][0] == pytest.approx(float(segment_nll(net, data)[:, 2:].mean()), abs=1e-10)
    assert curve["loss"][1] == pytest.approx(float(whole_nll(net, data)[:, 2 * T :].mean()), abs=1e-10)
    with pytest.raises(ValueError, match=">= 0"):
        context_curve(net, ids, [-1], tgt_len=T, batch_size=B)


def test_a_model_trained_to_copy_across_segments_uses_its_memory_at_the_segment_start():
    """Every stream repeats one block of 8 random tokens: the next token always stands 7 positions back.  Read in
    segments of 8, it is then outside the segment at positions 0-6 and inside it at position 7.  A one-layer model
    trained on whole sequences must score low with its memory everywhere, near chance or worse without it at
    positions 0-6, and low at position 7 in both passes (it copies; what it lacks without memory is context)."""
    torch.manual_seed(0)
    net = TransformerXLLM(
        ModelConfig(vocab_size=16, n_layer=1, d_model=32, n_head=2, d_head=16, d_inner=64, dropout=0.0, mem_len=8)
    )
    rng = np.random.default_rng(0)

    def periodic(rows, periods):
        blocks = rng.integers(0, 16, (rows, 8))
        return np.concatenate([blocks] * periods + [blocks[:, :1]], 1)  # (rows, 8 * periods + 1)

    optimizer = torch.optim.Adam(net.parameters(), lr=1e-2)
    for _ in range(200):
        batch = torch.as_tensor(periodic(32, 3))
        loss = net(batch[:, :-1], None, batch[:, 1:]).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    ids = periodic(16, 6).reshape(-1)  # 16 streams of 49 tokens: 6 segments each
    result = per_position_losses(net.eval(), ids, tgt_len=8, batch_size=16)
    assert result["segments"] == 5
    chance = math.log(16)
    for t in range(7):
        assert result["loss_memory"][t] < 0.25 * chance
        assert result["loss_no_memory"][t] > 0.9 * chance
    assert max(result["loss_memory"][7], result["loss_no_memory"][7]) < 0.25 * chance


def test_memory_share_is_the_mass_on_the_memory_keys_per_layer_and_head():
    from longseq.diagnostics import summarize_attention

    probs = torch.zeros(1, 2, 3, 5)  # (B, H, T, K): 2 memory keys, then the 3 segment keys
    probs[0, 0, :, 0], probs[0, 0, :, 2] = 0.25, 0.75  # head 0: a quarter in the memory
    probs[0, 1, :, 1] = 1.0  # head 1: all of it
    assert summarize_attention([probs, probs.flip(1)], mlen=2)["memory_share"] == [[0.25, 1.0], [1.0, 0.25]]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny trained character model (mem_len 8, segments of 8) and its corpus file."""
    from support import corpus_file, tiny_run

    from longseq.train import train

    tmp = tmp_path_factory.mktemp("ckpt")
    run = tiny_run(max_steps=4, eval_interval=4)
    run.data.path, run.data.varlen = str(corpus_file(tmp)), False
    train(run, str(tmp / "run"), progress=False)
    return str(tmp / "run" / "last")


def cli_json(argv, capsys):
    from longseq.cli import main

    assert main(argv) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def saved(checkpoint):
    from longseq.data.corpus import load_corpus
    from longseq.train import load_checkpoint

    net, tokenizer, run, _ = load_checkpoint(checkpoint)
    return net, load_corpus(run.data.path, "char", tokenizer=tokenizer).valid


def test_eval_per_position_command_prints_the_library_curves_and_plots_them(checkpoint, tmp_path, capsys):
    plot = tmp_path / "pp.png"
    result = cli_json(["eval", "--checkpoint", checkpoint, "--per-position", "--plot", str(plot), "--json", "--quiet",
                       "--set", "max_segments=6", "mem_len=16"], capsys)  # fmt: skip
    net, ids = saved(checkpoint)
    expected = per_position_losses(net, ids, tgt_len=8, batch_size=2, mem_len=16, max_segments=6)
    assert result["skip_segments"] == 2 and result["positions"] == list(range(8))
    for key in ("loss_memory", "loss_no_memory"):
        np.testing.assert_allclose(result[key], expected[key], rtol=0, atol=1e-9)
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and result["plot"] == str(plot)


def test_eval_context_curve_command_prints_the_library_curve(checkpoint, tmp_path, capsys):
    result = cli_json(["eval", "--checkpoint", checkpoint, "--context-curve", "0,8,16", "--json", "--quiet",
                       "--plot", str(tmp_path / "cc.png"), "--set", "max_segments=6", "clamp_len=12"], capsys)  # fmt: skip
    net, ids = saved(checkpoint)
    expected = context_curve(net, ids, [0, 8, 16], tgt_len=8, batch_size=2, clamp_len=12, max_segments=6)
    assert result["contexts"] == [0, 8, 16] and result["same_length"] is True and result["clamp_len"] == 12
    np.testing.assert_allclose(result["loss"], expected["loss"], rtol=0, atol=1e-9)
    assert os.path.getsize(tmp_path / "cc.png") > 1000


def test_eval_evidence_flags_refuse_bad_input(checkpoint, capsys):
    from longseq.cli import main

    with pytest.raises(SystemExit):
        main(["eval", "--checkpoint", checkpoint, "--context-curve", "0,-8"])
    assert "memory lengths >= 0" in capsys.readouterr().err
    assert main(["eval", "--checkpoint", checkpoint, "--plot", "x.png"]) == 2
    assert "--plot draws --per-position or --context-curve" in capsys.readouterr().err


def test_diagnose_command_adds_the_curves_and_the_memory_share_per_head(checkpoint, tmp_path, capsys):
    out = tmp_path / "report"
    result = cli_json(["diagnose", "--checkpoint", checkpoint, "--out", str(out), "--contexts", "0,8,16",
                       "--max-segments", "6", "--json", "--quiet"], capsys)  # fmt: skip
    report = json.loads((out / "report.json").read_text())
    net, ids = saved(checkpoint)
    expected = per_position_losses(net, ids, tgt_len=8, batch_size=2, max_segments=6)
    np.testing.assert_allclose(report["per_position"]["loss_memory"], expected["loss_memory"], rtol=0, atol=1e-9)
    assert report["context_curve"]["contexts"] == result["context_curve"]["contexts"] == [0, 8, 16]
    share = np.array(report["memory_share"])
    assert share.shape == (2, 2) and ((share > 0) & (share < 1)).all()
    from longseq.diagnostics import memory_attention_share

    averaged = memory_attention_share(net, ids, tgt_len=8, batch_size=2)
    np.testing.assert_allclose(report["memory_attention"]["memory_share"], averaged["memory_share"], atol=1e-9)
    assert {"memory_share.png", "per_position.png", "context_curve.png"} <= set(result["files"])
    markdown = (out / "report.md").read_text()
    assert "Loss by position inside the segment" in markdown and "per head" in markdown


@pytest.mark.parametrize("mixer", ["attention", "ssm,attention"])
@pytest.mark.parametrize("same_length", [False, True])
def test_memory_share_of_a_uniform_attention_is_the_uniform_share(same_length, mixer):
    """With zero queries, keys and u, v every score is 0: each query spreads its mass evenly over the keys it sees,
    so the measured share in the memory must equal the uniform share, for every attention layer and head (a hybrid
    stack's ssm layer has no map and is left out)."""
    from longseq.diagnostics import attention_layers, memory_attention_share

    net = model(mem_len=12, same_length=same_length, mixer=mixer)
    with torch.no_grad():
        for i in attention_layers(net):
            net.transformer.layers[i].dec_attn.qkv_net.weight.zero_()
        net.transformer.r_w_bias.zero_()
        net.transformer.r_r_bias.zero_()
    ids = np.random.default_rng(5).integers(0, 30, 3 * 60)
    share = memory_attention_share(net, ids, tgt_len=T, batch_size=3, segments=4)
    assert share["mem_len"] == 12 and share["segments"] == 4
    expected = np.mean([(12 - t - 1) / 12 if same_length else 12 / (12 + t + 1) for t in range(T)])
    assert share["uniform_share"] == pytest.approx(expected, abs=1e-12)
    layers = 2 if mixer == "attention" else 1
    np.testing.assert_allclose(share["memory_share"], np.full((layers, 2), expected), rtol=0, atol=1e-9)
