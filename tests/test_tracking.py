"""Weights & Biases beside metrics.jsonl: an offline run's logged history holds metrics.jsonl's figures, step by
step, and a resumed run continues the same W&B run."""

from __future__ import annotations

import json
import re
import struct

import pytest

wandb = pytest.importorskip("wandb")

from support import tiny_corpus, tiny_run  # noqa: E402

from longseq.api import train  # noqa: E402
from longseq.train.tracking import scalars  # noqa: E402


def wandb_history(session) -> list[dict]:
    """The history rows of one offline session's ``.wandb`` file (``session``: its ``offline-run-*`` directory),
    which must end with the run's exit record (a LevelDB-style log of protobuf records: a 7-byte file header, 32 KiB
    blocks, each record chunk headed by crc32, length and kind; kinds 1 full, 2 first, 3 middle, 4 last)."""
    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = session.glob("run-*.wandb")
    data, pos, parts, rows, kinds = path.read_bytes(), 7, b"", [], []
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7]) if left >= 7 else (0, 0, 0)
        if kind == 0:  # the end of a block: padding
            pos += left
            continue
        parts, pos = parts + data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(parts)
            parts = b""
            kinds.append(record.WhichOneof("record_type"))
            if kinds[-1] == "history":
                rows.append({"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in record.history.item})
    assert kinds[-1] == "exit", f"{path} ends with a {kinds[-1]} record: the run was not finished"
    return rows


def test_the_offline_wandb_history_is_metrics_jsonl(tmp_path, monkeypatch, metrics):
    """Every number of every metrics.jsonl record is in the W&B history at its step, under TensorBoard's key, and
    the history holds nothing else (W&B's own ``_`` keys aside)."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "run"
    train(tiny_run(max_steps=4, eval_interval=2, wandb=True), str(out), corpus=tiny_corpus(), progress=False)
    wandb.teardown()  # the W&B service writes the run's file until it stops (at exit, in a command-line run)
    expected: dict[int, dict] = {}
    for record in metrics(out):
        expected.setdefault(record["step"], {}).update(scalars(record))
    (session,) = (out / "wandb").glob("offline-run-*")
    logged = {row["_step"]: {k: v for k, v in row.items() if not k.startswith("_")} for row in wandb_history(session)}
    assert logged == expected and len(expected) == 4
    run_id = (out / "wandb" / "longseq-run-id").read_text().strip()
    assert len(list((out / "wandb").glob(f"offline-run-*-{run_id}"))) == 1


def test_a_resumed_run_logs_to_the_same_wandb_run_from_where_it_stopped(tmp_path, monkeypatch, metrics):
    """Stopped at step 2 and resumed to 4: both sessions log under one W&B run id, the second from step 3 on, and
    together they hold metrics.jsonl."""
    for name, value in (("WANDB_MODE", "offline"), ("WANDB_SILENT", "true"), ("WANDB_CONFIG_DIR", "config"),
                        ("WANDB_CACHE_DIR", "cache")):  # fmt: skip
        monkeypatch.setenv(name, str(tmp_path / value) if name.endswith("DIR") else value)
    out = tmp_path / "run"
    train(tiny_run(max_steps=2, eval_interval=2, wandb=True), str(out), corpus=tiny_corpus(), progress=False)
    wandb.teardown()
    run_id = (out / "wandb" / "longseq-run-id").read_text().strip()
    train(tiny_run(max_steps=4, eval_interval=2, wandb=True), str(out), corpus=tiny_corpus(), progress=False,
          resume=True)  # fmt: skip
    wandb.teardown()
    sessions = sorted((out / "wandb").glob("offline-run-*"))
    # a session's directory: offline-run-TIME-ID, with -1 added when two sessions start in the same second
    assert len(sessions) == 2 and all(re.fullmatch(rf"offline-run-\d+_\d+-{run_id}(-\d+)?", s.name) for s in sessions)
    steps = [sorted({row["_step"] for row in wandb_history(s)}) for s in sessions]
    assert steps == [[1, 2], [3, 4]]
    assert sorted({r["step"] for r in metrics(out)}) == [1, 2, 3, 4]


def test_a_project_name_wandb_refuses_is_named_before_the_run_starts(tmp_path, text_corpus, monkeypatch, capsys):
    """``--set wandb=true wandb_project=bad/name#?`` was W&B's raw UsageError traceback, after the model was built."""
    from longseq.cli import main
    from longseq.config import ConfigError, TrainConfig

    monkeypatch.setenv("WANDB_MODE", "offline")
    for name in ("bad/name#?", "a:b", "", "x" * 129):
        with pytest.raises(ConfigError, match="not a W&B project name"):
            TrainConfig(wandb_project=name)
    out = tmp_path / "run"
    argv = ["train", "--data", str(text_corpus), "--tokenizer", "char", "--out", str(out), "--quiet", "--set",
            "max_steps=1", "wandb=true", "wandb_project=bad/name#?"]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "wandb_project 'bad/name#?'" in err and "# / ?" in err and "Traceback" not in err and not out.exists()
