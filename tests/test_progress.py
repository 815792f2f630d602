"""Output a person can follow anywhere (issue 31, item 5).

Claims: off a terminal the trainer writes plain progress lines (after the first step, then at most every
``progress_interval_s``) with an ETA from the measured speed, the earlier end under a time budget; on a terminal it
keeps its bar and writes none.  ``max_time_s`` stops at the first step boundary past the budget, validates and
saves, counts the run's time across resumes, and a resume with a larger budget ends bit for bit where the run
without a budget does.  Samples during training change nothing in the run and are refused for fine-tuning.
``longseq data prepare`` reports files, bytes and tokens off a terminal; ``longseq generate`` ends its line.

Time is a fake clock of 10 seconds per optimizer step (``Trainer.clock``): nothing here is timed.
"""

from __future__ import annotations

import json
import re

import pytest
import torch
from support import records, tiny_corpus, tiny_run

from longseq.config import ConfigError
from longseq.progress import Every, Meter, duration
from longseq.tasks.lm import LanguageModeling
from longseq.train.trainer import Trainer

LINE = re.compile(
    r"^step (\d+)/(\d+) \(\d+%\) \| loss \d+\.\d{4} \| lr \d\.\d\de-\d\d \| [\d,]+ tok/s \| elapsed (\S+)"
    r"(?: of max_time_s \S+)? \| ETA (\S+)$"
)


def fit(out, log=None, progress=True, resume=False, **settings):
    """A tiny LM run whose clock reads 10 s per optimizer step taken."""
    run = tiny_run(**settings)
    trainer = Trainer(LanguageModeling(run, corpus=tiny_corpus()), run, str(out), resume=resume, progress=progress,
                      log=log)  # fmt: skip
    trainer.clock = lambda: 10.0 * trainer.step_count
    return trainer.fit()


def progress_lines(messages: list[str]) -> list[re.Match]:
    return [m for m in map(LINE.match, messages) if m]


def test_plain_lines_come_after_the_first_step_then_at_most_every_interval(tmp_path):
    messages: list[str] = []
    fit(tmp_path / "run", messages.append, max_steps=7, eval_interval=100, progress_interval_s=25)
    lines = progress_lines(messages)
    assert [int(m[1]) for m in lines] == [1, 4, 7]  # at 10 s, then 30 s or more apart
    assert all(int(m[2]) == 7 for m in lines)
    assert lines[1][3] == "40s" and lines[1][4] == "30s"  # 3 steps left at 10 s a step


def test_the_eta_is_the_earlier_of_the_steps_and_the_time_budget(tmp_path):
    messages: list[str] = []
    fit(tmp_path / "run", messages.append, max_steps=6, eval_interval=100, progress_interval_s=1e-9, max_time_s=45)
    etas = {int(m[1]): m[4] for m in progress_lines(messages)}
    assert etas[1] == "35s" and etas[4] == "5s"  # 50 s and 20 s of steps left, 35 s and 5 s of the budget
    assert all("of max_time_s 45s" in m.group(0) for m in progress_lines(messages))


def test_no_lines_on_a_terminal_with_interval_0_or_quiet(tmp_path, monkeypatch):
    for name, settings, progress in (("off", {"progress_interval_s": 0}, True), ("quiet", {}, False)):
        messages: list[str] = []
        fit(tmp_path / name, messages.append, progress=progress, max_steps=3, eval_interval=100, **settings)
        assert progress_lines(messages) == [] and any("valid loss" in m for m in messages)
    monkeypatch.setattr("longseq.progress.on_terminal", lambda: True)
    messages = []
    fit(tmp_path / "tty", messages.append, max_steps=3, eval_interval=100, progress_interval_s=1e-9)
    assert progress_lines(messages) == []  # the bar shows the progress there


def loss_records(path) -> list[tuple[int, float]]:
    return [(r["step"], r["loss"]) for r in records(path) if "loss" in r]


def test_a_time_budget_stops_validates_saves_and_resumes_exactly(tmp_path):
    whole = fit(tmp_path / "whole", max_steps=6, eval_interval=4, log_interval=1)
    messages: list[str] = []
    timed = fit(tmp_path / "timed", messages.append, max_steps=6, eval_interval=4, log_interval=1, max_time_s=25)
    assert (timed.step, timed.stopped_on_time, timed.elapsed_s) == (3, True, 30.0)  # the boundary after 25 s
    assert any(m.startswith("stopped on time at step 3 of max_steps 6") for m in messages)
    valid = [r for r in records(tmp_path / "timed") if "valid_loss" in r]
    assert [r["step"] for r in valid] == [3]  # the final validation, off the eval_interval cadence
    best = json.loads((tmp_path / "timed" / "best" / "config.json").read_text())["metrics"]
    assert best["step"] == 3 and best["loss"] == valid[0]["valid_loss"]
    assert json.loads((tmp_path / "timed" / "last" / "trainer_state.json").read_text())["step"] == 3

    messages = []  # the same budget: the run's time (30 s) counts across resumes, so nothing is left
    again = fit(tmp_path / "timed", messages.append, resume=True, max_steps=6, eval_interval=4, log_interval=1,
                max_time_s=25)  # fmt: skip
    assert (again.step, again.stopped_on_time) == (3, True)
    assert any("has already trained 30s of max_time_s 25" in m for m in messages)
    more = fit(tmp_path / "timed", resume=True, max_steps=6, eval_interval=4, log_interval=1, max_time_s=1000)
    assert (more.step, more.stopped_on_time, more.elapsed_s) == (6, False, 60.0)
    assert loss_records(tmp_path / "timed") == loss_records(tmp_path / "whole") and len(whole.losses) == 6


def test_train_json_says_it_stopped_on_time(tmp_path, capsys):
    from support import corpus_file

    from longseq.cli import main

    args = ["train", "--data", str(corpus_file(tmp_path)), "--out", str(tmp_path / "run"), "--json", "--set",
            "n_layer=1", "d_model=16", "n_head=2", "d_head=8", "d_inner=32", "tgt_len=8", "mem_len=8",
            "batch_size=4", "eval_max_segments=2", "max_steps=100000", "max_time_s=0.001"]  # fmt: skip
    assert main(args) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out.splitlines()[-1])
    assert summary["stopped_on_time"] is True and 1 <= summary["step"] < 100000
    assert f"stopped on time at step {summary['step']} of max_steps 100000" in captured.err
    assert summary["loss"] is not None and summary["elapsed_s"] >= 0.001


def test_samples_change_nothing_in_the_run(tmp_path):
    plain = fit(tmp_path / "plain", max_steps=4, eval_interval=100, log_interval=1)
    messages: list[str] = []
    sampled = fit(tmp_path / "sampled", messages.append, max_steps=4, eval_interval=100, log_interval=1,
                  sample_interval=2, sample_tokens=12, sample_prompt="abc")  # fmt: skip
    assert sampled.losses == plain.losses  # bit for bit
    assert loss_records(tmp_path / "sampled") == loss_records(tmp_path / "plain")
    samples = [m for m in messages if "sample of 12 tokens (temperature 0.8) after 'abc'" in m]
    assert [m.split(":")[0] for m in samples] == ["step 2", "step 4"]
    assert all(m.split("\n", 1)[1].startswith("abc") and len(m.split("\n", 1)[1]) == 3 + 12 for m in samples)
    from safetensors.torch import load_file

    a, b = (load_file(str(tmp_path / n / "last" / "model.safetensors")) for n in ("plain", "sampled"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_sample_reads_no_global_random_number_and_keeps_the_model_mode(tmp_path):
    run = tiny_run(sample_interval=1, sample_tokens=8, sample_temperature=1.0)
    task = LanguageModeling(run, corpus=tiny_corpus())
    task.run = task.prepare()
    model = task.build_model().train()
    state = torch.get_rng_state()
    header, first = task.sample(model, 7)
    assert torch.equal(torch.get_rng_state(), state) and model.training
    assert task.sample(model, 7)[1] == first and "after 'abc cab\\n hh defg'" in header  # 16 validation tokens
    greedy = LanguageModeling(tiny_run(sample_interval=1, sample_temperature=0.0), corpus=tiny_corpus())
    greedy.run = greedy.prepare()
    assert "(greedy)" in greedy.sample(model, 1)[0]


def test_sample_settings_are_checked(tmp_path):
    with pytest.raises(ConfigError, match="sample_prompt 'xyz!' cannot be read by the run's tokenizer"):
        LanguageModeling(tiny_run(sample_interval=1, sample_prompt="xyz!"), corpus=tiny_corpus()).prepare()
    for bad, message in (({"sample_interval": -1}, "sample_interval must be >= 0"),
                         ({"max_time_s": -1.0}, "max_time_s must be >= 0"),
                         ({"sample_temperature": -0.5}, "sample_temperature must be >= 0")):  # fmt: skip
        with pytest.raises(ConfigError, match=message):
            tiny_run(**bad)


def test_fine_tuning_refuses_samples(tmp_path):
    from support import train_tiny_lm, write_classify_file

    from longseq.tasks import task_for
    from longseq.train.checkpoint import load_checkpoint
    from longseq.train.finetune import finetune_run

    lm = train_tiny_lm(tmp_path)
    base, tokenizer, base_run, _ = load_checkpoint(lm)
    run = finetune_run(base_run, lm, "classify", {"task.train": write_classify_file(tmp_path), "train.max_steps": 2})
    run.train = run.train.replace(sample_interval=5)
    trainer = Trainer(task_for(run, tokenizer, base=base), run, str(tmp_path / "ft"), progress=False)
    with pytest.raises(ConfigError, match="sample_interval=5: samples are written by a language model; the classify"):
        trainer.fit()


def test_meter_lines_off_a_terminal():
    now = [0.0]
    lines: list[str] = []
    meter = Meter(1000, "encode", unit="B", interval_s=30, write=lines.append, terminal=False, clock=lambda: now[0],
                  totals={"files": 2})  # fmt: skip
    for _ in range(10):
        now[0] += 10
        meter.update(100)
        meter.count("tokens", 50)
    meter.count("files", 2)
    meter.close()
    assert len(lines) == 1 + 3 + 1  # the first update, then at 40, 70, 100 s, and the end
    assert lines[0] == "encode: 100 B of 1.0 kB (10%) | files 0/2 | 10 B/s | ETA 1m30s"
    assert lines[-1] == "encode: 1.0 kB of 1.0 kB (100%) | files 2/2 | tokens 500 | 10 B/s | done in 1m40s"
    quiet: list[str] = []
    silent = Meter(10, "x", enabled=False, write=quiet.append, terminal=False)
    silent.update(10)
    silent.close()
    assert quiet == []


def test_every_and_duration():
    now = [0.0]
    every = Every(30, clock=lambda: now[0])
    due = []
    for t in range(0, 100, 10):
        now[0] = t
        due.append(every.due())
    assert due == [True, False, False, True, False, False, True, False, False, True]
    assert not Every(0).due()
    assert [duration(s) for s in (0.4, 59, 61, 3599, 3600, 7325)] == ["0s", "59s", "1m01s", "59m59s", "1h00m", "2h02m"]


def test_data_prepare_reports_files_bytes_and_tokens_off_a_terminal(tmp_path, capsys):
    from longseq.cli import main

    corpus = tmp_path / "text.txt"
    corpus.write_text("hello world\n" * 500)
    assert main(["data", "prepare", "--data", str(corpus), "--tokenizer", "char", "--out", str(tmp_path / "p"),
                 "--json"]) == 0  # fmt: skip
    captured = capsys.readouterr()
    summary = json.loads(captured.out.splitlines()[-1])
    tokens = summary["train_tokens"] + summary["valid_tokens"] + summary["test_tokens"]
    lines = captured.err.splitlines()
    assert any(line.startswith("fit char: 6.0 kB of 6.0 kB (100%) | files 1/1") for line in lines)
    assert f"encode: 6.0 kB of 6.0 kB (100%) | files 1/1 | tokens {tokens:,}" in captured.err
    assert sum("done in" in line for line in lines) == 2  # one closing line per pass
    assert main(["data", "prepare", "--data", str(corpus), "--tokenizer", "char", "--out", str(tmp_path / "q"),
                 "--json", "--quiet"]) == 0  # fmt: skip
    assert "encode" not in capsys.readouterr().err
    layout = tmp_path / "layout"  # a word vocabulary is fitted on the training file alone: the meter counts that one
    layout.mkdir()
    for split, lines in (("train", 400), ("valid", 50), ("test", 50)):
        (layout / f"{split}.txt").write_text("hello world\n" * lines)
    assert main(["data", "prepare", "--data", str(layout), "--tokenizer", "word", "--out", str(tmp_path / "w")]) == 0
    err = capsys.readouterr().err
    assert (
        "fit word: 4.8 kB of 4.8 kB (100%) | files 1/1" in err and "encode: 6.0 kB of 6.0 kB (100%) | files 3/3" in err
    )


def test_generate_ends_its_line(tmp_path, capsys):
    from support import train_tiny_lm

    from longseq.cli import main

    lm = train_tiny_lm(tmp_path)
    for prompt, new in (("abc", 5), ("abc\n", 0)):
        assert main(["generate", "--checkpoint", lm, "--prompt", prompt, "--max-new-tokens", str(new)]) == 0
        out = capsys.readouterr().out
        assert out.startswith(prompt) and out.endswith("\n") and not out.endswith("\n\n")
