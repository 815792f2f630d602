"""Evaluation: the ordered pass with memory scores every token once and refuses a pass that scores none; sliding
windows give every target a full forward of its window; RECL on constructed curves and on models that cannot take
a memory; the context is used (loss by position inside the segment, and loss against evaluation memory, held to
one whole forward and to independent segments); bits per byte held to a naive count of the decoded text; the
unknown-token rate; and the eval command's protocol, curves and plots."""

import json
import math
import os
import re
import warnings

import numpy as np
import pytest
import torch
from support import (
    SMALL_LM,
    TINY_CLI_8,
    UNICODE_TEXT,
    assert_names,
    canonical,
    checkpoint_and_valid_ids,
    cli_json,
    large_weight_lm,
    raises_naming,
    records,
    tiny_corpus,
    tiny_lstm_config,
    tiny_model,
    tiny_model_config,
    tiny_run,
)

from longseq import ModelConfig, TransformerXLLM
from longseq.api import train
from longseq.cli import main
from longseq.config import RunConfig
from longseq.data import (
    ByteTokenizer,
    CharTokenizer,
    WordTokenizer,
)
from longseq.data.tokenizers import build_tokenizer
from longseq.eval.context import context_curve, per_position_losses
from longseq.eval.evaluate import evaluate, segment_losses
from longseq.eval.recl import recl, relative_gain
from longseq.eval.sliding import evaluate_sliding, recurrent_losses, sliding_window_losses
from longseq.model import build_model
from longseq.train import load_checkpoint, save_checkpoint

T, B, STEPS = 8, 2, 41  # segments of 8, 2 streams of 41 tokens: 40 targets, 5 segments per stream


def streams(seed=0):
    """The ids, and the (B, STEPS) streams an ordered pass cuts them into."""
    ids = np.random.default_rng(seed).integers(0, 30, B * STEPS)
    return ids, torch.as_tensor(ids).view(B, STEPS)


@torch.no_grad()
def whole_nll(net, data):
    """Per-token NLL (B, STEPS - 1) of one forward over each whole stream: every token sees its whole past."""
    return net(data[:, :-1], None, data[:, 1:], recurrence=net.config.recurrence(mem_len=0)).nll


@torch.no_grad()
def segment_nll(net, data):
    """Per-token NLL (B, S, T) with every segment read alone, as one batch of B * S independent segments."""
    x = data[:, :-1].reshape(B * 5, T)  # (B*S, T)
    y = data[:, 1:].reshape(B * 5, T)
    return net(x, None, y, recurrence=net.config.recurrence(mem_len=0)).nll.view(B, 5, T)


def test_per_position_curves_equal_one_whole_forward_and_independent_segments():
    """With a memory longer than the text, the ordered pass with memory is one forward over the whole stream
    (chunked with memory == whole), and the pass without it is every segment read alone."""
    net = large_weight_lm(mem_len=64)
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
    net = large_weight_lm(mem_len=16)
    ids = np.random.default_rng(1).integers(0, 30, B * 38)  # 37 targets per stream: 4 segments of 8 and one of 5
    result = per_position_losses(net, ids, tgt_len=T, batch_size=B)
    assert result["skip_segments"] == 2  # ceil(16 / 8): the memory is full from the third segment on
    assert result["segments"] == 3 and result["tokens"] == [B * 3] * 5 + [B * 2] * 3
    with pytest.raises(ValueError, match="no segment left"):
        per_position_losses(net, ids, tgt_len=T, batch_size=B, max_segments=2)


def test_without_memory_the_two_curves_coincide():
    net = large_weight_lm(mem_len=0)
    ids, _ = streams(2)
    result = per_position_losses(net, ids, tgt_len=T, batch_size=B)
    np.testing.assert_allclose(result["loss_memory"], result["loss_no_memory"], rtol=0, atol=1e-12)


def test_per_position_restores_the_training_mode():
    net = large_weight_lm(mem_len=8).train()
    per_position_losses(net, streams()[0], tgt_len=T, batch_size=B)
    assert net.training


def test_context_curve_is_evaluate_at_each_memory_length():
    net = large_weight_lm(mem_len=8)
    ids, data = streams(3)
    curve = context_curve(
        net, ids, [0, 4, 16, 64], tgt_len=T, batch_size=B, recurrence=net.config.recurrence(same_length=True)
    )
    assert curve["contexts"] == [0, 4, 16, 64] and curve["tokens"] == B * 40
    for c, loss in zip([4, 16], curve["loss"][1:3]):
        expected = evaluate(
            net, ids, batch_size=B, tgt_len=T, recurrence=net.config.recurrence(mem_len=c, same_length=True)
        )["loss"]
        assert loss == pytest.approx(expected, abs=1e-12)
    # context 0: every segment alone; a context longer than the text with same_length: the whole stream
    assert curve["loss"][0] == pytest.approx(float(segment_nll(net, data).mean()), abs=1e-10)
    assert curve["loss"][3] == pytest.approx(float(whole_nll(net, data).mean()), abs=1e-10)


def test_context_curve_names_what_a_model_carries_beyond_its_attention_memory():
    """Context 0 is the segment alone for a plain XL model; a hybrid carries its ssm state at every point, so its
    context 0 is not the segment alone, and the curve says so under ``kept``."""
    ids, data = streams(5)
    plain = context_curve(large_weight_lm(mem_len=8), ids, [0, 8], tgt_len=T, batch_size=B)
    assert plain["kept"] == []
    assert plain["loss"][0] == pytest.approx(float(segment_nll(large_weight_lm(mem_len=8), data).mean()), abs=1e-10)
    hybrid = large_weight_lm(mem_len=8, mixer="ssm,attention")
    curve = context_curve(hybrid, ids, [0, 8], tgt_len=T, batch_size=B)
    assert curve["kept"] == ["ssm state"]
    assert abs(curve["loss"][0] - float(segment_nll(hybrid, data).mean())) > 1e-6  # the state reached context 0
    compressive = large_weight_lm(mem_len=8, cmem_len=4, cmem_rate=2)
    assert context_curve(compressive, ids, [0], tgt_len=T, batch_size=B)["kept"] == ["compressed memory (4 slots)"]


def test_context_curve_skip_scores_the_same_later_tokens_at_every_length():
    net = large_weight_lm(mem_len=8)
    ids, data = streams(4)
    curve = context_curve(
        net, ids, [0, 64], tgt_len=T, batch_size=B, recurrence=net.config.recurrence(same_length=False), skip_segments=2
    )
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


def test_eval_per_position_command_prints_the_library_curves_and_plots_them(trained_checkpoint, tmp_path, capsys):
    plot = tmp_path / "pp.png"
    result = cli_json(["eval", "--checkpoint", trained_checkpoint, "--per-position", "--plot", str(plot), "--json", "--quiet",
                       "--set", "max_segments=6", "mem_len=16"], capsys)  # fmt: skip
    net, ids = checkpoint_and_valid_ids(trained_checkpoint)
    expected = per_position_losses(
        net, ids, tgt_len=8, batch_size=2, recurrence=net.config.recurrence(mem_len=16), max_segments=6
    )
    assert result["skip_segments"] == 2 and result["positions"] == list(range(8))
    for key in ("loss_memory", "loss_no_memory"):
        np.testing.assert_allclose(result[key], expected[key], rtol=0, atol=1e-9)
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and result["plot"] == str(plot)


def test_eval_context_curve_command_prints_the_library_curve(trained_checkpoint, tmp_path, capsys):
    result = cli_json(["eval", "--checkpoint", trained_checkpoint, "--context-curve", "0,8,16", "--json", "--quiet",
                       "--plot", str(tmp_path / "cc.png"), "--set", "max_segments=6", "clamp_len=12"], capsys)  # fmt: skip
    net, ids = checkpoint_and_valid_ids(trained_checkpoint)
    expected = context_curve(
        net,
        ids,
        [0, 8, 16],
        tgt_len=8,
        batch_size=2,
        recurrence=net.config.recurrence(clamp_len=12, same_length=True),
        max_segments=6,
    )
    assert result["contexts"] == [0, 8, 16] and result["same_length"] is True and result["clamp_len"] == 12
    np.testing.assert_allclose(result["loss"], expected["loss"], rtol=0, atol=1e-9)
    assert os.path.getsize(tmp_path / "cc.png") > 1000


def test_eval_per_position_plain_output_is_a_short_table_and_the_full_lists_are_in_json(
    trained_checkpoint, tmp_path, capsys
):
    """The plain output of ``eval --per-position`` printed three lists of every position (64 items each at the
    default segment): a person reads a short table, at positions 0, 1, 2, 4, ... and the last, with the values the
    JSON has there, and is told where the full curves and the figure are; so for the context curve."""
    argv = ["eval", "--checkpoint", trained_checkpoint, "--quiet", "--set", "max_segments=6", "mem_len=16"]
    result = cli_json([*argv, "--per-position", "--json"], capsys)
    assert main([*argv, "--per-position", "--plot", str(tmp_path / "pp.png")]) == 0
    text = capsys.readouterr().out
    assert not re.search(r"\[[-\d]", text) and "positions:" not in text  # no list of numbers printed
    rows = [line.split() for line in text.splitlines() if line.strip().startswith("position ")]
    assert [int(row[1]) for row in rows] == [0, 1, 2, 4, 7]  # powers of two and the last of 8 positions
    for row in rows:
        at = result["positions"].index(int(row[1]))
        assert row[3] == f"{result['loss_memory'][at]:.4f}" and row[5] == f"{result['loss_no_memory'][at]:.4f}"
    assert_names(text, "full_curves: with --json", f"plot: {tmp_path / 'pp.png'}", "loss_memory_mean")
    curve = cli_json(
        ["eval", "--checkpoint", trained_checkpoint, "--quiet", "--context-curve", "0,8", "--json"], capsys
    )
    assert main(["eval", "--checkpoint", trained_checkpoint, "--quiet", "--context-curve", "0,8"]) == 0
    text = capsys.readouterr().out
    assert not re.search(r"\[[-\d]", text) and f"memory 8  loss {curve['loss'][1]:.4f}" in text


def test_eval_evidence_flags_refuse_bad_input(trained_checkpoint, capsys):
    from longseq.cli import main

    with pytest.raises(SystemExit):
        main(["eval", "--checkpoint", trained_checkpoint, "--context-curve", "0,-8"])
    assert "memory lengths >= 0" in capsys.readouterr().err
    assert main(["eval", "--checkpoint", trained_checkpoint, "--plot", "x.png"]) == 2
    assert_names(capsys.readouterr().err, "--plot", "--per-position", "--context-curve")


def test_an_evaluation_that_scores_no_token_is_an_error_not_a_loss_of_zero():
    """``eval --context-curve 0,8 --skip-segments 1000`` printed loss 0.0 (a perfect model) over 0 tokens."""
    from longseq.eval.context import context_curve
    from longseq.eval.evaluate import evaluate

    model, ids = tiny_model(), tiny_corpus().valid[:81]  # 2 streams of 40: 5 segments of 8
    last = evaluate(model, ids, batch_size=2, tgt_len=8, skip_segments=4)
    assert last["tokens"] == 2 * 7 and last["loss"] > 0  # the last, shorter segment is scored alone
    for skip in (5, 1000):
        with raises_naming(ValueError, "no token was scored", "5 segment", f"skip_segments={skip}"):
            evaluate(model, ids, batch_size=2, tgt_len=8, skip_segments=skip)
        with pytest.raises(ValueError, match="no token was scored"):
            context_curve(model, ids, [0, 8], tgt_len=8, batch_size=2, skip_segments=skip)


def test_recl_limits_the_vanilla_transformer_and_the_lstm_to_each_context_by_sliding_windows(
    tmp_path, text_corpus, capsys
):
    """RECL read the vanilla Transformer with a memory over absolute positions (it looked for ``config.pos``, which
    now lives in ``config.positions.pos``): its losses differed from the sliding windows the protocol
    asks by up to 0.4 nats a token.  An LSTM's context curve printed one loss for every memory length."""
    from longseq.eval.context import context_curve
    from longseq.eval.recl import context_losses
    from longseq.eval.sliding import sliding_window_losses
    from longseq.model.lstm import LSTMLM

    ids, run = tiny_corpus().valid[:120], tiny_run()
    torch.manual_seed(0)
    lstm = LSTMLM(tiny_lstm_config())
    for model in (tiny_model(pos="absolute", mem_len=0), lstm):
        for context in (4, 16):
            expected = sliding_window_losses(model, ids, context=context)
            np.testing.assert_allclose(context_losses(model, run, ids, context), expected, rtol=0, atol=1e-6)
    with raises_naming(ValueError, "lstm", "whole past"):
        context_curve(lstm, ids, [0, 8], tgt_len=8, batch_size=2)
    run = tiny_run(max_steps=1, eval_interval=1)
    train(RunConfig(lstm.config, run.data, run.train), str(tmp_path / "lstm"), corpus=tiny_corpus(), progress=False)
    capsys.readouterr()
    argv = ["eval", "--checkpoint", str(tmp_path / "lstm"), "--data", str(text_corpus), "--quiet"]
    assert main([*argv, "--set", "mem_len=0"]) == 2  # was the same loss as with any memory, in silence
    assert_names(capsys.readouterr().err, "mem_len", "lstm", "whole past")


def vanilla(**extra):
    torch.manual_seed(0)
    return TransformerXLLM(ModelConfig(**{**SMALL_LM, "mem_len": 0, "pos": "absolute", **extra})).double().eval()


def test_sliding_window_scores_every_target_with_a_full_forward_of_its_window():
    model = vanilla()
    ids = np.random.default_rng(0).integers(0, 30, 40)
    context = 9
    losses = sliding_window_losses(model, ids, context=context, batch_size=5)
    assert losses.shape == (39,)
    data = torch.as_tensor(ids)
    for target in range(1, 40):  # target index t is predicted from the window ending at t - 1
        if target <= context:  # the first window scores its own prefix
            log_probs = torch.log_softmax(model(data[None, :context]).logits[0, target - 1], -1)
        else:
            log_probs = torch.log_softmax(model(data[None, target - context : target]).logits[0, -1], -1)
        assert losses[target - 1] == pytest.approx(-log_probs[data[target]].item(), abs=1e-10)


def test_recurrent_losses_give_every_token_exactly_its_context():
    """With same_length, a token's loss at context c depends on the last c positions only."""
    torch.manual_seed(0)
    model = TransformerXLLM(ModelConfig(**{**SMALL_LM, "mem_len": 8, "n_layer": 1})).double().eval()
    ids = np.random.default_rng(1).integers(0, 30, 33)
    base = recurrent_losses(model, ids, context=4, tgt_len=8)
    changed = ids.copy()
    changed[20] = (changed[20] + 1) % 30
    other = recurrent_losses(model, changed, context=4, tgt_len=8)
    # one layer: target t (predicted at position t - 1) sees positions t-4 .. t-1; target 20 itself changed too
    differs = np.nonzero(np.abs(base - other) > 1e-12)[0] + 1
    assert set(differs) == {20, 21, 22, 23, 24}


def test_eval_command_uses_sliding_windows_for_the_vanilla_model(tmp_path, text_corpus, capsys):
    from support import tiny_run

    from longseq.api import train
    from longseq.cli import main

    data = text_corpus
    run = tiny_run(max_steps=2, eval_interval=2)
    run.model = ModelConfig(**{**run.model.to_dict(), "mem_len": 0, "pos": "absolute"})
    run.data.path, run.data.varlen = str(data), False
    train(run, str(tmp_path / "van"), progress=False)
    assert main(["eval", "--checkpoint", str(tmp_path / "van" / "best"), "--quiet", "--json",
                 "--set", "max_segments=5"]) == 0  # fmt: skip
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    model, tokenizer, saved, _ = load_checkpoint(str(tmp_path / "van" / "best"))
    from longseq.data.corpus import load_corpus

    ids = load_corpus(str(data), "char", tokenizer=tokenizer).valid
    expected = sliding_window_losses(model, ids, context=saved.data.tgt_len, max_targets=5 * saved.data.tgt_len)
    assert result["protocol"] == f"sliding window of {saved.data.tgt_len}" and result["tokens"] == expected.size
    assert result["loss"] == pytest.approx(float(expected.mean()), abs=1e-9)


def curves(**per_length):
    return {int(k[1:]): np.array(v, dtype=float) for k, v in per_length.items()}


@pytest.mark.parametrize(
    "overrides",
    [{"mixer": ["gla"], "mem_len": 0}, {"mixer": ["delta"], "mem_len": 0}, {"mixer": ["gla", "attention"]}],
)
def test_recl_holds_a_model_whose_state_reads_the_whole_past_to_each_context(overrides):
    """A gla or delta layer's state carries the whole past, so RECL's ``mem_len = c`` changed nothing: every context
    gave the same losses and RECL its smallest length (8 for a trained model).  Such a model is read by sliding
    windows of c: a target's loss depends on the c tokens before it and on no earlier one."""
    from longseq.eval.recl import context_losses, context_read_by

    model = tiny_model(**overrides, dropout=0.0, dropatt=0.0, init_std=0.3).eval()
    assert context_read_by(model.config) == "windows" and context_read_by(tiny_model_config()) == "memory"
    ids, run, context = np.asarray(tiny_corpus().valid[:40]), tiny_run(), 6
    changed = ids.copy()
    changed[10] = (changed[10] + 1) % 10  # 24 targets later the target ids[34] is 24 > c tokens away
    near, far = context_losses(model, run, ids, context), context_losses(model, run, changed, context)
    assert np.array_equal(near[10 + context :], far[10 + context :])  # beyond c: no trace of the change
    assert not np.allclose(near[10 : 10 + context], far[10 : 10 + context])  # within c: read
    assert not np.allclose(near, context_losses(model, run, ids, 12))  # a longer context reads more


def test_recl_of_a_group_follows_the_common_baseline():
    group = {
        "a": curves(c10=[2, 2, 2, 2], c20=[1, 1, 1, 1], c30=[1, 1, 1, 1]),
        "b": curves(c10=[3, 3, 3, 3], c20=[3, 3, 3, 3], c30=[3, 3, 3, 3]),
    }
    # 10 -> 20: baseline min(a, b) = 2; a: f = 2 -> 1, gain 1 - 1/e; b never beats the baseline: gain 0
    assert relative_gain(group, "a", 10, 20, 1.0) == pytest.approx(1 - math.exp(-1))
    assert relative_gain(group, "b", 10, 20, 1.0) == 0.0
    # 20 -> 30: the baseline is now a's own loss 1 and nothing improves on it
    assert recl(group) == {"a": 20, "b": 10}


def test_r_restricts_the_gain_to_the_hardest_tokens():
    model = {"m": curves(c10=[3, 1, 1, 1], c20=[2.96, 1, 1, 1], c30=[2.96, 1, 1, 1])}
    # r = 1: f drops by 0.04 / 4 = 0.01, gain 1 - e^-0.01 = 0.00995 < 0.01: RECL stays at 10
    assert relative_gain(model, "m", 10, 20, 1.0) == pytest.approx(1 - math.exp(-0.01))
    assert recl(model, r=1.0) == {"m": 10}
    # r = 0.25 keeps only the token with the largest baseline: gain 1 - e^-0.04 = 0.039
    assert relative_gain(model, "m", 10, 20, 0.25) == pytest.approx(1 - math.exp(-0.04))
    assert recl(model, r=0.25) == {"m": 20}


def test_recl_rejects_misaligned_inputs():
    with pytest.raises(ValueError, match="evaluated at"):
        recl({"a": curves(c10=[1.0], c20=[1.0]), "b": curves(c10=[1.0])})
    with pytest.raises(ValueError, match="same tokens"):
        recl({"a": curves(c10=[1.0], c20=[1.0]), "b": curves(c10=[1.0, 2.0], c20=[1.0, 2.0])})
    with pytest.raises(ValueError, match="r must be"):
        relative_gain({"a": curves(c10=[1.0], c20=[1.0])}, "a", 10, 20, 0.0)


def bpb_model(vocab_size: int, pos: str = "sinusoidal") -> TransformerXLLM:
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=vocab_size, n_layer=1, d_model=16, n_head=2, d_head=8, d_inner=32,
                            mem_len=8 if pos != "absolute" else 0, pos=pos)  # fmt: skip
    return TransformerXLLM(config).eval()


def naive_bpb(model, tokenizer, ids, *, batch_size: int, tgt_len: int, max_segments: int = 0) -> tuple[float, int]:
    """Bits over the UTF-8 bytes of each stream's scored tokens decoded (the text those labels are)."""
    nll = list(segment_losses(model, ids, batch_size=batch_size, tgt_len=tgt_len, max_segments=max_segments))
    bits = sum(float(n.double().sum()) for n in nll) / math.log(2)
    scored = sum(n.size(1) for n in nll)  # tokens per stream
    rows = len(ids) // batch_size
    texts = [tokenizer.decode(ids[b * rows + 1 : b * rows + 1 + scored]) for b in range(batch_size)]
    n_bytes = sum(len(t.encode("utf-8")) for t in texts)
    return bits / n_bytes, n_bytes


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_evaluate_bits_per_byte_is_the_naive_count_of_the_decoded_text(kind):
    tokenizer = build_tokenizer(kind, UNICODE_TEXT, vocab_size=300)
    ids = tokenizer.encode(UNICODE_TEXT)
    model = bpb_model(tokenizer.vocab_size)
    for max_segments in (0, 2):  # a pass cut short counts the bytes of the tokens it scored
        metrics = evaluate(model, ids, batch_size=1, tgt_len=16, max_segments=max_segments, tokenizer=tokenizer,
                           bits_unit="bpc" if kind == "char" else None)  # fmt: skip
        expected, n_bytes = naive_bpb(model, tokenizer, ids, batch_size=1, tgt_len=16, max_segments=max_segments)
        assert metrics["bytes"] == n_bytes and metrics["bpb"] == pytest.approx(expected, rel=1e-12)
    assert metrics["tokens"] == 2 * 16 and metrics["bytes"] < len(UNICODE_TEXT.encode())
    if kind == "char":  # characters of several bytes: fewer bits per byte than per character
        chars = metrics["tokens"]
        assert metrics["bpb"] == pytest.approx(metrics["bpc"] * chars / metrics["bytes"], rel=1e-12)
        assert metrics["bpb"] < metrics["bpc"]


def test_several_streams_count_every_stream_s_scored_bytes():
    tokenizer = CharTokenizer.build(UNICODE_TEXT)
    ids = tokenizer.encode(UNICODE_TEXT)
    model = bpb_model(tokenizer.vocab_size)
    metrics = evaluate(model, ids, batch_size=3, tgt_len=8, max_segments=4, tokenizer=tokenizer)
    expected, n_bytes = naive_bpb(model, tokenizer, ids, batch_size=3, tgt_len=8, max_segments=4)
    assert metrics["bytes"] == n_bytes and metrics["bpb"] == pytest.approx(expected, rel=1e-12)


def test_a_byte_model_s_bpb_is_its_bpc():
    tokenizer = ByteTokenizer()
    ids = tokenizer.encode(UNICODE_TEXT)
    metrics = evaluate(bpb_model(256), ids, batch_size=2, tgt_len=16, bits_unit="bpc", tokenizer=tokenizer)
    assert metrics["bytes"] == metrics["tokens"] and metrics["bpb"] == pytest.approx(metrics["bpc"], rel=1e-12)


def test_a_word_model_s_bpb_counts_its_words_spaces_and_line_ends():
    text = canonical(UNICODE_TEXT)
    tokenizer = WordTokenizer.build(text)
    ids = tokenizer.encode(text)
    model = bpb_model(tokenizer.vocab_size)
    metrics = evaluate(model, ids, batch_size=1, tgt_len=8, tokenizer=tokenizer)
    bits = sum(float(n.double().sum()) for n in segment_losses(model, ids, batch_size=1, tgt_len=8)) / math.log(2)
    first = tokenizer.words[int(ids[0])]  # the first token is read, never scored
    assert metrics["bytes"] == len(text.encode()) - len(first.encode())
    assert metrics["bpb"] == pytest.approx(bits / metrics["bytes"], rel=1e-12)
    assert "bpc" not in metrics


def test_the_sliding_window_evaluator_reports_bpb_of_its_targets():
    tokenizer = CharTokenizer.build(UNICODE_TEXT)
    ids = tokenizer.encode(UNICODE_TEXT)
    model = bpb_model(tokenizer.vocab_size, pos="absolute")
    metrics = evaluate_sliding(model, ids, context=8, batch_size=8, max_targets=40, tokenizer=tokenizer)
    losses = sliding_window_losses(model, ids, context=8, batch_size=8, max_targets=40)
    n_bytes = len(tokenizer.decode(ids[1:41]).encode())
    assert metrics["bytes"] == n_bytes and metrics["bpb"] == pytest.approx(losses.sum() / math.log(2) / n_bytes)


def test_training_and_the_command_line_report_bpb(tmp_path, capsys):

    from longseq.cli import main

    corpus = tmp_path / "corpus.txt"
    corpus.write_text(UNICODE_TEXT * 8)
    run = ["train", "--data", str(corpus), "--out", str(tmp_path / "run"), "--json", "--quiet", "--set", "n_layer=1",
           "d_model=16", "n_head=2", "d_head=8", "d_inner=32", "tgt_len=8", "mem_len=8", "eval_tgt_len=8",
           "batch_size=4", "eval_batch_size=2", "max_steps=2", "eval_interval=2", "eval_max_segments=3"]  # fmt: skip
    assert main(run) == 0
    summary = json.loads(capsys.readouterr().out.splitlines()[-1])
    valid = [r for r in records(tmp_path / "run") if "valid_loss" in r]
    assert valid[-1]["valid_bpb"] == summary["bpb"] and valid[-1]["valid_bytes"] > valid[-1]["valid_tokens"]
    assert summary["bpb"] < summary["bpc"]  # several bytes in some characters
    assert main(["eval", "--checkpoint", str(tmp_path / "run" / "best"), "--json", "--quiet", "--set",
                 "max_segments=3"]) == 0  # fmt: skip
    scored = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert scored["bpb"] == pytest.approx(summary["bpb"], rel=1e-9) and scored["bytes"] == valid[-1]["valid_bytes"]
    assert main(["eval", "--checkpoint", str(tmp_path / "run" / "best"), "--quiet", "--set", "max_segments=3"]) == 0
    text = capsys.readouterr().out
    assert text.index("bpc:") < text.index("bpb:") < text.index("tokens:")  # beside loss and perplexity


def test_no_tokenizer_no_bpb():
    ids = np.arange(200) % 20
    metrics = evaluate(bpb_model(20), ids, batch_size=2, tgt_len=8)
    assert "bpb" not in metrics and "bytes" not in metrics


def word_lines(vocab: list[str], n: int, seed: int) -> str:
    g = torch.Generator().manual_seed(seed)
    picks = torch.randint(0, len(vocab), (n,), generator=g).tolist()
    return "\n".join(" ".join(vocab[i] for i in picks[k : k + 10]) for k in range(0, n, 10)) + "\n"


def test_eval_reports_the_unknown_rate_and_warns_when_the_vocabulary_barely_covers(tmp_path, capsys):
    """A PTB word model on WikiText-2 printed ppl 7701 with 41.8% of the tokens <unk>, and nothing else."""
    own = [f"w{i}" for i in range(30)]
    (tmp_path / "a.txt").write_text(word_lines(own, 3000, 0))
    (tmp_path / "b.txt").write_text(word_lines(own[:20] + [f"x{i}" for i in range(12)], 3000, 1))  # ~3/8 unknown
    out = str(tmp_path / "run")
    assert main(["train", "--data", str(tmp_path / "a.txt"), "--tokenizer", "word", "--out", out, *TINY_CLI_8]) == 0
    capsys.readouterr()
    assert main(["eval", "--checkpoint", out, "--json", "--quiet", "--set", "max_segments=4"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out.splitlines()[-1])["unk_rate"] == 0.0 and "<unk>" not in captured.err
    assert main(["eval", "--checkpoint", out, "--data", str(tmp_path / "b.txt"), "--json", "--quiet"]) == 0
    captured = capsys.readouterr()
    rate = json.loads(captured.out.splitlines()[-1])["unk_rate"]
    assert 0.25 < rate < 0.5
    assert_names(captured.err, f"{rate:.1%}", "<unk>", "valid")


def test_eval_of_a_checkpoint_that_names_no_corpus_asks_for_data_instead_of_scoring_the_bundled_one(tmp_path, capsys):
    """A model trained through the API on a corpus given in memory records no path; ``longseq eval`` without
    ``--data`` would read the bundled corpus with that model's vocabulary.  It stops and asks for ``--data``."""
    from longseq import DataConfig, ModelConfig, RunConfig, TrainConfig
    from longseq.cli import main
    from longseq.data.tokenizers import WordTokenizer

    tok = WordTokenizer.build("alpha beta gamma delta\n")
    run = RunConfig(ModelConfig(vocab_size=tok.vocab_size, n_layer=1, d_model=8, n_head=2, d_head=4, d_inner=16,
                                   cutoffs=[]), DataConfig(tokenizer="word"), TrainConfig())  # fmt: skip
    save_checkpoint(str(tmp_path / "ckpt"), build_model(run.model), run, tok)
    assert main(["eval", "--checkpoint", str(tmp_path / "ckpt"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert_names(err, "no corpus", "bundled", "--data")
    assert "Traceback" not in err


def rope_checkpoint(tmp_path, **positions) -> str:
    """An untrained character model with rotary positions, trained memory 8, saved with its corpus beside it."""
    from longseq import DataConfig, TrainConfig

    text = canonical(UNICODE_TEXT) * 40
    (tmp_path / "corpus.txt").write_text(text)
    tok = CharTokenizer.build(text)
    model = ModelConfig(vocab_size=tok.vocab_size, n_layer=1, d_model=16, n_head=2, d_head=8, d_inner=32, mem_len=8,
                        **{"pos": "rope", **positions})  # fmt: skip
    run = RunConfig(model, DataConfig(path=str(tmp_path / "corpus.txt"), tgt_len=8, eval_tgt_len=8), TrainConfig())
    torch.manual_seed(0)
    save_checkpoint(str(tmp_path / "rope"), build_model(run.model), run, tok)
    return str(tmp_path / "rope")


def longer_than_trained(call) -> list[str]:
    """The messages of the :class:`LongerThanTrainedWarning` s that ``call()`` gives."""
    from longseq.eval.evaluate import LongerThanTrainedWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call()
    return [str(w.message) for w in caught if issubclass(w.category, LongerThanTrainedWarning)]


def test_a_rope_model_evaluated_beyond_its_training_memory_is_warned_with_the_ratio_and_what_to_choose():
    """Rotary positions break beyond the distances seen in training (char PTB trained at 128: 2.03 -> 3.38 bpc at
    2x, 4.56 at 4x, ALiBi flat): evaluating with 16x the memory says so, naming the ratio and the choices (ALiBi,
    rope scaling); within the trained memory, with ALiBi, or with ntk scaling covering the ratio, nothing is said."""
    ids = np.random.default_rng(0).integers(0, 10, 200)
    score = dict(batch_size=2, tgt_len=8, max_segments=2)
    rope, alibi, plain = tiny_model(pos="rope"), tiny_model(pos="alibi"), tiny_model()
    said = longer_than_trained(lambda: evaluate(rope, ids, recurrence=rope.config.recurrence(mem_len=128), **score))
    assert len(said) == 1
    assert_names(said[0], "rope", "128", "16x", "pos=alibi", "rope_scaling=ntk", "3.38", "4.56")
    assert longer_than_trained(
        lambda: per_position_losses(rope, ids, recurrence=rope.config.recurrence(mem_len=128), skip_segments=0, **score)
    )
    assert len(longer_than_trained(lambda: context_curve(rope, ids, [0, 8, 64, 128], **score))) == 1  # once
    assert not longer_than_trained(
        lambda: evaluate(rope, ids, recurrence=rope.config.recurrence(mem_len=8), **score)
    )  # the trained memory
    assert not longer_than_trained(lambda: evaluate(rope, ids, recurrence=rope.config.recurrence(mem_len=4), **score))
    assert not longer_than_trained(
        lambda: evaluate(alibi, ids, recurrence=alibi.config.recurrence(mem_len=128), **score)
    )
    assert not longer_than_trained(
        lambda: evaluate(plain, ids, recurrence=plain.config.recurrence(mem_len=128), **score)
    )  # sinusoidal
    scaled = tiny_model(pos="rope", rope_scaling="ntk", rope_factor=16.0)
    assert not longer_than_trained(
        lambda: evaluate(scaled, ids, recurrence=scaled.config.recurrence(mem_len=128), **score)
    )
    assert longer_than_trained(lambda: evaluate(scaled, ids, recurrence=scaled.config.recurrence(mem_len=256), **score))


def test_eval_says_a_rope_model_reads_a_longer_memory_than_trained_and_is_silent_within_it(tmp_path, capsys):
    checkpoint = rope_checkpoint(tmp_path)
    assert main(["eval", "--checkpoint", checkpoint, "--quiet", "--set", "max_segments=2", "mem_len=128"]) == 0
    err = capsys.readouterr().err
    assert_names(err, "warning:", "16x", "8", "pos=alibi", "rope_scaling=ntk")
    assert "UserWarning" not in err  # a line for people, not Python's file:line form
    assert main(["eval", "--checkpoint", checkpoint, "--quiet", "--set", "max_segments=2"]) == 0
    assert "warning" not in capsys.readouterr().err


def test_eval_sets_rope_scaling_for_one_evaluation_as_a_model_built_with_it(tmp_path, capsys):
    """``--set rope_scaling=ntk rope_factor=4`` (issue 60, item 12: refused as unknown keys) scores as a model built
    with those positions and the checkpoint's weights; the checkpoint's own positions score differently."""
    checkpoint = rope_checkpoint(tmp_path, init_std=0.5)  # weights large enough that positions matter
    argv = ["eval", "--checkpoint", checkpoint, "--quiet", "--json", "--set", "max_segments=3", "mem_len=32"]
    scaled = cli_json([*argv, "rope_scaling=ntk", "rope_factor=4"], capsys)
    plain = cli_json(argv, capsys)
    model, tokenizer, run, _ = load_checkpoint(checkpoint)
    rebuilt = build_model(model.config.replace(positions={"rope_scaling": "ntk", "rope_factor": 4.0}))
    rebuilt.load_state_dict(model.state_dict())
    from longseq.data.corpus import load_corpus

    valid = load_corpus(run.data.path, "char", tokenizer=tokenizer).valid
    settings = dict(batch_size=run.data.eval_batch_size, tgt_len=8, max_segments=3, progress=False)
    expected = evaluate(rebuilt.eval(), valid, recurrence=rebuilt.config.recurrence(mem_len=32), **settings)
    assert scaled["loss"] == pytest.approx(expected["loss"], rel=1e-6)
    assert abs(scaled["loss"] - plain["loss"]) > 1e-4
    assert load_checkpoint(checkpoint)[0].config.positions.rope_scaling == "none"  # the checkpoint unchanged


@pytest.mark.parametrize(
    "positions, settings, words",
    [
        ({}, ["rope_factor=4"], ["rope_factor=4.0", "rope_scaling=linear or ntk"]),  # was ignored in silence
        ({}, ["clamp_len=4"], ["--set clamp_len", "pos=rope", "mem_len", "rope_scaling=ntk"]),  # changed nothing
        ({"pos": "sinusoidal"}, ["rope_scaling=ntk", "rope_factor=2"], ["--set rope_scaling", "pos=sinusoidal", "clamp_len"]),
        ({"pos": "alibi"}, ["rope_factor=2", "rope_scaling=linear"], ["--set rope_factor", "pos=alibi"]),
    ],
)  # fmt: skip
def test_eval_refuses_position_settings_the_model_does_not_read(tmp_path, capsys, positions, settings, words):
    """Issue 60, items 12 and 13: each is refused by name, with why and what applies instead."""
    checkpoint = rope_checkpoint(tmp_path, **positions)
    assert main(["eval", "--checkpoint", checkpoint, "--quiet", "--set", "max_segments=1", *settings]) == 2
    assert_names(capsys.readouterr().err, *words)


def test_rope_factor_without_rope_scaling_is_refused_by_name():
    """``rope_factor`` is read through a ``rope_scaling`` only: alone it was built and ignored (issue 60, item 12)."""
    with raises_naming(ValueError, "rope_factor=4.0", "rope_scaling=none", "rope_scaling=linear or ntk"):
        ModelConfig(pos="rope", rope_factor=4.0)
    assert ModelConfig(pos="rope", rope_scaling="linear", rope_factor=4.0).positions.rope_factor == 4.0


def test_memory_settings_on_a_model_without_attention_are_refused_by_the_harness(tmp_path):
    """lm-eval's ``mem_len`` (and ``clamp_len``, ``same_length``) on a gla stack or an LSTM changed nothing (issue 60,
    item 13): refused by name when the model is made, as ``longseq eval --set`` refuses them."""
    pytest.importorskip("lm_eval")
    from longseq import DataConfig, TrainConfig
    from longseq.integrations.harness import LongseqLM

    for name, config in [("gla", tiny_model_config(mixer=["gla"], mem_len=0)), ("lstm", tiny_lstm_config())]:
        run = RunConfig(config, DataConfig(tokenizer="char"), TrainConfig())
        save_checkpoint(str(tmp_path / name), build_model(config), run, CharTokenizer.build("abcdefghij"))
        LongseqLM(str(tmp_path / name), device="cpu")  # without them: made
        for args, word in [({"mem_len": 8}, "model_args mem_len"), ({"same_length": "true"}, "model_args same_length")]:
            with raises_naming(ValueError, word, "whole past", name if name == "lstm" else "mixer=gla"):
                LongseqLM(str(tmp_path / name), device="cpu", **args)
