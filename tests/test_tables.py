"""Table files (parquet, arrow, JSON lines) as corpora, through ``datasets``: a table's text column is read as the
plain text file of its rows joined by newlines, streamed in batches."""

from __future__ import annotations

import json

import numpy as np
import pytest

datasets = pytest.importorskip("datasets")

from longseq.cli import main  # noqa: E402
from longseq.data import tables  # noqa: E402
from longseq.data.corpus import load_corpus  # noqa: E402
from longseq.data.prepared import prepare_corpus  # noqa: E402
from longseq.data.sources import CorpusError  # noqa: E402

ROWS = [
    "the cat sat on the mat .",
    "",
    "naïve café — ünïcödé ✓ rows",
    "a row with\nits own line break",
    *[f"row {i} of the table: {'abc ' * (i % 7)}" for i in range(300)],
]


def write_table(path, rows, fmt: str, extra=True) -> str:
    columns = {"text": rows, **({"id": list(range(len(rows)))} if extra else {})}
    table = datasets.Dataset.from_dict(columns)
    if fmt == "parquet":
        out = path / "corpus.parquet"
        table.to_parquet(str(out))
    elif fmt == "jsonl":
        out = path / "corpus.jsonl"
        out.write_text("".join(json.dumps(dict(zip(columns, v))) + "\n" for v in zip(*columns.values())))
    else:
        table.save_to_disk(str(path / "saved"))
        out = next((path / "saved").glob("*.arrow"))
    return str(out)


def prepared_ids(out: str) -> dict:
    return {s: np.fromfile(f"{out}/{s}.bin", dtype=json.load(open(f"{out}/index.json"))["dtype"]) for s in
            ("train", "valid", "test")}  # fmt: skip


@pytest.mark.parametrize("fmt,spec", [("parquet", "byte"), ("arrow", "char"), ("jsonl", "word"), ("parquet", "bpe")])
def test_a_prepared_table_is_its_text_as_a_plain_file(tmp_path, monkeypatch, fmt, spec):
    """``data prepare`` on a table gives the ids and tokenizer of the plain file holding its rows joined by
    newlines; read in batches of 7 rows and blocks of 50 characters, so that batches and blocks end mid-text."""
    monkeypatch.setattr(tables, "BATCH_ROWS", 7)
    monkeypatch.setattr(tables, "BLOCK_CHARS", 50)
    table = write_table(tmp_path, ROWS, fmt)
    (tmp_path / "plain.txt").write_text("\n".join(ROWS), encoding="utf-8")
    vocab = {"vocab_size": 300} if spec == "bpe" else {}
    prepare_corpus(table, spec, str(tmp_path / "from_table"), progress=False, **vocab)
    prepare_corpus(str(tmp_path / "plain.txt"), spec, str(tmp_path / "from_text"), progress=False, **vocab)
    for split, ids in prepared_ids(str(tmp_path / "from_table")).items():
        assert np.array_equal(ids, prepared_ids(str(tmp_path / "from_text"))[split]), split
    a, b = (tmp_path / "from_table" / "tokenizer.json"), (tmp_path / "from_text" / "tokenizer.json")
    assert a.read_text() == b.read_text()
    in_ram = load_corpus(table, spec, vocab_size=vocab.get("vocab_size"))  # the in-RAM reader agrees
    assert np.array_equal(in_ram.train, prepared_ids(str(tmp_path / "from_text"))["train"])
    index = json.loads((tmp_path / "from_table" / "index.json").read_text())["source"]
    assert index["readers"] == ["table"] and index["column"] == "text"


def test_the_table_is_read_in_batches_of_bounded_size(tmp_path, monkeypatch):
    """Streaming: the table is a streaming dataset read ``BATCH_ROWS`` rows at a time, and no text block is
    longer than ``BLOCK_CHARS`` plus one row (what the prepare pass holds at once)."""
    table = write_table(tmp_path, ROWS, "parquet")
    monkeypatch.setattr(tables, "BLOCK_CHARS", 64)
    assert isinstance(tables.open_table(table, ["text"]), datasets.IterableDataset)
    batches = list(tables.table_batches(table, ["text"], batch_rows=16))
    sizes = [len(b["text"]) for b in batches]
    assert sum(sizes) == len(ROWS) and set(sizes[:-1]) == {16} and 0 < sizes[-1] <= 16
    longest_row = max(len(r) for r in ROWS)
    blocks = list(tables.text_blocks(table, "text"))
    assert "".join(blocks) == "\n".join(ROWS) and max(len(b) for b in blocks) <= 64 + longest_row + 1


def test_other_columns_and_bad_values_are_named(tmp_path, capsys):
    table = write_table(tmp_path, ROWS, "parquet")
    with pytest.raises(CorpusError, match="no column 'body'; its columns are text, id"):
        prepare_corpus(table, "byte", str(tmp_path / "out"), progress=False, text_column="body")
    numbers = tmp_path / "numbers.jsonl"
    numbers.write_text('{"text": "fine"}\n{"text": 12}\n')
    with pytest.raises(CorpusError, match=r"row 2: column 'text' holds int"):
        load_corpus(str(numbers), "byte")
    table = write_table(tmp_path, [f"line {i}" for i in range(50)], "parquet", extra=False)
    args = ["data", "prepare", "--data", table, "--tokenizer", "byte", "--out", str(tmp_path / "p"), "--json",
            "--quiet", "--text-column", "nope"]  # fmt: skip
    assert main(args) == 2
    assert "its columns are text" in capsys.readouterr().err
    assert main([*args[:-1], "text"]) == 0


def test_task_files_may_be_tables_with_their_own_column_names(tmp_path):
    """A classification task read from parquet or arrow, with its text and label under other names, is the task
    read from the JSON lines of the usual names: the same records, labels and encoded documents."""
    from longseq.config import DataConfig, ModelConfig, RunConfig, TrainConfig
    from longseq.config.run import TaskConfig
    from longseq.data.tasks import TaskDataError, read_jsonl
    from longseq.data.tokenizers import ByteTokenizer
    from longseq.tasks.classify import Classify

    rows = {"review": [f"text number {i} " * (i % 4 + 1) for i in range(40)], "stars": [i % 3 for i in range(40)]}
    usual = tmp_path / "usual.jsonl"
    usual.write_text("".join(json.dumps({"text": t, "label": s}) + "\n" for t, s in zip(*rows.values())))
    datasets.Dataset.from_dict(rows).to_parquet(str(tmp_path / "t.parquet"))
    datasets.Dataset.from_dict(rows).save_to_disk(str(tmp_path / "saved"))
    columns = {"text": "review", "label": "stars"}

    def task(path, **names):
        config = ModelConfig(vocab_size=256, n_layer=1, d_model=16, n_head=2, d_head=8, d_inner=32)
        options = TaskConfig(name="classify", train=str(path), **names)
        prepared = Classify(RunConfig(config, DataConfig(tokenizer="byte"), TrainConfig(), options),
                                ByteTokenizer())  # fmt: skip
        prepared.prepare()
        return prepared

    expected = task(usual)
    for table in (tmp_path / "t.parquet", next((tmp_path / "saved").glob("*.arrow"))):
        records = read_jsonl(str(table), "classify", columns)
        assert [(r["text"], r["label"]) for r in records] == [(r["text"], r["label"]) for r in read_jsonl(str(usual),
                                                                                                         "classify")]  # fmt: skip
        from longseq.cli.predict import read_records

        predicted = read_records(str(table), {"text": "review", "label": "stars"})
        assert [(r["text"], r["label"]) for r in predicted] == [(t, s) for t, s in zip(*rows.values())]
        read = task(table, text_column="review", label_column="stars")
        assert read.options.labels == expected.options.labels and read.train_docs == expected.train_docs
    with pytest.raises(TaskDataError, match="no column 'label'; its columns are review, stars"):
        read_jsonl(str(tmp_path / "t.parquet"), "classify", {"text": "review"})
    with pytest.raises(
        TaskDataError,
        match=r"usual.jsonl:1: missing field 'body' \(the task's 'text'\) for task mlm; the record has text, label",
    ):
        read_jsonl(str(usual), "mlm", {"text": "body"})


@pytest.mark.parametrize("damage", ["truncated", "corrupt"])
@pytest.mark.parametrize("command", ["train", "prepare"])
def test_a_damaged_compressed_table_is_named_without_a_traceback(tmp_path, capsys, damage, command):
    """A truncated ``.jsonl.gz`` corpus was a raw ``EOFError`` traceback (gzip's, from inside datasets)."""
    import gzip

    rows = "".join(json.dumps({"text": f"line {i} of the corpus, with some words in it"}) + "\n" for i in range(4000))
    data = bytearray(gzip.compress(rows.encode()))
    if damage == "truncated":
        data = data[: len(data) // 2]
    else:
        data[len(data) // 2 : len(data) // 2 + 64] = bytes(64)  # zeros in the middle of the deflate stream
    path = tmp_path / "corpus.jsonl.gz"
    path.write_bytes(bytes(data))
    out = str(tmp_path / "out")
    argv = (["train", "--data", str(path), "--tokenizer", "char", "--out", out, "--quiet", "--set", "max_steps=1"]
            if command == "train" else ["data", "prepare", "--data", str(path), "--tokenizer", "char", "--out", out])  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "corpus.jsonl.gz" in err and "Traceback" not in err, err


@pytest.mark.parametrize("where", [2, 1500])  # in the first batch (read for the column names) and far after it
@pytest.mark.parametrize("gz", [False, True])
def test_a_byte_that_is_not_utf8_names_its_row_and_file(tmp_path, capsys, where, gz):
    """A .jsonl corpus with byte 0xff said "'utf-8' codec can't decode byte 0xff in position 4" (a position in a
    block the reader took) and no row: the error names the file, the row, the byte and its column, through the
    library and the command line, compressed or not."""
    import gzip

    lines = [json.dumps({"text": f"row {i} is fine"}).encode() for i in range(2000)]
    lines[where - 1] = b'{"text": "caf\xff au lait"}'
    data = b"\n".join(lines) + b"\n"
    path = tmp_path / ("corpus.jsonl.gz" if gz else "corpus.jsonl")
    path.write_bytes(gzip.compress(data) if gz else data)
    with pytest.raises(CorpusError) as caught:
        load_corpus(str(path), "char")
    for word in (str(path), f"row {where}", "0xff", "column 14", "UTF-8"):
        assert word in str(caught.value), caught.value
    assert main(["data", "prepare", "--data", str(path), "--tokenizer", "char", "--out", str(tmp_path / "p")]) == 2
    err = capsys.readouterr().err
    assert f"row {where}" in err and str(path) in err and "Traceback" not in err
