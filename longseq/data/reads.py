"""Sequence classification data from FASTA files (``longseq data reads``): reads of 1-32 kb drawn from the
sequences, labelled from the files themselves, written as the classify task's JSON lines.

* ``label_by="region"``: every sequence cut into ``regions`` equal stretches by position; a read's label is the
  stretch it comes from (``chrX:0-17500000``): which part of a chromosome is this read from;
* ``label_by="file"``: a read's label is its file's name (a directory of one FASTA file per organism): which
  organism is this read from.

No read of one split overlaps another's: each stretch (or file's sequence) is cut 90/5/5 by position, and a split's
reads lie inside its part (the test reads in the last 5%, as a single corpus's test split).  A read holding more
than ``max_n`` of N is drawn again; with ``both_strands`` half the reads are the reverse complement (a read comes
from either strand).  The same arguments write the same files.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from longseq.data.readers.base import CorpusError
from longseq.data.readers.fasta import records
from longseq.data.sources import SPLITS, TRAIN_FRACTION, VALID_FRACTION
from longseq.data.tasks import write_jsonl
from longseq.outputs import check_output_directory

COMPLEMENT = str.maketrans("ACGTNacgtn", "TGCANtgcan")
MAX_TRIES = 100  # draws of a read before its stretch is declared too full of N


@dataclass(frozen=True)
class Stretch:
    """Where reads of one label are drawn from: ``sequence[start:stop]`` of a record."""

    label: str
    name: str  # the file and record
    sequence: str
    start: int
    stop: int


def fasta_files(path: str) -> list[str]:
    """``path`` itself, or the FASTA files of a directory, sorted."""
    from longseq.data.readers import reader_for

    if not os.path.isdir(path):
        return [path]
    names = [os.path.join(path, n) for n in sorted(os.listdir(path)) if not n.startswith(".")]
    found = [n for n in names if os.path.isfile(n) and reader_for(n).name == "fasta"]
    if not found:
        raise CorpusError(f"{path} holds no FASTA file (.fa, .fasta, .fna, .faa, gzipped or not)")
    return found


def stretches(paths: list[str], label_by: str, regions: int) -> list[Stretch]:
    """The stretches reads are drawn from, each with its label."""
    out = []
    for path in paths:
        stem = os.path.basename(path).split(".")[0]
        with open(path, "rb") as f:
            for title, seq in records(path, f):
                name = f"{stem}:{title.split()[0] if title else ''}"
                if label_by == "file":
                    out.append(Stretch(stem, name, seq, 0, len(seq)))
                    continue
                cuts = np.linspace(0, len(seq), regions + 1).astype(int)
                for a, b in zip(cuts[:-1], cuts[1:]):
                    out.append(Stretch(f"{name.split(':', 1)[1]}:{a}-{b}", name, seq, int(a), int(b)))
    return out


def split_part(stretch: Stretch, split: str) -> tuple[int, int]:
    """The positions of ``stretch`` that ``split``'s reads lie in: its first 90%, next 5%, last 5%."""
    length = stretch.stop - stretch.start
    cuts = [0, int(length * TRAIN_FRACTION), int(length * (TRAIN_FRACTION + VALID_FRACTION)), length]
    i = SPLITS.index(split)
    return stretch.start + cuts[i], stretch.start + cuts[i + 1]


def draw_read(rng, stretch: Stretch, split: str, lengths: tuple[int, int], max_n: float, both_strands: bool):
    """One read of ``split`` from ``stretch``: its record, text, label and place."""
    low, high = split_part(stretch, split)
    for _ in range(MAX_TRIES):
        length = int(rng.integers(lengths[0], lengths[1] + 1))
        if high - low < length:
            raise CorpusError(
                f"the {split} part of {stretch.label} ({stretch.name}) holds {high - low:,} positions, fewer than a "
                f"read of {length:,}: use fewer regions or shorter reads"
            )
        start = int(rng.integers(low, high - length + 1))
        text = stretch.sequence[start : start + length]
        if text.upper().count("N") <= max_n * length:
            minus = both_strands and rng.random() < 0.5
            text = text.translate(COMPLEMENT)[::-1] if minus else text
            place = f"{stretch.name}:{start}-{start + length}({'-' if minus else '+'})"
            return {"text": text, "label": stretch.label, "source": place}
    raise CorpusError(f"{stretch.label} ({stretch.name}): {MAX_TRIES} reads drawn, each over {max_n:.0%} N")


def is_reads_file(path: str) -> bool:
    """Whether ``path`` is a file this command wrote (its first row has text, label and source)."""
    import json

    try:
        with open(path, encoding="utf-8") as f:
            row = json.loads(f.readline())
    except (OSError, ValueError):
        return False
    return isinstance(row, dict) and {"text", "label", "source"} <= set(row)


def write_reads(
    path: str,
    out_dir: str,
    sizes: dict[str, int],
    *,
    label_by: str = "region",
    regions: int = 4,
    lengths: tuple[int, int] = (1000, 32000),
    max_n: float = 0.1,
    both_strands: bool = True,
    seed: int = 0,
) -> dict:
    """Write ``{train,valid,test}.jsonl`` of ``sizes`` reads each into ``out_dir`` (see the module docstring);
    labels take turns, so every class has the same number of reads (within one).  Returns a summary."""
    if label_by not in ("region", "file"):
        raise ValueError(f"--label-by must be region or file, got {label_by!r}")
    if not 1 <= lengths[0] <= lengths[1]:
        raise ValueError(f"read lengths must satisfy 1 <= min <= max, got {lengths}")
    check_output_directory(out_dir, "--out", "reads", {f"{split}.jsonl": is_reads_file for split in sizes})
    found = stretches(fasta_files(path), label_by, regions)
    labels = sorted({s.label for s in found})
    if len(labels) < 2:
        raise CorpusError(f"{path} gives one label ({labels[0]}): classification needs two (more regions or files)")
    by_label = {label: [s for s in found if s.label == label] for label in labels}
    rows = {}
    for i, (split, n) in enumerate(sizes.items()):
        rng = np.random.default_rng([seed, i])
        picks = [by_label[labels[k % len(labels)]] for k in range(n)]
        rows[split] = [
            draw_read(rng, group[int(rng.integers(len(group)))], split, lengths, max_n, both_strands) for group in picks
        ]
    os.makedirs(out_dir, exist_ok=True)
    for split, split_rows in rows.items():
        write_jsonl(os.path.join(out_dir, f"{split}.jsonl"), split_rows)
    return {"out": out_dir, "labels": labels, **{split: len(r) for split, r in rows.items()}}
