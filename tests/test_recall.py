"""The recall tasks: generators (every answer's source lies at its distance, the same per seed), evaluation across
segments (equal to reading the whole sequence at once, and to a hand-rolled segment loop), training through the
one Trainer and the command line."""

import json

import pytest
import torch
from support import raises_naming

from longseq import ModelConfig
from longseq.cli import main
from longseq.config import ConfigError
from longseq.config.run import RECALL_TASKS, TaskConfig
from longseq.data.recall import KEY, QUERY, RecallBatches, chance, recall_batch
from longseq.eval.recall import recall_grid, recall_scores
from longseq.model import TransformerXLLM

OPTIONS = {
    "passkey": TaskConfig(name="passkey", key_len=3),
    "mqar": TaskConfig(name="mqar", n_pairs=4),
    "copying": TaskConfig(name="copying", n_copy=5, alphabet=8),
    "induction": TaskConfig(name="induction", alphabet=16),
}


@pytest.mark.parametrize("task", RECALL_TASKS)
@pytest.mark.parametrize("length", [37, 300])
def test_every_answer_is_the_token_at_its_distance_and_the_same_per_seed(task, length):
    o = OPTIONS[task]
    batch = recall_batch(o, seed=3, index=5, batch=16, length=length)
    asked = batch.labels != -100
    rows, cols = asked.nonzero(as_tuple=True)
    source = cols - batch.distance[rows, cols]
    assert bool((batch.distance[asked] >= 1).all()) and bool((source >= 0).all())
    assert torch.equal(batch.inputs[rows, source], batch.labels[rows, cols])  # the answer lies where it says
    assert bool((batch.distance[~asked] == -1).all()) and int(batch.inputs.max()) < 256
    again, other = recall_batch(o, 3, 5, 16, length), recall_batch(o, 3, 6, 16, length)
    assert torch.equal(again.inputs, batch.inputs) and torch.equal(again.labels, batch.labels)
    assert not torch.equal(other.inputs, batch.inputs)
    per_row = {"passkey": o.key_len, "mqar": o.n_pairs, "copying": o.n_copy, "induction": 1}[task]
    assert bool((asked.sum(1) == per_row).all())


def test_passkey_places_its_key_at_the_distance_asked_and_its_markers_once():
    o = OPTIONS["passkey"]
    batch = recall_batch(o, seed=0, index=0, batch=8, length=1000, distance=700)
    assert set(batch.distance[batch.labels != -100].tolist()) == {700}
    assert bool(((batch.inputs == KEY).sum(1) == 1).all()) and bool(((batch.inputs == QUERY).sum(1) == 1).all())
    assert bool((batch.inputs[:, 1000 - 3 - 700 - 1] == KEY).all())


def test_generators_refuse_what_does_not_fit_by_name():
    with pytest.raises(ValueError, match="needs >= 8 tokens"):
        recall_batch(OPTIONS["passkey"], 0, 0, 1, 7)
    with pytest.raises(ValueError, match="distance 90 does not fit"):
        recall_batch(OPTIONS["passkey"], 0, 0, 1, 64, distance=90)
    with pytest.raises(ValueError, match="passkey task only"):
        recall_batch(OPTIONS["mqar"], 0, 0, 1, 64, distance=9)
    with pytest.raises(ConfigError, match="option of the classify task"):  # passkey's options have no pooling
        TaskConfig(name="passkey", pooling="mean")
    with pytest.raises(ConfigError, match="passkey, mqar, copying, induction task, not of span"):
        TaskConfig(name="span", train="x.jsonl", key_len=5)


def test_the_stream_resumes_where_it_stopped():
    stream = RecallBatches(OPTIONS["induction"].replace(seq_len=40), seed=1, batch=4)
    stream.next()
    state = stream.state_dict()
    expected = stream.next()
    fresh = RecallBatches(OPTIONS["induction"].replace(seq_len=40), seed=1, batch=4)
    fresh.load_state_dict(state)
    assert torch.equal(fresh.next().inputs, expected.inputs)


def tiny(**overrides) -> TransformerXLLM:
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=256, n_layer=2, d_model=32, n_head=2, d_head=16, d_inner=64, dropout=0.0,
                         **overrides)  # fmt: skip
    return TransformerXLLM(config).double().eval()


def hand_rolled_logits(lm, inputs, segment_len):
    """Logits (B, N, V) read one segment at a time with lm(segment, mems), the memory carried by hand."""
    mems, out = None, []
    for segment in inputs.split(segment_len, dim=1):
        step = lm(segment, mems)
        out.append(step.logits)
        mems = step.mems
    return torch.cat(out, dim=1)


@pytest.mark.parametrize("model", [dict(mem_len=64), dict(mixer=["ssm"], mem_len=0), dict(mixer=["rnn"], mem_len=0)])
def test_reading_in_segments_with_memory_equals_reading_the_whole_sequence(model):
    lm, o = tiny(**model), OPTIONS["passkey"]
    batch = recall_batch(o, seed=2, index=0, batch=4, length=48, distance=30)
    with torch.no_grad():
        whole = lm(batch.inputs).logits  # one segment: every token sees the key directly
        chunked = hand_rolled_logits(lm, batch.inputs, 8)
    torch.testing.assert_close(chunked, whole, rtol=1e-7, atol=1e-9)
    correct, distance = recall_scores(lm, batch, segment_len=8)
    asked = batch.labels != -100
    assert torch.equal(correct, (whole.argmax(-1) == batch.labels)[asked])
    assert torch.equal(distance, batch.distance[asked])


def test_the_grid_reports_accuracy_by_distance_and_length_with_the_models_reach():
    lm = tiny(mem_len=16)
    result = recall_grid(lm, OPTIONS["passkey"], 8, distances=[5, 40], lengths=[24], n=6, batch_size=4)
    assert result["effective_range"] == 32 and result["chance"] == chance(OPTIONS["passkey"])
    assert [(c.get("distance"), c["length"], c["asked"]) for c in result["cells"]] == [(5, 16, 18), (40, 48, 18),
                                                                                     (None, 24, 18)]  # fmt: skip
    assert all(0 <= c["accuracy"] <= 1 for c in result["cells"])
    assert recall_grid(tiny(mixer=["ssm"]), OPTIONS["passkey"], 8, lengths=[16], n=2)["effective_range"] == 0
    with pytest.raises(ValueError, match="evaluate mqar at lengths"):
        recall_grid(lm, OPTIONS["mqar"], 8, distances=[5])


TINY_RUN = ["--set", "tgt_len=16", "mem_len=16", "n_layer=2", "n_head=2", "d_head=32", "d_inner=128", "dropout=0",
            "batch_size=16", "warmup_steps=10", "key_len=1", "valid_size=64", "save_every_s=0"]  # fmt: skip


def test_train_task_and_recall_commands_round_trip(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--task", "passkey", "--out", str(out), "--json", "--quiet", *TINY_RUN, "d_model=32",
                 "seq_len=32", "max_steps=2", "eval_interval=2"]) == 0  # fmt: skip
    trained = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert trained["step"] == 2 and trained["chance"] == 0.1 and 0 <= trained["accuracy"] <= 1
    saved = tmp_path / "cells.json"
    assert main(["recall", str(out), "--lengths", "40", "--n", "4", "--out", str(saved), "--json", "--quiet",
                 "--plot", str(tmp_path / "cells.png")]) == 0  # fmt: skip
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed["plot"] == str(tmp_path / "cells.png") and (tmp_path / "cells.png").exists()
    assert json.loads(saved.read_text())["cells"] == printed["cells"] and printed["cells"][0]["asked"] == 4
    with pytest.raises(SystemExit):
        main(["train", "--task", "nope"])


@pytest.mark.slow
def test_a_tiny_model_learns_a_passkey_through_its_memory_and_not_past_its_reach(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "--task", "passkey", "--out", str(out), "--json", "--quiet", *TINY_RUN, "d_model=64",
                 "seq_len=64", "max_steps=80", "eval_interval=80", "max_distance=24", "lr=0.003"]) == 0  # fmt: skip
    trained = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert trained["accuracy"] >= 0.9  # distances up to 24: in the segment or one segment back
    assert main(["recall", str(out), "--distances", "4,20,200", "--n", "64", "--json", "--quiet"]) == 0
    cells = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["cells"]
    assert cells[0]["accuracy"] >= 0.9 and cells[2]["accuracy"] <= 0.3  # 200 tokens back: past 2 x 16, at chance


def test_the_heat_map_table_averages_seeds_by_distance_and_marks_missing_cells(tmp_path):
    from longseq.diagnostics.plots import plot_recall_heatmap, recall_table

    def run(accuracies):
        cells = [{"distance": d, "length": 2 * d, "accuracy": a} for d, a in accuracies.items()]
        return {"task": "passkey", "chance": 0.1, "effective_range": 64, "cells": cells}

    results = {"xl": [run({16: 1.0, 128: 0.2}), run({16: 0.5, 128: 0.0})], "ssm": [run({16: 1.0})]}
    assert recall_table(results) == (["xl", "ssm"], [16, 128], [[0.75, 0.1], [1.0, None]])
    assert plot_recall_heatmap(results, str(tmp_path / "heat")) == str(tmp_path / "heat.png")
    assert (tmp_path / "heat.png").stat().st_size > 1000


def test_chance_reads_only_the_named_tasks_options_and_copying_needs_three_tokens():
    """alphabet=2 is a valid filler alphabet for the passkey; chance used to evaluate copying's 1/(alphabet-2) too."""
    assert chance(TaskConfig(name="passkey", alphabet=2)) == 0.1
    assert chance(TaskConfig(name="induction", alphabet=2)) == 1.0
    with raises_naming(ConfigError, "task.alphabet", "copying", "3"):
        TaskConfig(name="copying", alphabet=2)


def test_a_recall_runs_toml_runs_again_and_a_length_that_cannot_fit_is_refused_at_once(tmp_path, capsys, monkeypatch):
    """A recall run's own run.toml was refused by ``train --config`` ("unknown top-level key(s) 'task'") and said a
    fine-tuning command continues it; ``recall --distances 1000000000`` ran silently for minutes (its batch needs
    1.5 TB) before it could fail."""
    out, again = tmp_path / "run", tmp_path / "again"
    assert main(["train", "--task", "passkey", "--out", str(out), "--quiet", *TINY_RUN, "d_model=32", "seq_len=32",
                 "max_steps=2", "eval_interval=2"]) == 0  # fmt: skip
    header = (out / "run.toml").read_text().splitlines()[1]
    assert "longseq train --config" in header and "finetune" not in header
    assert main(["train", "--config", str(out / "run.toml"), "--out", str(again), "--quiet"]) == 0
    assert (again / "metrics.jsonl").read_text().count("valid_accuracy") == 1
    untimed = [[{k: v for k, v in json.loads(line).items() if "elapsed" not in k and "per_s" not in k}
                for line in (run / "metrics.jsonl").read_text().splitlines()] for run in (out, again)]  # fmt: skip
    assert untimed[0] == untimed[1]  # the same run, loss for loss
    capsys.readouterr()
    assert main(["recall", str(out), "--distances", "8,20", "--n", "4", "--quiet"]) == 0  # text: a line per cell
    lines = capsys.readouterr().out.splitlines()
    cells = [line.split() for line in lines[lines.index(next(x for x in lines if x.strip() == "cells:")) + 1 :][:2]]
    assert [(c[0], c[1], c[4]) for c in cells] == [("distance", "8", "accuracy"), ("distance", "20", "accuracy")]
    assert not any("[{" in line for line in lines)  # no Python repr of the list
    import longseq.eval.recall as recall_module

    for free, words in ((64 << 30, ("64.0 GiB are free", "lower --batch-size to 2")), (8 << 30, ("does not fit",))):
        monkeypatch.setattr(recall_module, "available_memory", lambda free=free: free)  # this machine's RAM varies
        assert main(["recall", str(out), "--distances", "1000000000", "--n", "64"]) == 2
        err = capsys.readouterr().err
        assert "1,000,000,0" in err and "1,430.5 GiB" in err and all(w in err for w in words), err
    tuned = tmp_path / "tuned.toml"
    tuned.write_text('[task]\nname = "classify"\ntrain = "x.jsonl"\n')
    assert main(["train", "--config", str(tuned), "--out", str(tmp_path / "t")]) == 2
    assert "longseq finetune" in capsys.readouterr().err


def test_predict_eval_and_generate_on_a_recall_model_point_to_longseq_recall(tmp_path, capsys):
    """``longseq predict`` on a recall model (the command ``generate`` and ``eval`` advised) ended in "TypeError:
    Task.predict() takes 3 positional arguments but 4 were given": the recall tasks inherited a base ``predict`` of
    another signature.  The task refuses by name, from Python and from the command line, and every command names
    the tool that reads such a checkpoint, ``longseq recall`` (the model was trained from scratch, not fine-tuned);
    diagnose, which said "a fine-tuned model: longseq predict", too."""
    from longseq.tasks import task_for
    from longseq.train import load_checkpoint

    out = tmp_path / "run"
    assert main(["train", "--task", "passkey", "--out", str(out), "--quiet", *TINY_RUN, "d_model=32", "seq_len=32",
                 "max_steps=1", "eval_interval=1"]) == 0  # fmt: skip
    model, tokenizer, run, _ = load_checkpoint(str(out / "last"))
    with pytest.raises(ConfigError) as caught:
        task_for(run, tokenizer).predict(model, [{"text": "abc"}], "x.jsonl")
    assert "passkey" in str(caught.value) and "longseq recall" in str(caught.value)
    (tmp_path / "x.jsonl").write_text('{"text": "abc"}\n')
    capsys.readouterr()
    for command in (["predict", "--data", str(tmp_path / "x.jsonl"), "--out", str(tmp_path / "p.jsonl")],
                    ["eval"], ["generate", "--prompt", "a", "--max-new-tokens", "2"],
                    ["diagnose", "--out", str(tmp_path / "report")]):  # fmt: skip
        assert main([*command, "--checkpoint", str(out), "--quiet"]) == 2, command
        err = capsys.readouterr().err
        assert "longseq recall" in err and "from scratch" in err and "Traceback" not in err, err
        message = err.split("error: ", 1)[1]
        assert "longseq predict" not in message and "fine-tuned for" not in message, err
    assert not (tmp_path / "p.jsonl").exists()
