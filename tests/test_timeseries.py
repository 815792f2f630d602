"""Time series: Chronos's mean scaling and uniform bins (its bin edges, exact on the grid, within half a bin off it),
UCR ``.ts`` and ``.tsv`` files read alike in RAM and prepared with a document per series, missing values, wrong
lengths and multivariate files refused at their line, classification of whole series from a UCR file, and
forecasting as sampled continuations whose quantiles are ordered and on the context's scale."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from support import TINY_CLI_8, cli_json, raises_naming, tiny_model

from longseq.data import load_corpus, load_prepared, prepare_corpus
from longseq.data.sources import CorpusError
from longseq.data.tasks import TaskDataError, read_jsonl
from longseq.data.tokenizers import TokenizerError, build_tokenizer, tokenizer_from_dict
from longseq.data.tokenizers.chronos import EOS, SPECIAL, ChronosTokenizer, scale_encode, unscale
from longseq.generation import forecast


def ucr_ts(path, series: list[np.ndarray], labels: list[str], length: int | None = None) -> None:
    header = ["# made up", "@problemName Test", "@univariate true", "@equalLength true"]
    header += [
        f"@seriesLength {length or len(series[0])}",
        f"@classLabel true {' '.join(sorted(set(labels)))}",
        "@data",
    ]
    rows = [",".join(f"{v:.6f}" for v in s) + ":" + label for s, label in zip(series, labels)]
    path.write_text("\n".join(header + rows) + "\n")


def two_classes(n: int, length: int = 40, seed: int = 0):
    rng = np.random.default_rng(seed)
    t = np.linspace(0, 4 * np.pi, length)
    series = [np.sin(t * (1 + i % 2)) * (1 + i) + rng.normal(0, 0.05, length) for i in range(n)]
    return series, [str(i % 2) for i in range(n)]


def test_the_bins_are_chronos_and_round_trip_on_the_grid():
    tokenizer = ChronosTokenizer()
    assert tokenizer.vocab_size == 4096 and len(tokenizer.centers) == 4093
    assert tokenizer.centers[0] == -15 and tokenizer.centers[-1] == 15
    ids = np.arange(SPECIAL + 1, 4096)
    assert np.array_equal(tokenizer.quantize(tokenizer.values(ids)), ids)  # every centre is its own bin
    x = np.random.default_rng(0).uniform(-15, 15, 10_000)
    width = tokenizer.centers[1] - tokenizer.centers[0]
    assert np.abs(tokenizer.values(tokenizer.quantize(x)) - x).max() <= width / 2 + 1e-12
    assert tokenizer.quantize(np.array([-1e6, 1e6])).tolist() == [SPECIAL + 1, 4095]  # beyond: the end bins


def test_mean_scaling_makes_a_series_and_its_multiples_one_token_sequence():
    tokenizer = build_tokenizer("chronos", "")
    values = np.array([1.0, -2.0, 3.5, 0.0, 4.25])
    ids, scale = scale_encode(tokenizer, values)
    assert scale == pytest.approx(np.abs(values).mean())
    for factor in (0.001, 7.0, 1e5):
        assert np.array_equal(scale_encode(tokenizer, values * factor)[0], ids)
    assert np.abs(unscale(tokenizer, ids, scale) - values).max() <= scale * 30 / 4092 / 2 + 1e-12
    assert scale_encode(tokenizer, np.zeros(4))[1] == 1.0  # Chronos: a scale of 0 is 1
    text = "1 -2 3.5 0 4.25\n2 2 2\n"
    encoded = tokenizer.encode(text)
    assert encoded.tolist() == [*ids, EOS, *scale_encode(tokenizer, np.array([2.0, 2, 2]))[0], EOS]
    assert len(tokenizer.offsets(text)) == len(encoded)
    small = tokenizer_from_dict({"kind": "chronos", "n_tokens": 259, "low": -10, "high": 10})
    assert small.vocab_size == 259 and small.to_dict()["low"] == -10.0
    with raises_naming(TokenizerError, "'x1'", "line 2", "not a number"):
        tokenizer.encode("1 2\n3 x1\n")


def test_ucr_files_read_alike_in_ram_and_prepared_each_series_a_document(tmp_path):
    series, labels = two_classes(30)
    ucr_ts(tmp_path / "train.ts", series, labels)
    in_ram = load_corpus(str(tmp_path / "train.ts"), "chronos")
    prepare_corpus(str(tmp_path / "train.ts"), "chronos", str(tmp_path / "prep"), progress=False)
    prepared = load_prepared(str(tmp_path / "prep"), "chronos")
    whole = np.concatenate([in_ram.train, in_ram.valid, in_ram.test])
    expected = np.concatenate([np.append(scale_encode(in_ram.tokenizer, s.round(6))[0], EOS) for s in series])[:-1]
    assert np.array_equal(whole, expected)
    for split in ("train", "valid", "test"):
        assert np.array_equal(np.asarray(prepared.split(split)), in_ram.split(split))
    docs = in_ram.doc_ids["train"][0 : len(in_ram.train)]
    assert docs[0] == 0 and docs[-1] == np.count_nonzero(in_ram.train == EOS)
    tsv = tmp_path / "train.tsv"
    tsv.write_text("".join(label + "\t" + "\t".join(f"{v:.6f}" for v in s) + "\n" for s, label in zip(series, labels)))
    assert np.array_equal(
        np.concatenate([load_corpus(str(tsv), "chronos").split(s) for s in ("train", "valid", "test")]), whole
    )


def test_missing_values_wrong_lengths_and_many_dimensions_are_named(tmp_path):
    series, labels = two_classes(6)
    path = tmp_path / "bad.ts"
    ucr_ts(path, series, labels)
    lines = path.read_text().split("\n")
    first = lines.index("@data") + 1
    for change, words in (
        (
            lambda row: row.replace(",", ",?,", 1).rsplit(",", 2)[0] + ":1",
            ("bad.ts", f"line {first + 2}", "value 2", "missing"),
        ),
        (lambda row: row.split(",", 1)[1], ("bad.ts", f"line {first + 2}", "39 values", "@seriesLength 40")),
        (lambda row: row.replace(":", ":" + row.split(":")[0] + ":", 1), ("bad.ts", f"line {first + 2}", "dimensions")),
        (lambda row: "1.0,NaN," + row.split(",", 2)[2], ("bad.ts", f"line {first + 2}", "value 2", "missing")),
    ):
        broken = list(lines)
        broken[first + 1] = change(lines[first + 1])
        path.write_text("\n".join(broken))
        with raises_naming(CorpusError, *words):
            load_corpus(str(path), "chronos")
        with raises_naming(TaskDataError, *words):
            read_jsonl(str(path), "classify")


def test_a_ucr_file_is_classify_records_and_a_classifier_trains_on_it(tmp_path, capsys):
    series, labels = two_classes(24)
    ucr_ts(tmp_path / "train.ts", series, labels)
    records = read_jsonl(str(tmp_path / "train.ts"), "classify")
    assert [r["label"] for r in records] == labels and len(records[3]["text"].split()) == 40
    lm = tmp_path / "lm"
    cli_json(["train", "--data", str(tmp_path / "train.ts"), "--out", str(lm), "--json", *TINY_CLI_8,
              "tokenizer=chronos", "doc_reset=true"], capsys)  # fmt: skip
    result = cli_json(["finetune", "--task", "classify", "--checkpoint", str(lm), "--data", str(tmp_path / "train.ts"),
                       "--valid", str(tmp_path / "train.ts"), "--out", str(tmp_path / "clf"), "--json", "--quiet",
                       "--steps", "2", "--segment-len", "16", "--batch-size", "4"], capsys)  # fmt: skip
    assert result["labels"] == ["0", "1"] and 0.0 <= result["valid"]["accuracy"] <= 1.0
    predicted = cli_json(["predict", "--checkpoint", str(tmp_path / "clf"), "--data", str(tmp_path / "train.ts"),
                          "--out", str(tmp_path / "pred.jsonl"), "--json", "--quiet"], capsys)  # fmt: skip
    assert predicted["accuracy"] == pytest.approx(result["valid"]["accuracy"])  # the same series, the same model


def test_forecast_quantiles_are_ordered_on_the_contexts_scale_and_reproducible():
    tokenizer = ChronosTokenizer(n_tokens=259, low=-15, high=15)
    model = tiny_model(vocab_size=tokenizer.vocab_size, mem_len=32)
    context = 1000.0 + 50.0 * np.sin(np.linspace(0, 6, 48))
    draw = lambda seed: forecast(model, tokenizer, context, 12, num_samples=16, segment_len=16,  # noqa: E731
                                 generator=torch.Generator().manual_seed(seed))  # fmt: skip
    out = draw(0)
    assert out["samples"].shape == (16, 12) and out["scale"] == pytest.approx(np.abs(context).mean())
    q = out["quantiles"]
    assert np.all(q[0.1] <= q[0.5]) and np.all(q[0.5] <= q[0.9]) and np.allclose(q[0.5], out["median"])
    grid = tokenizer.centers * out["scale"]
    assert np.all(np.isin(out["samples"], grid))  # every draw is a bin's centre times the scale: no PAD or EOS
    assert np.array_equal(draw(0)["samples"], out["samples"]) and not np.array_equal(draw(1)["samples"], out["samples"])
    with pytest.raises(TypeError, match="chronos"):
        forecast(model, build_tokenizer("byte", ""), context, 4)
