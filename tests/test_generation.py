"""Generation: the prompt read in segments, then one token at a time from a key/value memory, equals reading the
whole text again (XL, the vanilla Transformer, the LSTM); top-k and top-p filtering; the training mode restored;
``longseq generate`` streams what it samples, keeps it on an interrupt, ends its line, detokenizes words and names
unknown prompt words and each bad sampling argument."""

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from support import TINY_CLI, assert_names, raises_naming, tiny_corpus, tiny_model, tiny_model_config, word_corpus

from longseq import ModelConfig, TransformerXLLM
from longseq.cli import main
from longseq.generation import filter_logits, generate


def test_generation_with_memory_equals_recomputing_the_context():
    torch.manual_seed(0)
    model = TransformerXLLM(
        ModelConfig(vocab_size=20, n_layer=2, d_model=16, n_head=2, d_head=8, d_inner=32, mem_len=64)
    ).eval()
    prompt = torch.randint(0, 20, (2, 13))
    fast = generate(model, prompt, 10, temperature=0, recurrence=model.config.recurrence(mem_len=64), segment_len=5)
    context = prompt
    for _ in range(10):  # naive: rerun the whole context for every token, no memory
        logits = model(context, recurrence=model.config.recurrence(mem_len=0)).logits[:, -1]
        context = torch.cat([context, logits.argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(fast, context[:, 13:])


def test_top_k_and_top_p_filtering():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    assert torch.isinf(filter_logits(logits, top_k=2)).tolist() == [[False, False, True, True]]
    assert torch.isinf(filter_logits(logits, top_p=0.7)).tolist() == [[False, False, True, True]]
    assert torch.isinf(filter_logits(logits, top_p=0.9)).tolist() == [[False, False, False, True]]
    assert torch.isinf(filter_logits(logits, top_p=0.1)).tolist() == [[False, True, True, True]]


def test_generate_restores_the_training_mode_and_checks_mem_len():
    model = TransformerXLLM(ModelConfig(vocab_size=20, n_layer=1, d_model=16, n_head=2, d_head=8, d_inner=32)).train()
    generate(model, torch.randint(0, 20, (1, 4)), 3)
    assert model.training
    with raises_naming(ValueError, "mem_len", ">= 0"):
        generate(model, torch.randint(0, 20, (1, 4)), 3, recurrence=model.config.recurrence(mem_len=-3))


def naive_greedy(model, prompt: torch.Tensor, n: int, window: int | None) -> torch.Tensor:
    """Greedy decoding that reads the whole text (or its last ``window`` tokens) again for every token."""
    ids = prompt
    with torch.no_grad():
        for _ in range(n):
            context = ids if window is None else ids[:, -window:]
            logits = model(context, None, recurrence=model.config.recurrence(mem_len=0)).logits[:, -1]  # (B, V)
            ids = torch.cat([ids, logits.argmax(-1, keepdim=True)], dim=1)
    return ids[:, prompt.size(1) :]


def test_generation_from_an_lstm_and_a_vanilla_transformer_matches_reading_the_text_again():
    """generate on an LSTM checkpoint was AttributeError 'LSTMLM' has no 'read'; on the vanilla Transformer (absolute
    positions) a StopIteration from the key/value cache.  Greedy tokens equal reading the text again each step."""
    from longseq.generation import generate
    from longseq.model.lstm import LSTMLM

    prompt = torch.as_tensor(tiny_corpus().valid[:30].astype(np.int64))[None].repeat(2, 1)  # (2, 30)
    prompt[1, :5] = 3  # two different rows
    torch.manual_seed(0)
    lstm = LSTMLM(tiny_model_config(arch="lstm")).eval()
    assert torch.equal(generate(lstm, prompt, 12, temperature=0, segment_len=8), naive_greedy(lstm, prompt, 12, None))
    vanilla = tiny_model(pos="absolute", mem_len=0).eval()
    for window in (8, 16):
        got = generate(vanilla, prompt, 12, temperature=0, segment_len=window)
        assert torch.equal(got, naive_greedy(vanilla, prompt, 12, window))


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


def test_word_generation_is_detokenized_and_unknown_prompt_words_are_named(tmp_path, capsys):
    out = tmp_path / "words"
    assert main(["train", "--data", word_corpus(tmp_path), "--tokenizer", "word", "--out", str(out), *TINY_CLI]) == 0
    capsys.readouterr()
    args = ["generate", "--checkpoint", str(out), "--max-new-tokens", "5", "--temperature", "0"]
    assert main([*args, "--prompt", "w1 w2"]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("w1 w2 w") and "not in the vocabulary" not in captured.err  # a space, not "w2w.."
    assert main([*args, "--prompt", "w1 zebra"]) == 0
    assert_names(capsys.readouterr().err, "<unk>", "'zebra'")


@pytest.mark.parametrize(
    "extra,words",
    [(["--temperature", "nan"], ("temperature", "finite")), (["--top-p", "0"], ("top_p", "(0, 1]")),
     (["--top-k", "-1"], ("top_k", ">= 0")), (["--max-new-tokens", "-2"], ("max_new_tokens",))],
)  # fmt: skip
def test_each_bad_sampling_argument_is_named(tmp_path, lm_checkpoint, capsys, extra, words):
    lm = lm_checkpoint
    assert main(["generate", "--checkpoint", lm, "--prompt", "abc", *extra]) == 2
    err = capsys.readouterr().err
    assert_names(err, *words)
    assert "Traceback" not in err


def test_generate_ends_its_line(tmp_path, lm_checkpoint, capsys):

    from longseq.cli import main

    lm = lm_checkpoint
    for prompt, new in (("abc", 5), ("abc\n", 0)):
        assert main(["generate", "--checkpoint", lm, "--prompt", prompt, "--max-new-tokens", str(new)]) == 0
        out = capsys.readouterr().out
        assert out.startswith(prompt) and out.endswith("\n") and not out.endswith("\n\n")
