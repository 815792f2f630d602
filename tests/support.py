"""What the tests share, as plain functions and constants (not a test module: pytest collects nothing here).

Tiny corpora, runs, models and checkpoints; the command line's tiny settings; the one-attention-layer harness the
pattern, sparse and Flex tests hold kernels to the reference with; exact-resume and metrics-log helpers; and the
key-word checks of error messages.  Fixtures built on these live in ``conftest.py``; a test module imports what
it needs from here (``from support import tiny_run``), never from another test module.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import types
from contextlib import contextmanager

import numpy as np
import pytest
import torch

from longseq.config import DataConfig, ModelConfig, RunConfig, TrainConfig
from longseq.config.model import PatternConfig
from longseq.config.run import TaskConfig
from longseq.data import CharTokenizer, Corpus
from longseq.model import Memory, RingMemory, TransformerXLLM
from longseq.model.attention import RelativeMultiHeadAttention
from longseq.model.attention.patterns import AttentionPattern, PatternMask, global_keys
from longseq.model.memory import HiddenContext
from longseq.model.positions import RelativePositions, relative_distances, sinusoidal_embedding

# --- errors: the type and the key words that carry the claim, not the sentence ---------------------------------


def assert_names(text: str, *words: str) -> None:
    """``text`` (an error message, a command's stderr) contains every one of ``words``: the value, the field, the
    file that the message must name.  A reworded message still passes; one that no longer names them fails."""
    missing = [word for word in words if word not in text]
    assert not missing, f"{missing} not named in: {text[-2000:]}"


def assert_said(messages: list[str], *words: str) -> None:
    """One of ``messages`` (the lines a run logged) names every one of ``words``."""
    assert any(all(word in m for word in words) for m in messages), f"no message names {words}: {messages[-20:]}"


@contextmanager
def raises_naming(kind: type[BaseException], *words: str):
    """``pytest.raises(kind)`` whose message names every one of ``words`` (see :func:`assert_names`)."""
    with pytest.raises(kind) as caught:
        yield caught
    assert_names(str(caught.value), *words)


# --- a tiny corpus, run, model and checkpoint --------------------------------------------------------------------


def tiny_text(seed: int = 0, n: int = 6000) -> str:
    """``n`` characters of five made-up words: a corpus a two-layer model learns something of in a few steps."""
    rng = np.random.default_rng(seed)
    return " ".join(rng.choice(["abc", "defg", "hh", "gfe", "cab\n"], size=n // 3))[:n]


def tiny_corpus(seed: int = 0, n: int = 6000) -> Corpus:
    """:func:`tiny_text` as a character corpus in RAM: 5000 training, 500 validation and 500 test tokens."""
    text = tiny_text(seed, n)
    tok = CharTokenizer.build(text)
    ids = tok.encode(text)
    return Corpus(ids[:5000], ids[5000:5500], ids[5500:], tok, "generated")


def corpus_file(directory) -> str:
    """The tiny corpus as ``directory/corpus.txt``, for runs through the command line (split 90/5/5 on reading);
    the ``text_corpus`` fixture writes the same file in ``tmp_path``."""
    path = directory / "corpus.txt"
    path.write_text(tiny_text())
    return path


def tiny_run(**train_overrides) -> RunConfig:
    """A two-layer model of width 16 on the tiny corpus: 14 steps of two accumulated chunks, validation every 5."""
    return RunConfig(
        model=tiny_model_config(),
        data=DataConfig(tgt_len=8, batch_size=4, eval_tgt_len=8, eval_batch_size=2, varlen=True),
        train=TrainConfig(
            **{
                "max_steps": 14,
                "lr": 3e-3,
                "warmup_steps": 3,
                "eval_interval": 5,
                "log_interval": 1,
                "grad_accum": 2,
                **train_overrides,
            }
        ),
    )


def tiny_model_config(**overrides) -> ModelConfig:
    """The model of :func:`tiny_run`, with fields of the model or its sections changed by name."""
    fields = dict(vocab_size=10, n_layer=2, d_model=16, n_head=2, d_head=8, d_inner=32, dropout=0.2, dropatt=0.1)
    return ModelConfig(**{**fields, "mem_len": 8, **overrides})


def tiny_lstm_config() -> ModelConfig:
    """The LSTM baseline of :func:`tiny_model_config`'s size: only the options an LSTM reads."""
    return ModelConfig(arch="lstm", vocab_size=10, n_layer=2, d_model=16, dropout=0.2)


def tiny_model(**overrides) -> TransformerXLLM:
    torch.manual_seed(0)
    return TransformerXLLM(tiny_model_config(**overrides))


def train_tiny_lm(directory) -> str:
    """Two steps of :func:`tiny_run` into ``directory/lm``; the path of its ``best/`` checkpoint."""
    from longseq.api import train

    train(tiny_run(max_steps=2, eval_interval=2), str(directory / "lm"), corpus=tiny_corpus(), progress=False)
    return str(directory / "lm" / "best")


def write_classify_file(directory) -> str:
    """Eight two-class records in ``directory/cls.jsonl``; its path."""
    rows = [{"text": ["hh gfe abc", "cab defg"][i % 2] * 2, "label": i % 2} for i in range(8)]
    path = directory / "cls.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return str(path)


def assert_resumes_exactly(run, tmp_path, stop_after: int):
    """Training ``run()`` stopped after ``stop_after`` steps and resumed gives the uninterrupted run's losses, bit
    for bit; returns the uninterrupted run's result."""
    from longseq.api import train

    corpus = tiny_corpus()
    whole = train(run(), str(tmp_path / "whole"), corpus=corpus, progress=False)
    first = train(run(), str(tmp_path / "split"), corpus=corpus, progress=False, stop_after=stop_after)
    second = train(run(), str(tmp_path / "split"), corpus=corpus, progress=False, resume=True)
    assert first.losses + second.losses == whole.losses
    return whole


def word_corpus(directory) -> str:
    """800 lines of 12 words drawn from 300 (Zipf-like): ``directory/words.txt``, a word vocabulary of ~300."""
    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(300)]
    lines = [" ".join(rng.choice(words, size=12, p=np.arange(300, 0, -1) / (300 * 301 / 2))) for _ in range(800)]
    path = directory / "words.txt"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


# a text whose characters take 1 to 3 UTF-8 bytes (bits per byte differ from bits per character)
UNICODE_TEXT = "Grüße aus Köln, 東京 und Zürich!\nnaïve café — déjà vu.\n\nplain ascii line\n" * 6


def canonical(text: str) -> str:
    """A word tokenizer's text: each line's words joined by one space, ended by a newline."""
    return "".join(" ".join(line.split()) + "\n" for line in text.split("\n")[:-1])


def fit_tiny(out, log=None, progress=True, resume=False, **settings):
    """A tiny LM run (:func:`tiny_run` with ``settings``) whose clock reads 10 s per optimizer step taken: time
    budgets and progress lines are checked without timing anything."""
    from longseq.tasks.lm import LanguageModeling
    from longseq.train.trainer import Trainer

    run = tiny_run(**settings)
    trainer = Trainer(LanguageModeling(run, corpus=tiny_corpus()), run, str(out), resume=resume, progress=progress,
                      log=log)  # fmt: skip
    trainer.clock = lambda: 10.0 * trainer.step_count
    return trainer.fit()


# --- a classification whose label is a document's first character (fine-tuning defaults) ------------------------

DOC_SEGMENT = 8
ABC_TOKENIZER = CharTokenizer(list("abcdefgh"))
_LABELS = {"a": "red", "b": "green", "c": "blue"}  # the first character carries the label; "defgh" are noise


def label_first_documents(path, n: int, seed: int, segments: tuple[int, int] = (3, 4)) -> str:
    """``n`` documents of 3-4 segments: a label character, then noise characters that never carry it."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(n):
        first = "abc"[int(torch.randint(0, 3, (1,), generator=g))]
        length = int(torch.randint(segments[0] * DOC_SEGMENT - 2, segments[1] * DOC_SEGMENT + 1, (1,), generator=g))
        noise = "".join("defgh"[int(i)] for i in torch.randint(0, 5, (length - 1,), generator=g))
        rows.append({"text": first + noise, "label": _LABELS[first]})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def classify_run(train: str, pooling: str | None = None, mem_bptt: int = 1) -> RunConfig:
    """A two-layer classifier run over :data:`ABC_TOKENIZER`, segments of :data:`DOC_SEGMENT`."""
    model = ModelConfig(vocab_size=8, n_layer=2, d_model=16, n_head=2, d_head=8, d_inner=32, dropout=0.0,
                        mem_len=DOC_SEGMENT, mem_bptt=mem_bptt)  # fmt: skip
    options = {"train": train, **({} if pooling is None else {"pooling": pooling})}
    return RunConfig(
        model, DataConfig(tgt_len=DOC_SEGMENT, batch_size=4), TrainConfig(), TaskConfig(name="classify", **options)
    )


# --- run directories and the command line ------------------------------------------------------------------------

# ``--set`` sizes of a tiny character run through the command line: 4 steps of segments of 16
TINY_CLI = ["--quiet", "--set", "max_steps=4", "eval_interval=2", "eval_max_segments=2", "n_layer=1", "d_model=16",
            "n_head=2", "d_head=8", "d_inner=32", "batch_size=2", "tgt_len=16", "eval_tgt_len=16",
            "eval_batch_size=2", "mem_len=16"]  # fmt: skip
# ... and 2 steps of segments of 8, no checkpoint by the clock
TINY_CLI_8 = ["--quiet", "--set", "max_steps=2", "eval_interval=2", "eval_max_segments=2", "n_layer=1", "d_model=16",
              "n_head=2", "d_head=8", "d_inner=32", "batch_size=2", "tgt_len=8", "eval_tgt_len=8", "mem_len=8",
              "save_every_s=0"]  # fmt: skip


def cli_json(argv, capsys) -> dict:
    """Run a ``--json`` command, which must succeed; the JSON object it printed last."""
    from longseq.cli import main

    assert main(argv) == 0
    return last_json(capsys)


def interrupt_json_writes_after(lines: int, monkeypatch) -> None:
    """A Ctrl-C inside :func:`longseq.data.tasks.write_jsonl`, after ``lines`` lines."""
    import longseq.data.tasks as tasks

    calls = [0]

    def dumps(row, **kwargs):
        calls[0] += 1
        if calls[0] > lines:
            raise KeyboardInterrupt
        return json.dumps(row, **kwargs)

    monkeypatch.setattr(tasks, "json", type("J", (), {"dumps": staticmethod(dumps), "loads": json.loads}))


def records(run_dir) -> list[dict]:
    """The records of a run's ``metrics.jsonl``."""
    with open(os.path.join(run_dir, "metrics.jsonl"), encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def last_json(capsys) -> dict:
    """The JSON object a ``--json`` command printed last."""
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def rewrite_listed(directory, name: str, text: str) -> None:
    """Replace a checkpoint file and its manifest entry: a consistent checkpoint as another version wrote it."""
    from longseq.data.sources import file_sha256

    path = directory / name
    path.write_text(text)
    manifest = json.loads((directory / "manifest.json").read_text())
    manifest["files"][name] = {"size": os.path.getsize(path), "sha256": file_sha256(str(path))}
    (directory / "manifest.json").write_text(json.dumps(manifest))


# --- a live training process, paused to inject a fault ----------------------------------------------------------

TRAIN_COMMAND = [sys.executable, "-m", "longseq", "train"]
FAULT_CLI = ["--tokenizer", "char", "--quiet", "--set", "eval_interval=1000", "log_interval=1", "n_layer=2",
             "d_model=16", "n_head=2", "d_head=8", "d_inner=32", "mem_len=8", "tgt_len=8", "batch_size=4",
             "eval_max_segments=2", "warmup_steps=3", "save_every_s=0"]  # fmt: skip


def step_losses(run_dir) -> dict:
    """``{step: loss}`` of a run's metrics log."""
    return {r["step"]: r["loss"] for r in records(run_dir) if "loss" in r}


def logged_steps(run_dir) -> int:
    try:
        return len(step_losses(run_dir))
    except (FileNotFoundError, json.JSONDecodeError):
        return 0


def pause_when(condition, proc, seconds=120):
    """Wait until ``condition()`` holds for the running ``proc``, then stop it (SIGSTOP) where it is: a fault is then
    injected into a live run however fast the machine is (SIGCONT lets it go on)."""
    deadline = time.time() + seconds
    while not condition() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGSTOP)
    assert proc.poll() is None, "the run ended before the fault could be injected"


# --- evaluation curves: a small model whose losses depend clearly on what it reads --------------------------------

SMALL_LM = dict(vocab_size=30, n_layer=2, d_model=16, n_head=2, d_head=8, d_inner=32, dropout=0.0)


def large_weight_lm(**extra) -> TransformerXLLM:
    """A tiny random float64 model with large weights, so that its losses depend clearly on what it reads."""
    torch.manual_seed(0)
    net = TransformerXLLM(ModelConfig(**{**SMALL_LM, **extra})).double().eval()
    with torch.no_grad():
        for param in net.parameters():
            param.normal_(0.0, 0.3)
    return net


def checkpoint_and_valid_ids(checkpoint: str):
    """The model of a character checkpoint and the validation ids of the corpus it was trained on."""
    from longseq.data.corpus import load_corpus
    from longseq.train import load_checkpoint

    net, tokenizer, run, _ = load_checkpoint(checkpoint)
    return net, load_corpus(run.data.path, "char", tokenizer=tokenizer).valid


# --- one attention layer, fast kernel against the dense reference (float64) -------------------------------------

D_MODEL, N_HEAD, D_HEAD = 16, 4, 4
PARAMS = dict(window=5, stride=4, block_size=4, block_summary=1, num_random_blocks=2, pattern_seed=3)


def pattern(name, causal=True, **overrides) -> AttentionPattern:
    params = {**PARAMS, "dilation": (1, 2, 3, 1) if name == "dilated" else (1,), **overrides}
    return AttentionPattern(name, PatternConfig(bidirectional=not causal, **params))


def make_layer(kernel: str, chunk: int, pos: str = "sinusoidal", softcap: float = 0.0) -> RelativeMultiHeadAttention:
    torch.manual_seed(0)
    layer = RelativeMultiHeadAttention(
        D_MODEL, N_HEAD, D_HEAD, kernel=kernel, chunk=chunk, pos=pos, max_relative_distance=6, softcap=softcap
    )
    if pos == "shaw":
        torch.nn.init.normal_(layer.rel.rel_table, 0.0, 0.5)
    return layer.double()


def run_layer(layer, p, qlen, mlen, global_mask=None, docs=None, grad=True, dropped=None):
    """Output and gradients (hidden, memory, u, v, every parameter) of one attention layer; with ``grad=False``
    the output of a forward without autograd (the kernels' inference paths) and no gradients."""
    torch.manual_seed(1)
    hidden = torch.randn(2, qlen, D_MODEL, dtype=torch.float64, requires_grad=True)
    memory = torch.randn(2, mlen, D_MODEL, dtype=torch.float64, requires_grad=True) if mlen else None
    u = torch.randn(N_HEAD, D_HEAD, dtype=torch.float64, requires_grad=True)
    v = torch.randn(N_HEAD, D_HEAD, dtype=torch.float64, requires_grad=True)
    klen = qlen + mlen
    distances = relative_distances(klen, -1, bottom=0 if p.causal else -(qlen - 1))
    pos_emb = None if hasattr(layer.rel, "rel_table") else sinusoidal_embedding(distances, D_MODEL, torch.float64)
    rel_key = layer.relative_keys(RelativePositions(distances, pos_emb, torch.float64))
    flags = global_keys(global_mask, p.config.num_global, 2, qlen, mlen, None) if p.has_global else None
    query_docs, key_docs = docs if docs is not None else (None, None)
    mask = PatternMask(p, qlen, mlen, None, query_docs, key_docs, flags, dropped_keys=dropped)
    if layer.kernel_name == "reference":
        mask = mask.forbidden()  # the dense reference: the predicate evaluated on every pair
    with torch.set_grad_enabled(grad):
        out, _, _ = layer(hidden, rel_key, u, v, mask, HiddenContext(memory))
    if not grad:
        return out, []
    weights = torch.randn_like(out)
    grads = torch.autograd.grad((out * weights).sum(), [hidden, u, v, *layer.parameters()] + ([memory] if mlen else []))
    return out, grads


def assert_same_run(fast, slow, atol=1e-10):
    """Two :func:`run_layer` results agree: the output and every gradient."""
    torch.testing.assert_close(fast[0], slow[0], rtol=0, atol=atol)
    for a, b in zip(fast[1], slow[1]):
        torch.testing.assert_close(a, b, rtol=0, atol=atol)


def pattern_lm(attention, **extra) -> TransformerXLLM:
    """A two-layer float64 language model of the harness's width with the given per-layer patterns."""
    base = dict(vocab_size=40, n_layer=2, d_model=D_MODEL, n_head=N_HEAD, d_head=D_HEAD, d_inner=32, dropout=0.0)
    config = ModelConfig(**{**base, "mem_len": 12, "attention": attention, **extra})
    torch.manual_seed(0)
    return TransformerXLLM(config).double().eval()


def in_segments(model, x, size: int, mems=None):
    """The scores (B, T, V) of ``x`` read in segments of ``size`` with the memory carried from ``mems`` (None: a new
    one, of the model's kind), and the memory after the last segment."""
    parts = []
    for lo in range(0, x.size(1), size):
        out = model(x[:, lo : lo + size], mems)
        parts.append(out.logits)
        mems = out.mems
    return torch.cat(parts, dim=1), mems


def segments_and_steps(model, x, size: int):
    """The scores of ``x`` read in segments of ``size`` with the memory carried, and token by token through a ring
    memory (generation's path), each (B, T, V), and the memory after the last segment; call under no_grad."""
    segmented, mems = in_segments(model, x, size)
    ring, steps = Memory.empty(RingMemory), []
    for t in range(x.size(1)):
        scores, ring = model.next_token_scores(x[:, t : t + 1], ring)
        steps.append(scores)
    return segmented, torch.stack(steps, dim=1), mems


# --- transformers' own Llama-family models, computed in float64 throughout ----------------------------------------


class _WideTorch(types.ModuleType):
    """``torch`` as a transformers module sees it under :func:`wide_transformers`: ``torch.float`` and
    ``torch.float32`` are float64, everything else is torch's own."""

    def __init__(self) -> None:
        super().__init__("torch")

    def __getattr__(self, name: str):
        return torch.float64 if name in ("float", "float32") else getattr(torch, name)


@contextmanager
def wide_transformers(*model_types: str):
    """transformers computing in float64 where its Llama-family code fixes float32 (the RMSNorm's upcast, rope's
    frequencies, cos and sin, the softmax of eager attention), so that a float64 model is float64 throughout and
    its logits can be held to longseq's at 1e-10.  The name ``torch`` is replaced in ``modeling_rope_utils`` and the
    families' modeling modules only, for the ``with`` block (build the model and run it inside)."""
    import importlib

    names = ["transformers.modeling_rope_utils"] + [f"transformers.models.{t}.modeling_{t}" for t in model_types]
    modules = [importlib.import_module(name) for name in names]
    saved = [module.torch for module in modules]
    for module in modules:
        module.torch = _WideTorch()
    try:
        yield
    finally:
        for module, old in zip(modules, saved):
            module.torch = old


def tiny_llama_checkpoint(directory) -> str:
    """A tiny random Llama (transformers' own: 2 layers of width 32, 4 heads sharing 2 key/value heads, a 128-token
    context) with a byte-level BPE of 300 tokens, saved as transformers saves it and converted by ``longseq convert
    --from-hf`` into ``directory/llama``; its path.  Also writes ``directory/text.txt``, a few thousand characters."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from longseq.cli import main

    text = tiny_text(n=4000)
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer, bpe.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    bpe.train_from_iterator(
        [text], trainers.BpeTrainer(vocab_size=300, special_tokens=["<eos>"], initial_alphabet=alphabet)
    )
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                      eos_token_id=0, bos_token_id=0, tie_word_embeddings=True)  # fmt: skip
    transformers.LlamaForCausalLM(config).save_pretrained(directory / "hf")
    transformers.PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<eos>").save_pretrained(directory / "hf")
    (directory / "text.txt").write_text(text)
    assert main(["convert", "--from-hf", str(directory / "hf"), "--out", str(directory / "llama"), "--quiet"]) == 0
    return str(directory / "llama")
