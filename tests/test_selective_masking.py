"""Masked LM's selective and span masking (``task.class_rates``, ``task.span``) and masked LM from scratch on FASTA
(``longseq train --task mlm``): each token class is chosen at its own rate (measured against the binomial bound),
a class of rate 0 never, random replacements come from the classes that may be masked, spans are runs of ``span``
tokens, the default is BERT's masking draw for draw; a run on generated DNA reports accuracy by token type."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from support import cli_json, raises_naming

from longseq.config.base import ConfigError
from longseq.config.task import TaskConfig
from longseq.data.tokenizers import CasedNucleotideTokenizer
from longseq.model.heads import mask_tokens
from longseq.tasks.mlm import class_rates


def bert_reference(ids, rate, mask_id, vocab_size, generator):
    """BERT's masking as longseq drew it before selective masking (the same draws, in the same order)."""
    chosen = torch.rand(ids.shape, generator=generator) < rate
    labels = torch.where(chosen, ids, torch.full_like(ids, -100))
    action = torch.rand(ids.shape, generator=generator)
    inputs = ids.clone()
    inputs[chosen & (action < 0.8)] = mask_id
    randomize = chosen & (action >= 0.8) & (action < 0.9)
    inputs[randomize] = torch.randint(0, vocab_size, (int(randomize.sum()),), generator=generator)
    return inputs, labels


def test_the_default_is_berts_masking_draw_for_draw():
    ids = torch.randint(0, 50, (8, 300), generator=torch.Generator().manual_seed(1))
    ours = mask_tokens(ids, 0.15, 3, 50, torch.Generator().manual_seed(2))
    theirs = bert_reference(ids, 0.15, 3, 50, torch.Generator().manual_seed(2))
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs))


def options(**values) -> TaskConfig:
    return TaskConfig(name="mlm", train="x.fa", **values)


def test_each_token_class_is_masked_at_its_own_rate():
    t = CasedNucleotideTokenizer()
    rates = class_rates(t, options(mask_rate=0.1, class_rates=["soft_masked=0.4", "unknown_base=0"]))
    text = "".join(np.random.default_rng(0).choice(list("ACGTacgtNn"), size=200_000))
    ids = torch.as_tensor(t.encode(text))[None]
    inputs, labels = mask_tokens(ids, 0.1, t.mask_id, t.vocab_size, torch.Generator().manual_seed(0), rates=rates)
    chosen = labels[0] != -100
    for name, rate in (("base", 0.1), ("soft_masked", 0.4), ("unknown_base", 0.0)):
        members = torch.isin(ids[0], torch.as_tensor(t.classes[name]))
        n, hits = int(members.sum()), int((chosen & members).sum())
        assert abs(hits - rate * n) <= 5 * math.sqrt(n * rate * (1 - rate)) + 1e-9, name  # 5 binomial sigmas
    randomized = chosen & (inputs[0] != t.mask_id) & (inputs[0] != ids[0])
    maskable = torch.as_tensor(t.classes["base"] + t.classes["soft_masked"])
    assert randomized.sum() > 100 and torch.isin(inputs[0][randomized], maskable).all()  # never N, [MASK] or \n


def test_spans_are_runs_of_span_tokens_in_about_the_same_share():
    ids = torch.full((4, 20_000), 2)
    rates = torch.tensor([0.0, 0.0, 0.15])
    _, labels = mask_tokens(ids, 0.15, 1, 3, torch.Generator().manual_seed(0), rates=rates, span=6)
    chosen = (labels != -100).int()
    for row in chosen:
        edges = torch.diff(torch.cat([torch.zeros(1, dtype=torch.int), row, torch.zeros(1, dtype=torch.int)]))
        starts, ends = torch.nonzero(edges == 1).flatten(), torch.nonzero(edges == -1).flatten()
        runs = ends - starts
        assert (runs[:-1] >= 6).all()  # every run is one span or overlapping spans (the last may meet the end)
    share = float(chosen.float().mean())
    assert abs(share - (1 - (1 - 0.15 / 6) ** 6)) < 0.01  # the chance a position lies under some span


def test_class_rates_are_checked_against_the_tokenizers_classes():
    t = CasedNucleotideTokenizer()
    with raises_naming(ConfigError, "repeats", "base", "soft_masked", "unknown_base"):
        class_rates(t, options(class_rates=["repeats=0.3"]))
    with raises_naming(ConfigError, "class_rates", "'soft_masked'", "CLASS=RATE"):
        options(class_rates=["soft_masked"])
    with raises_naming(ConfigError, "no token class"):
        class_rates(t, options(class_rates=["base=0", "soft_masked=0", "unknown_base=0"]))
    rates = class_rates(t, options())
    assert rates[t.mask_id] == rates[0] == 0 and float(rates[t.classes["base"]].min()) == pytest.approx(0.15)
    assert float(class_rates(t, options(class_rates=["separator=0.2"]))[0]) == pytest.approx(0.2)


def test_masked_lm_from_scratch_on_fasta_reports_accuracy_by_token_type(tmp_path, capsys):
    pytest.importorskip("Bio")
    rng = np.random.default_rng(0)
    for split, n in (("train", 24), ("valid", 6)):
        records = ["".join(rng.choice(list("ACGTacgtN"), size=int(rng.integers(40, 120)))) for _ in range(n)]
        (tmp_path / f"{split}.fa").write_text("".join(f">r{i} made up\n{s}\n" for i, s in enumerate(records)))
    out = tmp_path / "run"
    result = cli_json(["train", "--task", "mlm", "--data", str(tmp_path / "train.fa"), "--tokenizer", "nucleotide_cased",
                       "--out", str(out), "--json", "--quiet", "--set", f"valid={tmp_path / 'valid.fa'}", "max_steps=2",
                       "eval_interval=2", "n_layer=2", "d_model=16", "n_head=2", "d_head=8", "d_inner=32",
                       "batch_size=4", "tgt_len=32", "eval_tgt_len=32", "mem_len=0", "mixer=rc_conv,attention",
                       "class_rates=soft_masked=0.3", "span=2", "rc_prob=0.5"], capsys)  # fmt: skip
    assert result["step"] == 2 and 0 <= result["masked_accuracy"] <= 1
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    by_class = next(m["valid_accuracy_by_class"] for m in metrics if "valid_accuracy_by_class" in m)
    assert {"base", "soft_masked"} <= set(by_class) <= {"base", "soft_masked", "unknown_base"}
    stored = json.loads((out / "last" / "config.json").read_text())["run"]
    assert stored["model"]["pattern"]["bidirectional"] and stored["task"]["class_rates"] == ["soft_masked=0.3"]
