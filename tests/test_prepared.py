"""Prepared corpora: the same ids, batches and losses as the in-RAM path, read by memory map; exact resume; bounded
memory while preparing; every damaged or mismatched file is an error naming it; ``longseq data prepare`` reports
files, bytes and tokens off a terminal."""

import json
import os
import tracemalloc

import numpy as np
import pytest
from support import raises_naming

from longseq import DataConfig, ModelConfig, RunConfig, TrainConfig
from longseq.api import train
from longseq.data import CorpusError, DocumentIds, OrderedStream, load_corpus, prepare_corpus, unigram_bits_per_token
from longseq.data import prepared as prepared_module
from longseq.data.readers import base as reader_base

SPECS = ["byte", "char", "word", "bpe"]
SHAKESPEARE = os.path.join(os.path.dirname(__file__), "..", "longseq", "data", "corpora", "tinyshakespeare.txt")


def shakespeare(n: int) -> str:
    with open(SHAKESPEARE, encoding="utf-8") as f:
        return f.read(n)


def write_sources(root) -> dict[str, str]:
    """A directory of documents (unicode, blank lines, a document without a final newline), a WikiText-style
    layout and a single file."""
    text = shakespeare(60_000)
    docs = root / "docs"
    docs.mkdir()
    for i in range(4):
        (docs / f"d{i}.txt").write_text(text[i * 9000 : (i + 1) * 9000] + "\nnaïve café — 東京 😀\n" * i)
    layout = root / "layout"
    layout.mkdir()
    for split, (a, b) in {"train": (0, 40_000), "valid": (40_000, 50_000), "test": (50_000, 60_000)}.items():
        (layout / f"wiki.{split}.tokens").write_text(text[a:b])
    (root / "one.txt").write_text(text[:30_000] + "ünïcode tail without newline")
    return {"documents": str(docs), "layout": str(layout), "file": str(root / "one.txt")}


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    return write_sources(tmp_path_factory.mktemp("sources"))


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks and batches far smaller than lines and documents, so every carry across blocks is exercised."""
    monkeypatch.setattr(reader_base, "BLOCK_BYTES", 777)
    monkeypatch.setattr(prepared_module, "BATCH_CHARS", 1000)
    monkeypatch.setattr(prepared_module, "CHUNK_TOKENS", 999)


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("kind", ["documents", "layout", "file"])
def test_a_prepared_corpus_holds_the_in_ram_ids(tmp_path, sources, small_blocks, kind, spec):
    out = tmp_path / "prepared"
    summary = prepare_corpus(sources[kind], spec, str(out), vocab_size=300, progress=False)
    in_ram = load_corpus(sources[kind], spec, vocab_size=300)
    mapped = load_corpus(str(out), spec, vocab_size=300)
    assert mapped.tokenizer.to_dict() == in_ram.tokenizer.to_dict()
    for split in ("train", "valid", "test"):
        assert isinstance(mapped.split(split), np.memmap) and mapped.split(split).dtype == np.dtype("<u2")
        assert np.array_equal(mapped.split(split), in_ram.split(split)), split
        assert summary[f"{split}_tokens"] == len(in_ram.split(split))
    assert (mapped.doc_ids is None) == (in_ram.doc_ids is None) == (kind != "documents")
    if kind == "documents":
        for split in ("train", "valid", "test"):
            assert np.array_equal(mapped.doc_ids[split][:], in_ram.doc_ids[split])
    assert sorted(os.listdir(out)) == ["index.json", "test.bin", "tokenizer.json", "train.bin", "valid.bin"]
    size = in_ram.tokenizer.vocab_size
    assert unigram_bits_per_token(mapped.train, mapped.valid, size) == pytest.approx(
        unigram_bits_per_token(in_ram.train, in_ram.valid, size), rel=1e-12
    )


def test_a_vocabulary_over_65536_tokens_is_stored_as_uint32(tmp_path):
    words = " ".join(f"w{i}" for i in range(70_000))
    (tmp_path / "big.txt").write_text((words + "\n") * 2)
    prepare_corpus(str(tmp_path / "big.txt"), "word", str(tmp_path / "out"), progress=False)
    with open(tmp_path / "out" / "index.json") as f:
        assert json.load(f)["dtype"] == "uint32"
    mapped = load_corpus(str(tmp_path / "out"), "word")
    assert mapped.train.dtype == np.dtype("<u4") and int(mapped.train.max()) >= 65_536
    assert np.array_equal(mapped.train, load_corpus(str(tmp_path / "big.txt"), "word").train)


def test_document_ids_are_the_full_arrays_slices():
    starts = np.array([0, 3, 3, 10, 11])  # document 1 is empty
    full = np.repeat(np.arange(5), np.diff([*starts, 15]))
    ids = DocumentIds(starts, offset=2, length=12)
    assert len(ids) == 12 and np.array_equal(ids[:], full[2:14])
    assert np.array_equal(ids[4:9], full[6:11]) and np.array_equal(ids[-3:], full[11:14])


def test_memory_mapped_batches_equal_in_ram_batches_and_ranks_read_their_rows(tmp_path):
    ids = np.random.default_rng(0).integers(0, 60_000, size=10_007).astype(np.uint16)
    ids.tofile(tmp_path / "ids.bin")
    mapped = np.memmap(tmp_path / "ids.bin", dtype=np.uint16, mode="r")
    docs = np.repeat(np.arange(11), 910)[: len(ids)]
    a = OrderedStream(ids.astype(np.int64), 6, 37, varlen=True, seed=5, doc_ids=docs)
    b = OrderedStream(mapped, 6, 37, varlen=True, seed=5, doc_ids=DocumentIds(np.arange(0, 10_010, 910), 0, len(ids)))
    rank = OrderedStream(mapped, 6, 37, varlen=True, seed=5, rows=slice(2, 4))
    full = a.data.numpy()
    assert full.shape == (6, 10_007 // 6) and np.array_equal(full[1], ids[1667:3334])
    for _ in range(400):  # several epochs
        sa, sb, sr = a.next_segment(), b.next_segment(), rank.next_segment()
        assert np.array_equal(sa.input_ids, sb.input_ids) and np.array_equal(sa.labels, sb.labels)
        assert np.array_equal(sa.doc_ids, sb.doc_ids) and sa.new_epoch == sb.new_epoch
        assert np.array_equal(sr.input_ids, sa.input_ids[2:4]) and np.array_equal(sr.labels, sa.labels[2:4])


def bpe_run(path=None, **train_overrides) -> RunConfig:
    return RunConfig(
        model=ModelConfig(
            n_layer=2, d_model=16, n_head=2, d_head=8, d_inner=32, dropout=0.1, mem_len=8, cutoffs=[40, 120]
        ),
        data=DataConfig(path=path, tokenizer="bpe", vocab_size=300, tgt_len=8, batch_size=4, eval_tgt_len=8,
                        eval_batch_size=2, varlen=True, doc_reset=True),
        train=TrainConfig(max_steps=12, lr=3e-3, warmup_steps=2, eval_interval=5, eval_max_segments=6,
                          log_interval=1, **train_overrides),
    )  # fmt: skip


def test_training_on_a_prepared_corpus_gives_the_in_ram_losses_and_resumes_bit_for_bit(tmp_path, sources):
    """BPE with frequency-ordered ids under an adaptive softmax, documents kept apart (doc_reset)."""
    prepare_corpus(sources["documents"], "bpe", str(tmp_path / "prep"), vocab_size=300, progress=False)
    in_ram = load_corpus(sources["documents"], "bpe", vocab_size=300)
    a = train(bpe_run(), str(tmp_path / "ram"), corpus=in_ram, progress=False)
    b = train(bpe_run(str(tmp_path / "prep")), str(tmp_path / "mapped"), progress=False)  # the loop reads the path
    assert len(a.losses) == 12 and a.losses == b.losses and a.valid["loss"] == b.valid["loss"]
    first = train(bpe_run(str(tmp_path / "prep")), str(tmp_path / "split"), progress=False, stop_after=5)
    second = train(bpe_run(str(tmp_path / "prep")), str(tmp_path / "split"), progress=False, resume=True)
    assert first.losses + second.losses == b.losses  # bit for bit


@pytest.mark.parametrize("spec", ["char", "word", "bpe"])
def test_preparing_holds_a_bounded_amount_of_memory(tmp_path, monkeypatch, spec):
    """Python-side peak memory (numpy included) of preparing a 4x larger corpus grows far less than 4x."""
    monkeypatch.setattr(reader_base, "BLOCK_BYTES", 1 << 16)
    monkeypatch.setattr(prepared_module, "BATCH_CHARS", 1 << 16)
    monkeypatch.setattr(prepared_module, "CHUNK_TOKENS", 1 << 16)
    text = shakespeare(250_000)
    peaks = []
    for repeat in (1, 4):
        (tmp_path / f"x{repeat}.txt").write_text(text * repeat)
        tracemalloc.start()
        prepare_corpus(str(tmp_path / f"x{repeat}.txt"), spec, str(tmp_path / f"out{repeat}"), vocab_size=300,
                       progress=False)  # fmt: skip
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
    assert peaks[1] < 1.3 * peaks[0], peaks


def damage(directory, name, how):
    path = os.path.join(directory, name)
    if how == "truncate":
        os.truncate(path, os.path.getsize(path) - 2)
    elif how == "flip":
        with open(path, "r+b") as f:
            f.seek(10)
            byte = f.read(1)
            f.seek(10)
            f.write(bytes([byte[0] ^ 1]))
    elif how == "delete":
        os.remove(path)


@pytest.mark.parametrize(
    "name,how,words",
    [
        ("train.bin", "truncate", ("train.bin", "truncated")),
        ("valid.bin", "flip", ("valid.bin", "sha256")),
        ("test.bin", "delete", ("test.bin", "missing")),
        ("tokenizer.json", "flip", ("tokenizer.json", "index.json")),
        ("tokenizer.json", "delete", ("tokenizer.json", "missing")),
        ("index.json", "flip", ("index.json", "prepared-corpus index")),
    ],
)
def test_damaged_files_are_errors_naming_the_file(tmp_path, sources, name, how, words):
    out = str(tmp_path / "prep")
    prepare_corpus(sources["layout"], "char", out, progress=False)
    damage(out, name, how)
    with raises_naming(CorpusError, *words):
        load_corpus(out, "char")


def test_an_index_that_does_not_fit_its_files_is_an_error(tmp_path, sources):
    out = tmp_path / "prep"
    prepare_corpus(sources["documents"], "char", str(out), progress=False)
    index = json.loads((out / "index.json").read_text())
    for edit, message in [
        (lambda i: i["splits"]["valid"].update(tokens=i["splits"]["valid"]["tokens"] + 1), "do not fit together"),
        (lambda i: i.update(documents=[0, 50, 20]), "document starts"),
        (lambda i: i.update(dtype="int8"), "unknown dtype"),
        (lambda i: i.update(vocab_size=7), "tokenizer.json has .* tokens, .*index.json says 7"),
        (lambda i: i.update(format="other"), "format 'other'"),
    ]:
        changed = json.loads(json.dumps(index))
        edit(changed)
        (out / "index.json").write_text(json.dumps(changed))
        with pytest.raises(CorpusError, match=message):
            load_corpus(str(out), "char")


def test_a_prepared_corpus_must_match_the_runs_tokenizer(tmp_path, sources):
    out = str(tmp_path / "prep")
    prepare_corpus(sources["file"], "bpe", out, vocab_size=300, progress=False)
    with raises_naming(CorpusError, "tokenizer=bpe", "vocab_size=300", "tokenizer=char"):
        load_corpus(out, "char")
    with pytest.raises(CorpusError, match=r"vocab_size=8192"):
        load_corpus(out, "bpe", vocab_size=8192)
    other = load_corpus(sources["file"], "char").tokenizer
    with raises_naming(CorpusError, "tokenizer.json", "model's tokenizer"):
        load_corpus(out, "char", tokenizer=other)
    own = load_corpus(out, "bpe").tokenizer  # a checkpoint's tokenizer evaluates the corpus it was prepared with
    assert load_corpus(out, own.kind, tokenizer=own).tokenizer.to_dict() == own.to_dict()
    own.save(str(tmp_path / "own.json"))
    assert len(load_corpus(out, str(tmp_path / "own.json")).train) > 0


def test_prepare_refuses_a_non_empty_output_and_leaves_nothing_when_it_fails(tmp_path, sources):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(CorpusError, match="not empty"):
        prepare_corpus(sources["file"], "char", str(tmp_path / "full"), progress=False)
    (tmp_path / "bad.txt").write_bytes(b"fine text\n" * 100 + b"caf\xe9\n")
    with raises_naming(CorpusError, "bad.txt", "UTF-8", "byte 1003"):
        prepare_corpus(str(tmp_path / "bad.txt"), "char", str(tmp_path / "out"), progress=False)
    assert sorted(os.listdir(tmp_path)) == ["bad.txt", "full"]  # no half-written directory


def test_the_command_line_prepares_trains_and_evaluates_on_a_prepared_corpus(tmp_path, sources, capsys):
    from longseq.cli import main
    from longseq.train.checkpoint import load_checkpoint_config

    prep, run = str(tmp_path / "prep"), str(tmp_path / "run")
    argv = ["data", "prepare", "--data", sources["file"], "--tokenizer", "bpe", "--vocab-size", "300"]
    assert main([*argv, "--out", prep, "--json", "--quiet"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["vocab_size"] == 300 and summary["dtype"] == "uint16" and summary["train_tokens"] > 0
    tiny = ["--set", "max_steps=3", "eval_interval=3", "eval_max_segments=2", "n_layer=1", "d_model=16", "n_head=2",
            "d_head=8", "d_inner=32", "batch_size=2", "tgt_len=8", "eval_tgt_len=8", "eval_batch_size=2"]  # fmt: skip
    assert main(["train", "--data", prep, "--out", run, "--json", "--quiet", *tiny]) == 0  # no --tokenizer needed
    capsys.readouterr()
    data = load_checkpoint_config(os.path.join(run, "last")).data
    assert (data.path, data.tokenizer, data.vocab_size) == (prep, "bpe", 300)
    assert main(["eval", "--checkpoint", os.path.join(run, "best"), "--data", prep, "--json", "--quiet"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["tokens"] > 0
    for argv, message in [
        (["train", "--data", prep, "--tokenizer", "char", "--out", run + "-char"], "prepared with tokenizer=bpe"),
        (["data", "prepare", "--data", sources["file"], "--out", str(tmp_path / "x")], "needs --tokenizer"),
        (["data", "prepare", "--tokenizer", "bpe", "--vocab-size", "10", "--out", str(tmp_path / "x")], "vocab_size"),
    ]:
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err


def test_invalid_utf8_is_reported_at_its_byte_across_block_boundaries(tmp_path, monkeypatch):
    monkeypatch.setattr(reader_base, "BLOCK_BYTES", 777)
    for data, where in [(b"a" * 776 + b"\xc3" + b"A" * 100, 776), (b"a" * 2000 + b"\xe2\x82", 2000)]:
        (tmp_path / "bad.txt").write_bytes(data)
        with raises_naming(CorpusError, "bad.txt", "UTF-8", f"byte {where}:"):
            prepare_corpus(str(tmp_path / "bad.txt"), "char", str(tmp_path / "out"), progress=False)
        with raises_naming(CorpusError, "bad.txt", "UTF-8", f"byte {where}:"):
            load_corpus(str(tmp_path / "bad.txt"), "char")


def test_data_prepare_reports_files_bytes_and_tokens_off_a_terminal(tmp_path, capsys):
    from longseq.cli import main

    corpus = tmp_path / "text.txt"
    corpus.write_text("hello world\n" * 500)
    assert main(["data", "prepare", "--data", str(corpus), "--tokenizer", "char", "--out", str(tmp_path / "p"),
                 "--json"]) == 0  # fmt: skip
    captured = capsys.readouterr()
    summary = json.loads(captured.out.splitlines()[-1])
    tokens = summary["train_tokens"] + summary["valid_tokens"] + summary["test_tokens"]
    lines = captured.err.splitlines()
    assert any(line.startswith("fit char: 6.0 kB of 6.0 kB (100%) | files 1/1") for line in lines)
    assert f"encode: 6.0 kB of 6.0 kB (100%) | files 1/1 | tokens {tokens:,}" in captured.err
    assert sum("done in" in line for line in lines) == 2  # one closing line per pass
    assert main(["data", "prepare", "--data", str(corpus), "--tokenizer", "char", "--out", str(tmp_path / "q"),
                 "--json", "--quiet"]) == 0  # fmt: skip
    assert "encode" not in capsys.readouterr().err
    layout = tmp_path / "layout"  # a word vocabulary is fitted on the training file alone: the meter counts that one
    layout.mkdir()
    for split, lines in (("train", 400), ("valid", 50), ("test", 50)):
        (layout / f"{split}.txt").write_text("hello world\n" * lines)
    assert main(["data", "prepare", "--data", str(layout), "--tokenizer", "word", "--out", str(tmp_path / "w")]) == 0
    err = capsys.readouterr().err
    assert (
        "fit word: 4.8 kB of 4.8 kB (100%) | files 1/1" in err and "encode: 6.0 kB of 6.0 kB (100%) | files 3/3" in err
    )


def test_a_split_file_truncated_or_rewritten_under_a_stream_is_an_error_not_a_sigbus(tmp_path, sources):
    """Reading a memory map past a truncated file's end killed the process with SIGBUS (exit 135, no message); a
    file written over in place with other bytes of the same length would have been read as the old corpus."""
    import time

    from longseq.data.sources import CorpusChangedError

    prepare_corpus(sources["file"], "char", str(tmp_path / "prep"), progress=False)
    path = tmp_path / "prep" / "train.bin"
    original = path.read_bytes()
    for change, words in (
        (lambda f: f.truncate(len(original) // 3), ("train.bin", "truncated", f"{len(original):,} bytes")),
        (lambda f: f.write(original[::-1]), ("train.bin", "written to")),
    ):
        stream = OrderedStream(prepared_module.load_prepared(str(tmp_path / "prep")).train, 4, 16)
        first = stream.next_segment()
        assert np.array_equal(first.input_ids[0].numpy(), np.frombuffer(original, np.uint16)[:16])
        time.sleep(0.02)  # past the file system clock's tick, as any later copy is
        with open(path, "r+b") as f:
            change(f)
        with raises_naming(CorpusChangedError, *words):
            stream.next_segment()
        path.write_bytes(original)


def test_a_corpus_truncated_while_training_stops_with_a_save_that_resumes_bit_for_bit(tmp_path, sources):
    """Copying a new train.bin over the one a run reads (cp truncates it first) killed training with SIGBUS: no
    message, no save.  Now the run names the file, saves last/ at its last whole step, and once the file is back
    ``--resume`` ends where the uninterrupted run ends, loss for loss."""
    import signal
    import subprocess
    import sys

    from support import FAULT_CLI, assert_names, logged_steps, pause_when, step_losses

    from longseq.cli import main

    prepare_corpus(sources["file"], "char", str(tmp_path / "prep"), progress=False)
    settings = ["--data", str(tmp_path / "prep"), *FAULT_CLI, "max_steps=30"]
    assert main(["train", "--out", str(tmp_path / "whole"), *settings]) == 0
    path, out = tmp_path / "prep" / "train.bin", tmp_path / "cut"
    original = path.read_bytes()
    run = subprocess.Popen([sys.executable, "-m", "longseq", "train", "--out", str(out), *settings],
                           stderr=subprocess.PIPE, text=True)  # fmt: skip
    pause_when(lambda: logged_steps(out) >= 5, run)
    with open(path, "r+b") as f:
        f.truncate(len(original) // 2)  # what cp does first
    run.send_signal(signal.SIGCONT)
    err = run.communicate(timeout=300)[1]
    assert run.returncode == 2, (run.returncode, err[-1500:])  # not -SIGBUS
    assert_names(err, "train.bin", "truncated", "holds step", "--resume")
    assert "Traceback" not in err
    path.write_bytes(original)
    assert main(["train", "--out", str(out), "--resume", *settings]) == 0
    assert step_losses(out) == step_losses(tmp_path / "whole") and len(step_losses(out)) == 30
