"""The training step compiles: ``torch.compile(fullgraph=True)`` traces the forward and the backward of the
default XL model, a local and a sparse pattern, a state-space stack and a hybrid in one graph each (a graph break
is an error), gives eager's numbers, and compiles again only while the memory first fills: a memory that grows by
one position a step (the curriculum) and then stays full adds no graph.  The tracing backends (``eager``,
``aot_eager``: no code generated) keep these tests quick; ``benchmarks/speed`` measures inductor."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

from longseq import ModelConfig, TransformerXLLM

BASE = dict(
    vocab_size=50, n_layer=2, d_model=32, n_head=2, d_head=16, d_inner=64, mem_len=16, attn_chunk=8, dropout=0.0
)
MODELS = {
    "xl": {},
    "window": {"attention": ["window"], "window": 8},
    "bigbird": {"attention": ["bigbird"], "window": 8, "block_size": 8, "num_random_blocks": 1, "num_global": 1},
    "ssm": {"mixer": ["ssm"]},
    "hybrid": {"mixer": ["ssm", "attention"]},
}


def model_for(name: str, **extra) -> TransformerXLLM:
    torch.manual_seed(0)
    return TransformerXLLM(ModelConfig(**{**BASE, **MODELS[name], **extra}))


SLOW = pytest.mark.slow  # each case compiles for several seconds: the default run keeps XL and the hybrid


@pytest.mark.parametrize("name", [n if n in ("xl", "hybrid") else pytest.param(n, marks=SLOW) for n in MODELS])
def test_forward_and_backward_compile_to_one_graph_with_eagers_numbers(name):
    torch._dynamo.reset()
    model = model_for(name)
    ids = torch.randint(0, 50, (2, 33))
    memory = model(ids[:, :16]).mems
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    got = compiled(ids[:, 16:32], memory, ids[:, 17:33])
    got.loss.backward()
    got_grads = [None if p.grad is None else p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    want = model(ids[:, 16:32], memory, ids[:, 17:33])
    want.loss.backward()
    torch.testing.assert_close(got.loss, want.loss, rtol=1e-6, atol=1e-6)
    for g, w in zip(got_grads, (p.grad for p in model.parameters())):
        assert (g is None) == (w is None)
        if g is not None:
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got.mems[0], want.mems[0])


@pytest.mark.parametrize("name", ["xl", pytest.param("hybrid", marks=SLOW)])
def test_a_growing_then_full_memory_compiles_only_while_it_first_fills(name):
    """Twenty steps of a memory-length curriculum (0, 1, 2, ... 16 positions, then full): every graph is made in
    the first four steps (no memory, then lengths 1, 2, 3 until dynamo marks the length dynamic)."""
    torch._dynamo.reset()
    model = model_for(name)
    compiled = torch.compile(model, fullgraph=True, backend="eager")
    ids = torch.randint(0, 50, (2, 8 * 20 + 1))
    memory, made = None, []
    for step in range(20):
        before = counters["stats"]["unique_graphs"]
        out = compiled(
            ids[:, 8 * step : 8 * step + 8],
            memory,
            ids[:, 8 * step + 1 : 8 * step + 9],
            recurrence=model.config.recurrence(mem_len=min(step, 16)),
        )
        out.loss.backward()
        memory = out.mems
        if counters["stats"]["unique_graphs"] != before:
            made.append(step)
    assert made and max(made) <= 3, made


def test_the_trainer_compiles_a_language_model_step_with_eagers_losses(tmp_path):
    from longseq.api import train
    from longseq.config import DataConfig, RunConfig, TrainConfig
    from longseq.data import CharTokenizer, Corpus

    torch._dynamo.reset()
    text = "abcab cabba bacca " * 100
    tok = CharTokenizer.build(text)
    ids = tok.encode(text)
    corpus = Corpus(ids[:1400], ids[1400:1600], ids[1600:], tok, "generated")
    run = lambda compile: RunConfig(  # noqa: E731
        ModelConfig(vocab_size=4, n_layer=2, d_model=16, n_head=2, d_head=8, d_inner=32, mem_len=8, dropout=0.0),
        DataConfig(tgt_len=8, batch_size=2, eval_batch_size=2, eval_tgt_len=8),
        TrainConfig(max_steps=6, eval_interval=6, compile=compile, mem_len_start=0, mem_len_warmup_steps=4),
    )
    eager = train(run("none"), str(tmp_path / "eager"), corpus=corpus, progress=False)
    compiled = train(run("aot_eager"), str(tmp_path / "compiled"), corpus=corpus, progress=False)
    assert compiled.losses == pytest.approx(eager.losses, rel=1e-5)
