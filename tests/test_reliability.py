"""A regression test for each way a user lost work or got a silently wrong answer (the reliability issue), as a
new user meets them: through the command line, on tiny models."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from support import TINY_CLI, corpus_file, last_json, tiny_corpus, tiny_run, train_tiny_lm

from longseq.cli import main
from longseq.train import load_checkpoint, save_checkpoint, train
from longseq.train.checkpoint import TrainingState, load_training_state


def test_rerunning_into_an_existing_run_is_refused_and_overwrite_starts_over(tmp_path, capsys):
    out = str(tmp_path / "run")
    assert main(["train", "--out", out, *TINY_CLI]) == 0
    before = (tmp_path / "run" / "metrics.jsonl").read_text()
    capsys.readouterr()
    assert main(["train", "--out", out, *TINY_CLI]) == 2
    err = capsys.readouterr().err
    assert "already holds a run" in err and "--resume" in err and "--overwrite" in err
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == before  # nothing touched
    assert main(["train", "--out", out, "--overwrite", *TINY_CLI, "max_steps=2", "eval_interval=1"]) == 0
    steps = [json.loads(line)["step"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert max(steps) == 2  # the old run's records are gone, not appended to


def test_checkpoints_are_saved_by_the_clock_between_evaluations(tmp_path, monkeypatch):
    """save_every_s: with a clock that advances 0.35 s a step and a 1 s cadence, last/ is saved at steps 3, 6, 9."""
    import longseq.train.trainer as trainer_module

    now = [0.0]
    monkeypatch.setattr(trainer_module.time, "monotonic", lambda: now[0])
    saves = []
    original = trainer_module.Trainer.save

    def recording(self, directory, with_state, metrics=None):
        if with_state:
            saves.append(self.step_count)
        return original(self, directory, with_state, metrics)

    monkeypatch.setattr(trainer_module.Trainer, "save", recording)

    def tick(step, model):
        now[0] += 0.35

    run = tiny_run(max_steps=10, eval_interval=100, save_every_s=1.0)
    train(run, str(tmp_path), corpus=tiny_corpus(), progress=False, after_backward=tick)
    assert saves == [3, 6, 9, 10]


def test_generate_streams_what_it_samples_and_an_interrupt_keeps_it(tmp_path):
    out = tmp_path / "run"
    assert main(["train", "--out", str(out), *TINY_CLI]) == 0
    command = [sys.executable, "-m", "longseq", "generate", "--checkpoint", str(out), "--prompt", "ROMEO:",
               "--max-new-tokens", "1000000", "--seed", "1"]  # fmt: skip
    # a test runner started in the background by a shell without job control ignores SIGINT, and its children
    # inherit that; the child gets the default back, as a terminal's process has it
    restore = lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)  # noqa: E731
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=restore)
    seen = b""
    deadline = time.time() + 120
    while len(seen) < 40 and time.time() < deadline:  # tokens arrive while the run goes on
        seen += os.read(proc.stdout.fileno(), 4096)
    assert proc.poll() is None and seen.startswith(b"ROMEO:") and len(seen) >= 40
    proc.send_signal(signal.SIGINT)
    rest, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and b"interrupted" in err
    assert len(seen + rest) >= 40


def test_cuda_rng_states_round_trip_through_a_checkpoint(tmp_path):
    model, tokenizer, run, _ = load_checkpoint(train_tiny_lm(tmp_path))
    states = [torch.randint(0, 255, (16,), dtype=torch.uint8), torch.randint(0, 255, (16,), dtype=torch.uint8)]
    training = TrainingState(
        step=3, data_state={"epoch": 0}, best_valid_loss=None, optimizer={"state": {}, "param_groups": []},
        torch_rng=torch.get_rng_state(), memory=None, tokens_seen=0, cuda_rng=states,
    )  # fmt: skip
    save_checkpoint(str(tmp_path / "ck"), model, run, tokenizer, training)
    loaded = load_training_state(str(tmp_path / "ck")).cuda_rng
    assert len(loaded) == 2 and all(torch.equal(a, b) for a, b in zip(loaded, states))


def word_corpus(tmp_path) -> str:
    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(300)]
    lines = [" ".join(rng.choice(words, size=12, p=np.arange(300, 0, -1) / (300 * 301 / 2))) for _ in range(800)]
    path = tmp_path / "words.txt"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_adaptive_softmax_cutoffs_are_checked_against_the_real_vocabulary(tmp_path, capsys):
    """From the default (character, 65-symbol) preset, a word corpus of about 300 symbols takes cutoffs 100,200."""
    data = word_corpus(tmp_path)
    args = ["train", "--data", data, "--tokenizer", "word", "--json", *TINY_CLI, "cutoffs=100,200"]
    assert main([*args, "--out", str(tmp_path / "ok")]) == 0
    _, tokenizer, run, _ = load_checkpoint(str(tmp_path / "ok" / "best"))
    assert run.model.vocab_size == tokenizer.vocab_size > 200 and run.model.cutoffs == [100, 200]
    assert main([*args[:-1], "cutoffs=100,400", "--out", str(tmp_path / "bad")]) == 2
    assert f"do not fit the {tokenizer.vocab_size}-token vocabulary" in capsys.readouterr().err


def test_labels_written_as_numbers_and_strings_are_one_class(tmp_path, capsys):
    lm = train_tiny_lm(tmp_path)
    rows = [{"text": "hh gfe abc", "label": [0, "0", 1, "1"][i % 4]} for i in range(8)]
    (tmp_path / "mixed.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    args = ["finetune", "--task", "classify", "--data", str(tmp_path / "mixed.jsonl"), "--checkpoint", lm,
            "--out", str(tmp_path / "ft"), "--steps", "2", "--segment-len", "8", "--batch-size", "4", "--quiet", "--json"]  # fmt: skip
    assert main(args) == 0
    assert last_json(capsys)["labels"] == ["0", "1"]


def test_word_generation_is_detokenized_and_unknown_prompt_words_are_named(tmp_path, capsys):
    out = tmp_path / "words"
    assert main(["train", "--data", word_corpus(tmp_path), "--tokenizer", "word", "--out", str(out), *TINY_CLI]) == 0
    capsys.readouterr()
    args = ["generate", "--checkpoint", str(out), "--max-new-tokens", "5", "--temperature", "0"]
    assert main([*args, "--prompt", "w1 w2"]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("w1 w2 w") and "not in the vocabulary" not in captured.err  # a space, not "w2w.."
    assert main([*args, "--prompt", "w1 zebra"]) == 0
    assert "not in the vocabulary and read as <unk>: 'zebra'" in capsys.readouterr().err


def test_a_checkpoint_finds_its_corpus_from_any_directory_or_names_it(tmp_path, capsys, monkeypatch):
    data = corpus_file(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--data", os.path.basename(data), "--tokenizer", "char", "--out", "run", *TINY_CLI]) == 0
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    capsys.readouterr()
    assert main(["eval", "--checkpoint", str(tmp_path / "run" / "best"), "--json", "--quiet"]) == 0
    assert last_json(capsys)["tokens"] > 0
    os.rename(data, tmp_path / "moved.txt")
    assert main(["eval", "--checkpoint", str(tmp_path / "run" / "best"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "was trained on" in err and str(data) in err and "--data" in err


def test_a_checkpoint_with_nan_weights_is_reported_broken(tmp_path, capsys):
    model, tokenizer, run, _ = load_checkpoint(train_tiny_lm(tmp_path))
    with torch.no_grad():
        next(model.parameters())[0].fill_(float("nan"))
    save_checkpoint(str(tmp_path / "broken"), model, run, tokenizer)
    capsys.readouterr()
    for argv in (["eval", "--checkpoint", str(tmp_path / "broken")],
                 ["generate", "--checkpoint", str(tmp_path / "broken"), "--prompt", "abc"]):  # fmt: skip
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "is broken" in err and "NaN" in err and "Traceback" not in err


@pytest.mark.parametrize(
    "extra,message",
    [(["--temperature", "nan"], "temperature must be a finite number"), (["--top-p", "0"], "top_p must be in (0, 1]"),
     (["--top-k", "-1"], "top_k must be >= 0"), (["--max-new-tokens", "-2"], "max_new_tokens must be")],
)  # fmt: skip
def test_each_bad_sampling_argument_is_named(tmp_path, capsys, extra, message):
    lm = train_tiny_lm(tmp_path)
    assert main(["generate", "--checkpoint", lm, "--prompt", "abc", *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_resume_with_a_changed_model_is_one_message_naming_the_fields(tmp_path, capsys):
    out = str(tmp_path / "run")
    assert main(["train", "--out", out, *TINY_CLI]) == 0
    capsys.readouterr()
    assert main(["train", "--out", out, "--resume", "--quiet", "--set", "d_model=32", "max_steps=6"]) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if "error" in line]
    assert len(errors) == 1 and "model.d_model: 16 -> 32" in errors[0] and "size mismatch" not in err


def test_out_pointing_at_a_file_and_a_failed_run_leave_nothing_behind(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    assert main(["train", "--out", str(tmp_path / "file"), *TINY_CLI]) == 2
    assert "is a file" in capsys.readouterr().err
    assert main(["train", "--out", str(tmp_path / "new"), "--data", str(tmp_path / "missing.txt"), *TINY_CLI]) == 2
    assert "does not exist" in capsys.readouterr().err and not (tmp_path / "new").exists()


def test_eval_takes_a_run_directory_and_says_which_checkpoint(tmp_path, capsys):
    out = str(tmp_path / "run")
    assert main(["train", "--out", out, *TINY_CLI]) == 0
    capsys.readouterr()
    assert main(["eval", "--checkpoint", out, "--json", "--quiet", "--set", "max_segments=2"]) == 0
    captured = capsys.readouterr()
    assert "using its best/ checkpoint" in captured.err and json.loads(captured.out.splitlines()[-1])["tokens"] > 0
