"""Linformer's low-rank attention (``pattern.lowrank``, ``model/attention/lowrank.py``): the projection equals the
paper's formula in float64 with gradients, for every sharing; with k = L and identity projections it is full
bidirectional attention; a padded document reads as itself alone; classify and mlm fine-tune with it, resume bit
for bit and predict; a causal language model and the combinations it cannot serve are refused by name."""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import load_file
from support import assert_names, classify_run, label_first_documents, raises_naming, records, tiny_corpus, tiny_run

from longseq import ModelConfig, TransformerXLLM
from longseq.api import finetune, train
from longseq.config import ConfigError, DataConfig, RunConfig, TaskConfig
from longseq.config.checks import check_run
from longseq.model.attention.kernels import reference_content_attention, sdpa_attention
from longseq.model.attention.lowrank import LowRankProjection
from longseq.model.registry import check_names, ignored_options
from longseq.tasks import task_for
from longseq.train import load_checkpoint

B, H, T, D, K, N = 2, 3, 10, 4, 5, 12  # batch, heads, length, head width, projected rows, the projection's columns
SHARES = ("none", "headwise", "kv", "layerwise")
ENCODER = dict(vocab_size=30, n_layer=2, d_model=16, n_head=2, d_head=8, d_inner=32, dropout=0.0, mem_len=0,
               pos="rope", bidirectional=True)  # fmt: skip


def leaves(*shape):
    return torch.randn(*shape, dtype=torch.float64).requires_grad_()


def naive_linformer(q, k, v, E, F, length: int):
    """softmax(Q (E K)^T / sqrt(D)) (F V) per head, E and F (P, k, n) cut to the first ``length`` columns."""
    outs = []
    for h in range(q.size(1)):
        e, f = E[h % E.size(0), :, :length], F[h % F.size(0), :, :length]
        keys, values = e @ k[:, h], f @ v[:, h]  # (B, k, D)
        scores = q[:, h] @ keys.transpose(-1, -2) / math.sqrt(q.size(-1))  # (B, T, k)
        outs.append(torch.softmax(scores, dim=-1) @ values)
    return torch.stack(outs, dim=1)  # (B, H, T, D)


def grads(outputs, tensors):
    weights = torch.linspace(-1, 1, outputs.numel(), dtype=torch.float64).view_as(outputs)
    return torch.autograd.grad((outputs * weights).sum(), tensors)


@pytest.mark.parametrize("share", SHARES)
@pytest.mark.parametrize("kernel", [reference_content_attention, sdpa_attention])
def test_the_projection_equals_linformers_formula_with_gradients(share, kernel):
    """E and F per head, per layer, shared (E = F): the layer's projection then its content kernel equal the
    formula written out, outputs and gradients of q, k, v, E and F at 1e-10 in float64, over a segment shorter
    than the projection's columns."""
    torch.manual_seed(0)
    projection = LowRankProjection(H, K, N, share).double()
    q, k, v = leaves(B, H, T, D), leaves(B, H, T, D), leaves(B, H, T, D)
    out = projection(kernel, q, k, v, torch.zeros(T, T, dtype=torch.bool), 0.0, False)
    E = projection.key_proj
    F = E if projection.value_proj is None else projection.value_proj
    assert E.shape == (H if share == "none" else 1, K, N) and (projection.value_proj is None) == (share in SHARES[2:])
    reference = naive_linformer(q, k, v, E, F, T)
    torch.testing.assert_close(out, reference, rtol=0, atol=1e-10)
    tensors = [q, k, v, *projection.parameters()]
    for a, b in zip(grads(out, tensors), grads(reference, tensors)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


def test_with_as_many_rows_as_positions_and_identity_projections_it_is_full_bidirectional_attention():
    """k = L = n and E = F = I: the low-rank model's logits are the full bidirectional model's (its other weights
    copied) at 1e-10 in float64, and so are the gradients of those weights."""
    torch.manual_seed(1)
    full = TransformerXLLM(ModelConfig(**ENCODER)).double()
    lowrank = TransformerXLLM(ModelConfig(**ENCODER, lowrank=T, lowrank_len=T)).double()
    missing, unexpected = lowrank.load_state_dict(full.state_dict(), strict=False)
    assert not unexpected and missing and all(".lowrank." in name for name in missing)
    with torch.no_grad():
        for module in lowrank.modules():
            if isinstance(module, LowRankProjection):
                module.key_proj.copy_(torch.eye(T, dtype=torch.float64).expand_as(module.key_proj))
                module.value_proj.copy_(torch.eye(T, dtype=torch.float64).expand_as(module.value_proj))
    x = torch.randint(0, 30, (B, T))
    a, b = full(x, labels=x).loss, lowrank(x, labels=x).loss
    torch.testing.assert_close(lowrank(x).logits, full(x).logits, rtol=0, atol=1e-10)
    shared = [(n, p) for n, p in lowrank.named_parameters() if ".lowrank." not in n]
    theirs = dict(full.named_parameters())
    for (name, _), mine, ref in zip(shared, grads_of(b, shared), grads_of(a, [(n, theirs[n]) for n, _ in shared])):
        torch.testing.assert_close(mine, ref, rtol=0, atol=1e-10, msg=name)


def grads_of(loss, named):
    return torch.autograd.grad(loss, [p for _, p in named], retain_graph=True)


def test_a_padded_document_reads_as_itself_alone():
    """A document padded on the left (classify) or the right (mlm) gives its tokens the logits it gets alone:
    each document is projected through the columns counted from its own start; what the filler holds changes
    nothing."""
    torch.manual_seed(2)
    model = TransformerXLLM(ModelConfig(**ENCODER, lowrank=4, lowrank_len=N)).double().eval()
    doc = torch.randint(1, 30, (1, 7))
    alone = model(doc).logits[0]
    for left in (True, False):
        for filler in (0, 5):
            x = torch.full((1, N), filler)
            docs = torch.ones(1, N, dtype=torch.long)
            where = slice(N - 7, N) if left else slice(0, 7)
            x[0, where], docs[0, where] = doc[0], 0
            torch.testing.assert_close(model(x, doc_ids=docs).logits[0, where], alone, rtol=0, atol=1e-10)


def encoder_lm(tmp_path) -> str:
    """A tiny causal LM with rotary positions and no memory, 2 steps: the base the encoders start from."""
    run = tiny_run(max_steps=2, eval_interval=2, warmup_steps=1)
    run = RunConfig(run.model.replace(pos="rope", mem_len=0), run.data, run.train)
    train(run, str(tmp_path / "lm"), corpus=tiny_corpus(), progress=False)
    return str(tmp_path / "lm" / "best")


LOWRANK = dict(lowrank=4, lowrank_len=16, mem_len=0, bidirectional=True, segment_len=16, batch_size=4, lr=3e-3)


@pytest.mark.parametrize("task", ["classify", "mlm"])
def test_classify_and_mlm_fine_tune_resume_exactly_and_predict(task, tmp_path, monkeypatch):
    """From a causal LM (whose weights all load; E and F start fresh), 4 steps with Linformer's projection; stopped
    after 2 and resumed, the losses are the whole run's bit for bit; the checkpoint holds E (once, for the layerwise
    sharing of mlm) and predicts."""
    import longseq.api as finetune_module

    lm = encoder_lm(tmp_path)
    data = label_first_documents(tmp_path / "docs.jsonl", 8, seed=3, segments=(1, 2))
    extra = dict(lowrank_share="headwise") if task == "classify" else dict(lowrank_share="layerwise", mask_token="d")
    settings = dict(task=task, train=data, valid=data, steps=4, eval_interval=2, **LOWRANK, **extra)
    whole = finetune(lm, str(tmp_path / "whole"), **settings)
    fit = finetune_module.Trainer.fit
    monkeypatch.setattr(finetune_module.Trainer, "fit", lambda self, stop_after=None: fit(self, stop_after=2))
    finetune(lm, str(tmp_path / "part"), **settings)
    monkeypatch.setattr(finetune_module.Trainer, "fit", fit)
    finetune(None, str(tmp_path / "part"), task=task, resume=True)
    losses = lambda name: [(r["step"], r["loss"]) for r in records(tmp_path / name) if "loss" in r]  # noqa: E731
    assert losses("part") == losses("whole") and len(losses("whole")) == 4 and whole["steps"] == 4
    model, tokenizer, run, _ = load_checkpoint(str(tmp_path / "whole" / "best"))
    names = [n for n in model.state_dict() if ".lowrank." in n]
    assert len(names) == (4 if task == "classify" else 2)  # E and F of 2 layers; one E seen from 2 layers
    saved = [n for n in load_file(str(tmp_path / "whole" / "best" / "model.safetensors")) if ".lowrank." in n]
    assert len(saved) == len(names) // (2 if task == "mlm" else 1)  # the layerwise E is stored once
    if task == "mlm":
        layers = model.lm.transformer.stack.layers
        assert layers[0].dec_attn.lowrank is layers[1].dec_attn.lowrank
    text = "a" + "e" * 12 if task == "classify" else "ad" + "e" * 10
    (prediction,) = task_for(run, tokenizer).predict(model, [{"text": text}])
    assert (
        prediction["prediction"] in ("red", "green", "blue") if task == "classify" else len(prediction["filled"]) == 1
    )


def test_a_causal_language_model_and_what_the_projection_cannot_serve_are_refused_by_name():
    """Without bidirectional (a causal LM), with memory, a sparse pattern, relative or distance-bias positions, more
    rows than columns, an unknown sharing: each a ConfigError naming the option; the LM task and the span task are
    refused by the run check, and so are segments longer than the columns; a forward over more keys names
    lowrank_len; its options without it are ignored options."""
    fine = dict(ENCODER, lowrank=4, lowrank_len=16)
    with raises_naming(ConfigError, "pattern.lowrank", "bidirectional", "causal"):
        ModelConfig(**{**fine, "bidirectional": False})
    for change, words in (
        (dict(mem_len=8), ("mem_len",)),
        (dict(attention=["window"], window=4), ("attention", "window")),
        (dict(pos="sinusoidal"), ("pos=sinusoidal", "rope")),
        (dict(pos="alibi"), ("pos=alibi", "nope", "absolute")),
        (dict(lowrank=20), ("lowrank_len", "20")),
        (dict(lowrank_share="heads"), ("lowrank_share", "headwise")),
    ):
        with raises_naming(ConfigError, *words):
            check_names(ModelConfig(**{**fine, **change}))  # the config's own checks, then the registries'
    run = lambda task, **data: RunConfig(  # noqa: E731
        ModelConfig(**fine), DataConfig(**{"tgt_len": 16, **data}), tiny_run().train, task
    )
    with raises_naming(ConfigError, "pattern.lowrank", "classify", "mlm", "not lm"):
        check_run(run(None))
    cls = classify_run("x.jsonl").task
    with raises_naming(ConfigError, "not span"):
        check_run(run(TaskConfig(name="span", train="x.jsonl")))
    check_run(run(cls))
    with raises_naming(ConfigError, "lowrank_len=16", "32", "segment_len"):
        check_run(run(cls, tgt_len=32))
    model = TransformerXLLM(ModelConfig(**fine))
    with raises_naming(ValueError, "pattern.lowrank_len=16", "17 keys"):
        model(torch.randint(0, 30, (1, 17)))
    assert ignored_options(ModelConfig(**{**ENCODER, "lowrank_len": 8})) == ["pattern.lowrank_len=8"]
    assert_names(str(ignored_options(ModelConfig(**fine))), "[]")


def test_an_lm_run_with_the_projection_stops_before_training(tmp_path):
    """``train`` on a corpus with ``lowrank`` refuses before any step, naming it and the tasks it serves."""
    run = tiny_run(max_steps=2, warmup_steps=1)
    run = RunConfig(run.model.replace(pos="rope", mem_len=0, bidirectional=True, lowrank=4, lowrank_len=8),
                    run.data, run.train)  # fmt: skip
    with raises_naming(ConfigError, "pattern.lowrank", "classify", "mlm"):
        train(run, str(tmp_path / "lm"), corpus=tiny_corpus(), progress=False)
    assert not (tmp_path / "lm" / "last").exists()
    assert json.dumps(run.to_dict())  # the config itself is valid: the task is what it cannot serve
