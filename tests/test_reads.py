"""``longseq data reads`` (``longseq/data/reads.py``) on small generated genomes: every read is the genome's text
at the place it names (or its reverse complement), inside its split's part of its region, so no two splits share a
base; labels take turns; reads too full of N are drawn again; the same seed writes the same files; bad requests are
refused by name.  A classifier fine-tuned on the reads with reverse-complement augmentation runs through."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from support import TINY_CLI_8, cli_json, raises_naming

from longseq.data.readers import CorpusError
from longseq.data.reads import COMPLEMENT, write_reads

pytest.importorskip("Bio")


def genome_file(path, length: int = 40_000, seed: int = 0) -> str:
    rng = np.random.default_rng(seed)
    seq = list(rng.choice(list("ACGTacgt"), size=length))
    seq[1000:6000] = "N" * 5000  # a gap, as assemblies have
    text = "".join(seq)
    path.write_text(">chr7 made up\n" + "\n".join(text[i : i + 80] for i in range(0, length, 80)) + "\n")
    return text


def read_rows(directory) -> dict[str, list[dict]]:
    return {s: [json.loads(x) for x in (directory / f"{s}.jsonl").read_text().splitlines()] for s in ("train", "valid", "test")}  # fmt: skip


def test_reads_are_the_genome_at_their_place_and_the_splits_share_no_base(tmp_path):
    text = genome_file(tmp_path / "g.fa")
    sizes = {"train": 60, "valid": 12, "test": 12}
    summary = write_reads(str(tmp_path / "g.fa"), str(tmp_path / "out"), sizes, regions=2, lengths=(300, 900))
    assert summary["labels"] == ["chr7:0-20000", "chr7:20000-40000"]
    rows, covered = read_rows(tmp_path / "out"), {}
    for split, split_rows in rows.items():
        assert len(split_rows) == sizes[split]
        labels = [r["label"] for r in split_rows]
        assert labels.count(labels[0]) in (len(labels) // 2, -(-len(labels) // 2))  # the labels take turns
        covered[split] = set()
        for r in split_rows:
            _, start, stop, strand = re.fullmatch(r"g:chr7:(\d+)-(\d+)\(([+-])\)", r["source"]).group(0, 1, 2, 3)
            start, stop = int(start), int(stop)
            region = 0 if stop <= 20000 else 1
            assert r["label"] == summary["labels"][region] and 300 <= stop - start <= 900
            expected = text[start:stop] if strand == "+" else text[start:stop].translate(COMPLEMENT)[::-1]
            assert r["text"] == expected and r["text"].upper().count("N") <= 0.1 * len(expected)
            covered[split].update(range(start, stop))
    assert not covered["train"] & covered["valid"] and not covered["train"] & covered["test"]
    assert not covered["valid"] & covered["test"]
    strands = [r["source"][-2] for r in rows["train"]]
    assert 10 < strands.count("-") < 50  # both strands
    write_reads(str(tmp_path / "g.fa"), str(tmp_path / "again"), sizes, regions=2, lengths=(300, 900))
    assert read_rows(tmp_path / "again") == rows


def test_a_directory_is_labelled_by_file(tmp_path):
    (tmp_path / "genomes").mkdir()
    for i, name in enumerate(("ecoli.fa", "yeast.fasta")):
        genome_file(tmp_path / "genomes" / name, length=20_000, seed=i)
    summary = write_reads(str(tmp_path / "genomes"), str(tmp_path / "out"), {"train": 8, "valid": 2, "test": 2},
                          label_by="file", lengths=(200, 400))  # fmt: skip
    assert summary["labels"] == ["ecoli", "yeast"]


def test_bad_requests_are_refused_by_name(tmp_path):
    genome_file(tmp_path / "g.fa", length=8000)
    sizes = {"train": 4, "valid": 2, "test": 2}
    with raises_naming(CorpusError, "valid part", "chr7:0-4000", "fewer than a read"):
        write_reads(str(tmp_path / "g.fa"), str(tmp_path / "a"), sizes, regions=2, lengths=(1000, 1000))
    with raises_naming(CorpusError, "one label"):
        write_reads(str(tmp_path / "g.fa"), str(tmp_path / "b"), sizes, regions=1, lengths=(10, 20))
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "notes.txt").write_text("mine")
    with raises_naming(Exception, "notes.txt"):
        write_reads(str(tmp_path / "g.fa"), str(tmp_path / "c"), sizes, regions=2, lengths=(10, 20))


def test_a_classifier_fine_tunes_on_reads_with_reverse_complement_augmentation(tmp_path, capsys):
    genome_file(tmp_path / "g.fa", length=20_000)
    cli_json(["data", "reads", "--data", str(tmp_path / "g.fa"), "--out", str(tmp_path / "reads"), "--train", "8",
              "--valid", "4", "--test", "4", "--min-length", "40", "--max-length", "80", "--regions", "2", "--json"], capsys)  # fmt: skip
    cli_json(["train", "--data", str(tmp_path / "g.fa"), "--out", str(tmp_path / "lm"), "--json", *TINY_CLI_8,
              "tokenizer=nucleotide"], capsys)  # fmt: skip
    result = cli_json(["finetune", "--task", "classify", "--checkpoint", str(tmp_path / "lm"), "--data",
                       str(tmp_path / "reads" / "train.jsonl"), "--valid", str(tmp_path / "reads" / "valid.jsonl"),
                       "--out", str(tmp_path / "cls"), "--steps", "2", "--batch-size", "4", "--segment-len", "16",
                       "--set", "rc_prob=0.5", "--json", "--quiet"], capsys)  # fmt: skip
    assert result["steps"] == 2 and 0 <= result["valid"]["accuracy"] <= 1
