"""The FASTA reader (``longseq/data/readers/fasta.py``) on small generated files: its text is every record's
sequence a line, as written (soft-masked lowercase and runs of N kept), gzipped or not, in every layout; the corpus
in RAM and the prepared one hold the same ids; bad files (no record, text before the first header, an empty
sequence, a letter outside the alphabet) are refused naming the file and its own line."""

from __future__ import annotations

import gzip
import sys

import numpy as np
import pytest
from support import raises_naming

from longseq.data import load_corpus, load_prepared, prepare_corpus
from longseq.data.readers import READERS, Tap, reader_for
from longseq.data.sources import CorpusError, resolve_source
from longseq.data.tokenizers import NucleotideTokenizer

pytest.importorskip("Bio")


def genome(seed: int, n_records: int = 3, length: int = 700) -> list[tuple[str, str]]:
    """Records of random bases, each with a soft-masked (lowercase) stretch and a run of N."""
    rng = np.random.default_rng(seed)
    out = []
    for r in range(n_records):
        bases = list(rng.choice(list("ACGT"), size=length))
        start = int(rng.integers(0, length - 100))
        bases[start : start + 60] = [b.lower() for b in bases[start : start + 60]]
        bases[start + 70 : start + 90] = "N" * 20
        out.append((f"chr{r} test record {r}", "".join(bases)))
    return out


def fasta_text(records, width: int = 60, newline: str = "\n") -> str:
    """The records as a FASTA file: a header, the sequence wrapped at ``width``, a blank line between records."""
    parts = []
    for title, seq in records:
        lines = [seq[i : i + width] for i in range(0, len(seq), width)]
        parts.append(newline.join([f">{title}", *lines]) + newline + newline)
    return "".join(parts)


def write(path, text: str) -> str:
    if str(path).lower().endswith(".gz"):
        with gzip.open(path, "wt", newline="") as f:
            f.write(text)
    else:
        path.write_text(text, newline="")
    return str(path)


def read_text(path: str) -> str:
    reader = reader_for(path)
    with open(path, "rb") as f:
        return "".join(reader.text_blocks(path, Tap(f)))


@pytest.mark.parametrize("name", ["g.fa", "g.fasta", "g.fna", "g.faa", "g.fa.gz", "g.fasta.gz", "G.FNA.GZ"])
def test_every_ending_reads_the_records_one_a_line_as_written(tmp_path, name):
    records = genome(0)
    path = write(tmp_path / name, fasta_text(records, width=61, newline="\r\n"))
    assert reader_for(path).name == "fasta"
    text = read_text(path)
    assert text == "\n".join(seq for _, seq in records)  # lowercase and N kept; no header, no line break
    assert READERS["fasta"]().text_bytes(path) == len(text.encode())


def test_a_single_file_gives_the_same_ids_in_ram_and_prepared_split_by_position(tmp_path):
    records = genome(1, n_records=4, length=2000)
    path = write(tmp_path / "genome.fa.gz", fasta_text(records))
    expected = NucleotideTokenizer().encode("\n".join(seq for _, seq in records))
    in_ram = load_corpus(path, "nucleotide")
    prepare_corpus(path, "nucleotide", str(tmp_path / "prepared"), progress=False)
    prepared = load_prepared(str(tmp_path / "prepared"), "nucleotide")
    for corpus in (in_ram, prepared):
        ids = [np.asarray(corpus.split(s)) for s in ("train", "valid", "test")]
        assert np.array_equal(np.concatenate(ids), expected)
        assert len(ids[0]) == int(len(expected) * 0.9) and len(ids[1]) == int(len(expected) * 0.05)  # the tail: test


def test_a_layout_of_gzipped_splits(tmp_path):
    texts = {}
    for i, split in enumerate(("train", "valid", "test")):
        records = genome(10 + i, n_records=2, length=300)
        write(tmp_path / f"{split}.fa.gz", fasta_text(records))
        texts[split] = "\n".join(seq for _, seq in records)
    (tmp_path / "notes.txt").write_text("not read")
    assert resolve_source(str(tmp_path)).kind == "layout"
    corpus = load_corpus(str(tmp_path), "nucleotide_cased")
    for split, text in texts.items():
        assert corpus.tokenizer.decode(corpus.split(split)) == text  # the soft mask kept


def test_a_protein_record_fed_to_nucleotide_is_named_at_the_files_line_and_column(tmp_path):
    records = genome(2, n_records=2, length=300)
    records.insert(1, ("sp|P1|protein", "ACGT" * 20 + "MKVLE" + "ACGT" * 10))  # 'M' is residue 81
    path = write(tmp_path / "mixed.fa", fasta_text(records, width=50))
    # record 2's header is line 9 (record 1: header, 6 lines, a blank line); residue 81 is on its 2nd line, column 31
    for read in (
        lambda: load_corpus(path, "nucleotide"),
        lambda: prepare_corpus(path, "nucleotide", str(tmp_path / "prepared"), progress=False),
    ):
        with raises_naming(CorpusError, "mixed.fa", "line 11, column 31", "'M'", "sp|P1|protein", "A, C, G, T and N"):
            read()
    assert not (tmp_path / "prepared").exists()


@pytest.mark.parametrize(
    "text, words",
    [
        ("", ["no FASTA records"]),
        ("\n\n", ["no FASTA records"]),
        ("ACGTACGT\nACGT\n", ["line 1", "before the first FASTA header"]),
        ("\nsome notes\n>r\nACGT\n", ["line 2", "before the first FASTA header", "some notes"]),
        (">a\nACGT\n>b empty\n>c\nAC\n", ["line 3", "record 2", "'b'", "empty sequence"]),
        (">a\nACGT\n>last\n\n", ["line 3", "'last'", "empty sequence"]),
    ],
)
def test_bad_files_are_refused_by_name_with_the_file_and_line(tmp_path, text, words):
    for name in ("bad.fa", "bad.fa.gz"):
        path = write(tmp_path / name, text)
        with raises_naming(CorpusError, name, *words):
            load_corpus(path, "nucleotide")


def test_without_biopython_the_error_names_the_extra(tmp_path, monkeypatch):
    path = write(tmp_path / "g.fa", fasta_text(genome(3)))
    monkeypatch.setitem(sys.modules, "Bio.SeqIO.FastaIO", None)  # an import of it fails
    with raises_naming(CorpusError, "Biopython", "longseq[genomes]"):
        load_corpus(path, "nucleotide")
