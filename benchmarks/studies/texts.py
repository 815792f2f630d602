"""Corpora that every tokenizer reads as the same bytes, so that a byte model and a BPE model score the same text
in bits per byte (issue 43's study).  Each is a layout folder (``train.txt``, ``valid.txt``, ``test.txt``) that
:func:`longseq.data.corpus.load_corpus` reads with any tokenizer:

* ``ptb-bytes``: character PTB with one byte for every character of Mikolov's ``ptb.char.*``
  (:func:`longseq.data.corpus.ptb_to_char`): a word's characters, a space where the character files have ``_``,
  ``@`` for ``<unk>`` (a character PTB does not hold) and a newline for each line end.  A byte model's bits per
  byte are then the bits per character of the character-level literature.
* ``wt2-bytes``: WikiText-2 (v1, tokenised) as its files are.
* ``shakespeare-bytes``: the bundled tiny-shakespeare cut 90/5/5 by bytes, where the byte tokenizer cuts the
  single file; a BPE learns from the training part only and scores the same test bytes.

The derived folders are written once under a work folder (the runner's ``--out``) and checked on every read.
"""

from __future__ import annotations

import os

from longseq.data.sources import bundled_corpus_path, read_bytes, split_cuts

SPLITS = ("train", "valid", "test")
UNK = b"@"  # a byte no PTB file holds: <unk> is one character of character PTB


def ptb_bytes(text: bytes) -> bytes:
    """A word-level PTB file as the bytes of its character-level version, one byte a character token."""
    lines = []
    for line in text.split(b"\n"):
        words = line.split()
        if not words and not line:  # as ptb_to_char: the empty tail after the last newline
            continue
        lines.append(b" ".join(UNK if w == b"<unk>" else w for w in words) + b"\n")
    return b"".join(lines)


def shakespeare_splits() -> dict[str, bytes]:
    """The bundled corpus cut 90/5/5 by bytes: the byte tokenizer's split of the single file."""
    data = read_bytes(bundled_corpus_path())
    train, valid = split_cuts(len(data))
    return {"train": data[:train], "valid": data[train:valid], "test": data[valid:]}


def write_layout(folder: str, parts: dict[str, bytes]) -> str:
    """``folder`` holding ``SPLIT.txt`` for every split, written atomically where missing or different."""
    os.makedirs(folder, exist_ok=True)
    for split in SPLITS:
        path = os.path.join(folder, f"{split}.txt")
        if os.path.exists(path) and read_bytes(path) == parts[split]:
            continue
        with open(path + ".tmp", "wb") as f:
            f.write(parts[split])
        os.replace(path + ".tmp", path)
    return folder


def text_folder(name: str, root: str | None, work: str) -> str:
    """The layout folder of corpus ``name`` (``root``: the data root; ``work``: where derived folders go)."""
    if name == "wt2-bytes":
        return os.path.join(root, "wikitext-2")
    if name == "ptb-bytes":
        source = {s: read_bytes(os.path.join(root, "ptb", f"ptb.{s}.txt")) for s in SPLITS}
        return write_layout(os.path.join(work, "corpora", name), {s: ptb_bytes(t) for s, t in source.items()})
    if name == "shakespeare-bytes":
        return write_layout(os.path.join(work, "corpora", name), shakespeare_splits())
    raise ValueError(f"no byte corpus {name!r}; known: {', '.join(TEXTS)}")


TEXTS = ("ptb-bytes", "wt2-bytes", "shakespeare-bytes")
NEEDS_NO_DATA = ("shakespeare-bytes",)
