"""What older longseq wrote keeps loading and scoring what it scored.  ``tests/fixtures/v3`` holds twenty tiny
checkpoints (format v3) and the run.toml of each, written by main at 303a20f (``tests/fixtures/make_v3.py``): one
of every kind the model config had to carry into its tree of components.  Each loads, evaluates over the same text
to the loss it scored then, gives the same logits on a probe, and its run.toml reads as the run its checkpoint
holds."""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file

from longseq.config import load_run_config
from longseq.data.corpus import bundled_corpus_path
from longseq.eval import evaluate
from longseq.train import load_checkpoint

V3 = os.path.join(os.path.dirname(__file__), "fixtures", "v3")
with open(os.path.join(V3, "scores.json"), encoding="utf-8") as _f:
    RECORD = json.load(_f)
NAMES = sorted(name for name in os.listdir(V3) if os.path.isdir(os.path.join(V3, name)))


def _text_ids(tokenizer) -> list[int]:
    with open(bundled_corpus_path(), encoding="utf-8") as f:
        return tokenizer.encode(f.read()[: RECORD["text_chars"]])


@pytest.mark.parametrize("name", NAMES)
def test_a_format_v3_checkpoint_of_main_scores_and_predicts_what_it_did(name):
    model, tokenizer, run, _ = load_checkpoint(os.path.join(V3, name))
    ids = _text_ids(tokenizer)
    start, end = RECORD["probe"]
    with torch.no_grad():
        logits = model(torch.as_tensor(ids[start:end]).view(2, -1)).logits
    torch.testing.assert_close(logits, load_file(os.path.join(V3, "logits.safetensors"))[name], rtol=0, atol=1e-6)
    if name in RECORD["scores"]:  # a bidirectional model scores no stream: its logits hold it
        expected = RECORD["scores"][name]
        result = evaluate(
            model, ids, batch_size=RECORD["batch_size"], tgt_len=RECORD["tgt_len"], kv_memory=expected["kv_memory"]
        )
        assert result["tokens"] == expected["tokens"]
        assert result["loss"] == pytest.approx(expected["loss"], rel=0, abs=1e-7)


@pytest.mark.parametrize("name", NAMES)
def test_a_run_toml_of_main_reads_as_the_run_its_checkpoint_holds(name):
    _, _, run, _ = load_checkpoint(os.path.join(V3, name))
    assert load_run_config(os.path.join(V3, f"{name}.toml")) == run
