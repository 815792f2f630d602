"""Baselines and the evaluation suite: sliding-window vanilla evaluation, the LSTM baseline, diagnostics, plots."""

import json
import os

import numpy as np
import pytest
import torch

from longseq.config import ConfigError, ModelConfig
from longseq.eval.sliding import recurrent_losses, sliding_window_losses
from longseq.model import TransformerXLLM, build_model

BASE = dict(vocab_size=30, n_layer=2, d_model=16, n_head=2, d_head=8, d_inner=32, dropout=0.0)


def vanilla(**extra):
    torch.manual_seed(0)
    return TransformerXLLM(ModelConfig(**{**BASE, "mem_len": 0, "pos": "absolute", **extra})).double().eval()


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


def test_absolute_positions_make_the_model_order_aware_and_refuse_memory():
    model = vanilla()
    ids = torch.tensor([[1, 2, 3, 4, 5, 6]])
    # the same token at two positions gets different outputs only through the position embedding
    same = torch.tensor([[7, 7]])
    hidden = model.hidden_states(same)[0]
    assert not torch.allclose(hidden[0, 0], hidden[0, 1])
    assert torch.isfinite(model(ids).logits).all()
    with pytest.raises(ConfigError, match="mem_len=0"):
        ModelConfig(**{**BASE, "mem_len": 8, "pos": "absolute"})


def test_recurrent_losses_give_every_token_exactly_its_context():
    """With same_length, a token's loss at context c depends on the last c positions only."""
    torch.manual_seed(0)
    model = TransformerXLLM(ModelConfig(**{**BASE, "mem_len": 8, "n_layer": 1})).double().eval()
    ids = np.random.default_rng(1).integers(0, 30, 33)
    base = recurrent_losses(model, ids, context=4, tgt_len=8)
    changed = ids.copy()
    changed[20] = (changed[20] + 1) % 30
    other = recurrent_losses(model, changed, context=4, tgt_len=8)
    # one layer: target t (predicted at position t - 1) sees positions t-4 .. t-1; target 20 itself changed too
    differs = np.nonzero(np.abs(base - other) > 1e-12)[0] + 1
    assert set(differs) == {20, 21, 22, 23, 24}


def test_lstm_baseline_carries_its_state_like_a_memory():
    torch.manual_seed(0)
    config = ModelConfig(**{**BASE, "arch": "lstm"})
    model = build_model(config).double().eval()
    ids = torch.randint(0, 30, (2, 12))
    whole = model(ids, None, ids).nll
    first = model(ids[:, :5], None, ids[:, :5])
    second = model(ids[:, 5:], first.mems, ids[:, 5:])
    torch.testing.assert_close(torch.cat([first.nll, second.nll], 1), whole, rtol=0, atol=1e-12)
    assert first.mems[0][0].shape == first.mems[0][1].shape == (2, 16)  # (h, c) of layer 0


def test_diagnostics_write_what_they_promise(tmp_path):
    from longseq.diagnostics import attention_maps, diagnose

    torch.manual_seed(0)
    model = TransformerXLLM(ModelConfig(**{**BASE, "mem_len": 6, "n_layer": 3}))
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
        ModelConfig(**{**BASE, "mem_len": 6, "n_layer": 4, "mixer": "ssm,attention,conv,attention"})
    )
    with torch.no_grad():  # the shared position bias v made huge: both attention layers collapse onto one distance
        model.transformer.r_r_bias.normal_(0.0, 1e5)
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
    model = TransformerXLLM(ModelConfig(**{**BASE, "mem_len": 4, "n_layer": 1}))
    with torch.no_grad():  # a huge position bias v: every query puts all its mass on one distance
        model.transformer.r_r_bias.normal_(0.0, 1000.0)
    report = diagnose(model, np.arange(100) % 30, str(tmp_path), tgt_len=8, warmup=1)
    assert any("collapsed" in w for w in report["warnings"])


def test_plot_reads_runs_and_rejects_broken_logs(tmp_path):
    from longseq.diagnostics import plot_runs

    for name, scale in (("a", 1.0), ("b", 2.0)):
        run = tmp_path / name
        run.mkdir()
        lines = [{"step": s, "loss": scale / s, "elapsed_s": 0.5 * s} for s in range(1, 6)]
        lines.append({"step": 5, "valid_loss": scale, "elapsed_s": 3.0})
        (run / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    result = plot_runs([str(tmp_path / "a"), str(tmp_path / "b")], str(tmp_path / "curves.png"))
    assert os.path.getsize(tmp_path / "curves.png") > 1000
    assert result["runs"]["a"] == {"train": 5, "valid": 1}
    bare = plot_runs([str(tmp_path / "a")], str(tmp_path / "curves2"))  # no extension: the file written is named
    assert bare["out"] == str(tmp_path / "curves2.png") and os.path.getsize(bare["out"]) > 1000
    (tmp_path / "a" / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0}\n{broken\n')
    with pytest.raises(ValueError, match="metrics.jsonl:2"):
        plot_runs([str(tmp_path / "a")], str(tmp_path / "x.png"))


def test_eval_command_uses_sliding_windows_for_the_vanilla_model(tmp_path, capsys):
    from support import corpus_file, tiny_run

    from longseq.cli import main
    from longseq.train import load_checkpoint, train

    data = corpus_file(tmp_path)
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


def test_eval_speed_command_reports_medians_and_their_ratio(capsys):
    """The JSON the issue specifies: one object per length with the two times and their ratio; with rounds, the
    reported times are the medians of the rounds kept beside them."""
    from longseq.cli import main

    assert main(["bench", "eval-speed", "--attn-len", "16", "24", "--tgt-len", "8", "--steps", "1", "--rounds", "3",
                 "--threads", "1", "--json"]) == 0  # fmt: skip
    rows = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["lengths"]
    assert [r["attn_len"] for r in rows] == [16, 24]
    for row in rows:
        assert row["ratio"] == row["vanilla_ms_per_token"] / row["xl_ms_per_token"]
        for key in ("xl_ms_per_token", "vanilla_ms_per_token"):
            assert len(row["rounds"][key]) == 3 and row[key] == sorted(row["rounds"][key])[1]
