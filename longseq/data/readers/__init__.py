"""Readers, one format a module, named in one registry (:data:`READERS`): how a corpus's files become text.

* ``plain``: UTF-8 text (:mod:`~longseq.data.readers.text`), with the layouts of PTB, WikiText and
  ``{train,valid,test}.txt``;
* ``table``: a column of a parquet, arrow or JSON-lines file (:mod:`~longseq.data.readers.table`);
* ``fasta``: FASTA files of DNA or protein (``.fa``, ``.fasta``, ``.fna``, ``.faa``, gzipped too), one record a line
  (:mod:`~longseq.data.readers.fasta`; Biopython, the ``genomes`` extra);
* ``audio``: WAV, FLAC, Ogg and AIFF as 16 kHz mu-law clips, and ``playlist``: M3U lists of them, with the layout
  ``{train,valid,test}.m3u`` (:mod:`~longseq.data.readers.audio`);
* ``smi``: SMILES files, a molecule a line, with the layout ``{train,valid,test}.smi``
  (:mod:`~longseq.data.readers.smiles`);
* ``mixture``: ``.mix`` lists of files of several modalities, each opened by its modality's token, with the layout
  ``{train,valid,test}.mix`` (:mod:`~longseq.data.readers.mixture`);
* ``ucr``: UCR/UEA time-series files (``.ts``, ``.tsv``), a series a line (:mod:`~longseq.data.readers.ucr`).

A file is read by the reader whose ``suffixes`` end its name (``plain`` otherwise); a directory holding a reader's
layout is that layout.  A new format is one module with one :class:`Reader` subclass and one entry here.
"""

from __future__ import annotations

from longseq.data.readers.audio import Audio, Playlist
from longseq.data.readers.base import BLOCK_BYTES, CorpusError, Reader, ReadOptions, Tap, not_utf8
from longseq.data.readers.fasta import Fasta
from longseq.data.readers.mixture import Mixture
from longseq.data.readers.smiles import Smi
from longseq.data.readers.table import Table
from longseq.data.readers.text import PlainText
from longseq.data.readers.ucr import UCR

READERS: dict[str, type[Reader]] = {
    cls.name: cls for cls in (PlainText, Table, Fasta, Audio, Playlist, Smi, UCR, Mixture)
}
Mixture.readers = READERS  # the files a list names are read by their own readers

__all__ = [
    "BLOCK_BYTES",
    "READERS",
    "CorpusError",
    "ReadOptions",
    "Reader",
    "Tap",
    "layouts",
    "not_utf8",
    "reader_for",
]


def reader_for(path: str, options: ReadOptions | None = None) -> Reader:
    """The reader of the file ``path``: the first whose ``suffixes`` end its name, else ``plain``."""
    options = options or ReadOptions()
    name = path.lower()
    for cls in READERS.values():
        if any(name.endswith(suffix) for suffix in cls.suffixes):
            return cls.from_options(options)
    return PlainText.from_options(options)


def layouts() -> dict[str, str]:
    """Every reader's layouts: a layout's name -> the template of its split files, in registry order."""
    return {name: template for cls in READERS.values() for name, template in cls.layouts.items()}
