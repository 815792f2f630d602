"""Fine-tuning options: batches grouped by length (the design's fine-tuning practice) and the schedule after the
warmup.  Claims: a grouped batch is a run of neighbours in length order, every document is drawn at most once an
epoch, a resumed sampler draws the same batches, and a resumed run with both options ends where the whole run
does; a resume that changes either is refused by name."""

from __future__ import annotations

import json

import numpy as np
import pytest
from support import records, train_tiny_lm

from longseq.cli import main
from longseq.config import ConfigError
from longseq.config.run import TaskConfig
from longseq.tasks.base import LengthGroupedBatches, training_batches


def test_a_grouped_batch_is_a_run_of_neighbours_in_length_order():
    lengths = np.random.default_rng(0).permutation(64).tolist()  # distinct lengths: ranks are the lengths
    batches = LengthGroupedBatches(lengths, batch_size=8, seed=3, pool=50)  # one pool holds every document
    for _ in range(2 * 8):  # two epochs
        picked = sorted(lengths[i] for i in batches.next())
        assert picked == list(range(picked[0], picked[0] + 8)) and picked[0] % 8 == 0


def test_grouped_batches_are_full_draw_each_document_at_most_once_an_epoch_and_cover_the_rest_later():
    lengths = np.random.default_rng(1).integers(1, 500, size=70).tolist()
    batches = LengthGroupedBatches(lengths, batch_size=8, seed=5, pool=2)
    seen = []
    for epoch in range(10):
        drawn = [batches.next() for _ in range(70 // 8)]
        assert all(len(b) == 8 for b in drawn)
        flat = [i for b in drawn for i in b]
        assert len(set(flat)) == len(flat) == 64 and batches.state_dict() == {"epoch": epoch + 1, "position": 0}
        seen += flat
    assert set(seen) == set(range(70))  # the 6 left over differ from epoch to epoch


def test_a_resumed_grouped_sampler_draws_the_same_batches():
    lengths = np.random.default_rng(2).integers(1, 500, size=50).tolist()
    whole = LengthGroupedBatches(lengths, batch_size=4, seed=7, pool=3)
    expected = [whole.next() for _ in range(30)]  # across an epoch boundary (12 batches an epoch)
    first = LengthGroupedBatches(lengths, batch_size=4, seed=7, pool=3)
    head = [first.next() for _ in range(17)]
    resumed = LengthGroupedBatches(lengths, batch_size=4, seed=7, pool=3)
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
    assert head + [resumed.next() for _ in range(13)] == expected


def test_the_sampler_follows_the_option_and_refuses_no_documents():
    options = TaskConfig(name="classify", train="x.jsonl", group_by_length=True)
    assert isinstance(training_batches([3, 1, 2], options, 2, 0), LengthGroupedBatches)
    assert not isinstance(
        training_batches([3, 1, 2], TaskConfig(name="classify", train="x.jsonl"), 2, 0), LengthGroupedBatches
    )
    assert len(LengthGroupedBatches([5, 6], batch_size=8, seed=0).next()) == 2  # fewer documents than a batch
    with pytest.raises(ConfigError, match="no training examples"):
        LengthGroupedBatches([], batch_size=8, seed=0)


def varied_lengths_file(tmp_path) -> str:
    words = ["hh", "gfe", "abc", "cab", "defg"]
    rows = [{"text": " ".join(words[(i + j) % 5] for j in range(2 + 3 * (i % 5))), "label": i % 2} for i in range(12)]
    path = tmp_path / "varied.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return str(path)


def test_grouped_linear_fine_tuning_resumes_exactly_and_refuses_changes(tmp_path, capsys, monkeypatch):
    import longseq.train.finetune as finetune_module

    lm, data = train_tiny_lm(tmp_path), varied_lengths_file(tmp_path)
    args = ["finetune", "--task", "classify", "--data", data, "--checkpoint", lm, "--segment-len", "8",
            "--batch-size", "4", "--group-by-length", "--schedule", "linear", "--steps", "6", "--valid", data, "--eval-interval", "1",
            "--quiet", "--json"]  # fmt: skip
    assert main([*args, "--out", str(tmp_path / "whole")]) == 0
    fit = finetune_module.Trainer.fit
    monkeypatch.setattr(finetune_module.Trainer, "fit", lambda self, stop_after=None: fit(self, stop_after=3))
    assert main([*args, "--out", str(tmp_path / "part")]) == 0  # interrupted after 3 of its 6 steps
    monkeypatch.setattr(finetune_module.Trainer, "fit", fit)
    config = json.loads((tmp_path / "whole" / "last" / "config.json").read_text())
    assert config["run"]["train"]["schedule"] == "linear" and config["run"]["task"]["group_by_length"]
    capsys.readouterr()
    resume = ["finetune", "--resume", "--out", str(tmp_path / "part"), "--quiet", "--json"]
    assert main([*resume, "--batch-size", "2"]) == 2  # a resume keeps the data layout (as a language model's)
    assert "data.batch_size: 4 -> 2" in capsys.readouterr().err
    plain = ["finetune", "--task", "classify", "--data", data, "--checkpoint", lm, "--segment-len", "8",
             "--batch-size", "4", "--quiet", "--json", "--steps", "2", "--out", str(tmp_path / "plain")]  # fmt: skip
    assert main(plain) == 0
    assert main(["finetune", "--resume", "--out", str(tmp_path / "plain"), "--group-by-length", "--quiet"]) == 2
    assert "task.group_by_length: False -> True" in capsys.readouterr().err
    losses = lambda name: [(r["step"], r["loss"]) for r in records(tmp_path / name) if "loss" in r]  # noqa: E731
    assert len(losses("part")) == 3
    assert main(resume) == 0
    assert losses("part") == losses("whole") and len(losses("whole")) == 6
    lrs = [r["lr"] for r in records(tmp_path / "whole") if "lr" in r]
    assert lrs == pytest.approx([1e-3, 1e-3, 8e-4, 6e-4, 4e-4, 2e-4])  # 1 warmup step, then linear to 0 at step 6
    capsys.readouterr()
    assert main([*resume, "--steps", "8"]) == 0  # extending a decayed run says what happens to its schedule
    assert "note: the linear decay now ends at step 8, not 6" in capsys.readouterr().err


def test_a_moved_run_resumes_exactly_from_its_files_at_their_new_path_and_other_files_are_refused(
    tmp_path, capsys, monkeypatch
):
    """A fine-tuning run records the sha256 of its files and of its base checkpoint's weights.  Moved with its
    files (a moved or re-cloned project), it resumes from them at their new path and ends where the whole run
    does; a file with other bytes, at a new path or at the run's own, is refused by name, and so is a file that is
    gone."""
    import shutil

    import longseq.train.finetune as finetune_module

    old = tmp_path / "old"
    old.mkdir()
    lm, data = train_tiny_lm(old), varied_lengths_file(old)
    args = ["finetune", "--task", "classify", "--data", data, "--valid", data, "--checkpoint", lm, "--segment-len",
            "8", "--batch-size", "4", "--steps", "6", "--eval-interval", "1", "--quiet", "--json"]  # fmt: skip
    assert main([*args, "--out", str(old / "whole")]) == 0
    fit = finetune_module.Trainer.fit
    monkeypatch.setattr(finetune_module.Trainer, "fit", lambda self, stop_after=None: fit(self, stop_after=3))
    assert main([*args, "--out", str(old / "part")]) == 0  # interrupted after 3 of its 6 steps
    monkeypatch.setattr(finetune_module.Trainer, "fit", fit)
    new = tmp_path / "new"
    shutil.move(old, new)
    moved_data, moved_lm = str(new / "varied.jsonl"), str(new / "lm")
    resume = ["finetune", "--resume", "--out", str(new / "part"), "--quiet", "--json"]
    capsys.readouterr()
    assert main(resume) == 2
    assert f"--data: the run's file {data} is gone" in capsys.readouterr().err
    other = new / "other.jsonl"
    other.write_text(open(moved_data).read().replace("gfe", "fed"))
    assert main([*resume, "--data", str(other), "--valid", moved_data]) == 2
    err = capsys.readouterr().err
    assert f"--data {data!r} -> {str(other)!r} (not the run's file: its sha256 differs)" in err and "gone" not in err
    assert main([*resume, "--data", moved_data, "--valid", moved_data, "--checkpoint", str(other)]) == 2
    assert f"--checkpoint {lm!r} -> {str(other)!r} (not the weights the run started from)" in capsys.readouterr().err
    files = ["--data", moved_data, "--valid", moved_data]
    finished = ["finetune", "--resume", "--out", str(new / "whole"), "--quiet", "--json"]
    assert main([*finished, *files]) == 0  # nothing left to train: best/ still names the old paths
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["steps"] == 6
    assert main([*resume, "--data", moved_data, "--valid", moved_data, "--checkpoint", moved_lm]) == 0
    losses = lambda name: [(r["step"], r["loss"]) for r in records(new / name) if "loss" in r]  # noqa: E731
    assert losses("part") == losses("whole") and len(losses("whole")) == 6
    options = json.loads((new / "part" / "last" / "config.json").read_text())["run"]["task"]
    assert (options["train"], options["valid"], options["base"]) == (moved_data, moved_data, str(new / "lm" / "best"))
    shutil.copy(other, moved_data)  # other bytes at the run's own path
    assert main([*resume, "--steps", "8"]) == 2
    assert f"--data: {moved_data} is not the file the run started with (its sha256 differs)" in capsys.readouterr().err


def test_a_run_without_fingerprints_resumes_from_its_own_paths_only_and_says_so(tmp_path, capsys, monkeypatch):
    """Runs started before fine-tuning recorded its files' sha256 (simulated: none recorded) stay tied to their
    paths; moved, they are refused with the reason, not told to give the new place."""
    import shutil

    import longseq.train.finetune as finetune_module

    monkeypatch.setattr(finetune_module, "fingerprints", lambda options: {})
    old = tmp_path / "old"
    old.mkdir()
    lm, data = train_tiny_lm(old), varied_lengths_file(old)
    args = ["finetune", "--task", "classify", "--data", data, "--checkpoint", lm, "--segment-len", "8",
            "--batch-size", "4", "--steps", "2", "--quiet", "--json", "--out", str(old / "ft")]  # fmt: skip
    assert main(args) == 0
    assert not json.loads((old / "ft" / "last" / "config.json").read_text())["run"]["task"].get("sha256")
    shutil.move(old, tmp_path / "new")
    resume = ["finetune", "--resume", "--out", str(tmp_path / "new" / "ft"), "--quiet", "--steps", "3"]
    capsys.readouterr()
    assert main(resume) == 2
    assert "the run records no sha256 of its files, so it resumes from that path only" in capsys.readouterr().err
    moved = str(tmp_path / "new" / "varied.jsonl")
    assert main([*resume, "--data", moved]) == 2
    err = capsys.readouterr().err
    assert f"--data {data!r} -> {moved!r}. A resume" in err and "sha256 differs" not in err
