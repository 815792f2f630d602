"""Output a person can follow anywhere (``progress.py``): off a terminal the trainer writes plain progress lines
(after the first step, then at most every ``progress_interval_s``) with an ETA from the measured speed, the earlier
end under a time budget; on a terminal it keeps its bar and writes none; the meter's lines and the durations it
prints.

Time is a fake clock of 10 seconds per optimizer step (``Trainer.clock``): nothing here is timed."""

from __future__ import annotations

import re

from support import fit_tiny

from longseq.progress import Every, Meter, duration

LINE = re.compile(
    r"^step (\d+)/(\d+) \(\d+%\) \| loss \d+\.\d{4} \| lr \d\.\d\de-\d\d \| [\d,]+ tok/s \| elapsed (\S+)"
    r"(?: of max_time_s \S+)? \| ETA (\S+)$"
)


def progress_lines(messages: list[str]) -> list[re.Match]:
    return [m for m in map(LINE.match, messages) if m]


def test_plain_lines_come_after_the_first_step_then_at_most_every_interval(tmp_path):
    messages: list[str] = []
    fit_tiny(tmp_path / "run", messages.append, max_steps=7, eval_interval=100, progress_interval_s=25)
    lines = progress_lines(messages)
    assert [int(m[1]) for m in lines] == [1, 4, 7]  # at 10 s, then 30 s or more apart
    assert all(int(m[2]) == 7 for m in lines)
    assert lines[1][3] == "40s" and lines[1][4] == "30s"  # 3 steps left at 10 s a step


def test_the_eta_is_the_earlier_of_the_steps_and_the_time_budget(tmp_path):
    messages: list[str] = []
    fit_tiny(tmp_path / "run", messages.append, max_steps=6, eval_interval=100, progress_interval_s=1e-9, max_time_s=45)
    etas = {int(m[1]): m[4] for m in progress_lines(messages)}
    assert etas[1] == "35s" and etas[4] == "5s"  # 50 s and 20 s of steps left, 35 s and 5 s of the budget
    assert all("of max_time_s 45s" in m.group(0) for m in progress_lines(messages))


def test_no_lines_on_a_terminal_with_interval_0_or_quiet(tmp_path, monkeypatch):
    for name, settings, progress in (("off", {"progress_interval_s": 0}, True), ("quiet", {}, False)):
        messages: list[str] = []
        fit_tiny(tmp_path / name, messages.append, progress=progress, max_steps=3, eval_interval=100, **settings)
        assert progress_lines(messages) == [] and any("valid loss" in m for m in messages)
    monkeypatch.setattr("longseq.progress.on_terminal", lambda: True)
    messages = []
    fit_tiny(tmp_path / "tty", messages.append, max_steps=3, eval_interval=100, progress_interval_s=1e-9)
    assert progress_lines(messages) == []  # the bar shows the progress there


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


def test_a_quiet_start_meter_speaks_only_once_its_interval_has_passed():
    """Validation's meter: a pass shorter than the interval prints nothing; a longer one prints a line once the
    interval has passed, then at most every interval, and where it ended."""
    now, lines = [0.0], []
    short = Meter(5, "eval", interval_s=30, write=lines.append, terminal=False, clock=lambda: now[0], quiet_start=True)
    for _ in range(5):
        now[0] += 5
        short.update(1)
    short.close()
    assert lines == []
    long = Meter(10, "eval", interval_s=30, write=lines.append, terminal=False, clock=lambda: now[0], quiet_start=True)
    for _ in range(10):
        now[0] += 10
        long.update(1)
    long.close()
    assert lines == ["eval: 3 of 10 (30%) | 0.1/s | ETA 1m10s", "eval: 6 of 10 (60%) | 0.1/s | ETA 40s",
                     "eval: 9 of 10 (90%) | 0.1/s | ETA 10s", "eval: 10 of 10 (100%) | 0.1/s | done in 1m40s"]  # fmt: skip


def test_a_validation_longer_than_the_interval_shows_its_progress_off_a_terminal(tmp_path, capsys):
    fit_tiny(tmp_path / "run", max_steps=2, eval_interval=2, progress_interval_s=1e-9)
    shown = [line for line in capsys.readouterr().err.splitlines() if line.startswith("eval: ")]
    assert shown and shown[-1].startswith("eval: ") and "done in" in shown[-1]
    fit_tiny(tmp_path / "quiet", progress=False, max_steps=2, eval_interval=2, progress_interval_s=1e-9)
    assert "eval: " not in capsys.readouterr().err
