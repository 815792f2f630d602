"""``smi``: SMILES files (``.smi``), one molecule a line, its SMILES the first field (a name may follow after white
space, as RDKit and Open Babel write them); the layout ``{train,valid,test}.smi``.  A line without a SMILES is
refused at its number.  Read them with ``--tokenizer smiles``."""

from __future__ import annotations

from collections.abc import Iterator

from longseq.data.readers.base import CorpusError, Reader, Tap, utf8_blocks
from longseq.data.tokenizers.base import whole_lines


class Smi(Reader):
    name = "smi"
    suffixes = (".smi",)
    layouts = {"smi": "{}.smi"}

    def text_blocks(self, path: str, tap: Tap) -> Iterator[str]:
        number = 0
        for block in whole_lines(utf8_blocks(path, tap.blocks())):
            lines = block.split("\n")
            fields = []
            for i, line in enumerate(lines):
                if i == len(lines) - 1 and not line:  # the block's end, after its last line end
                    fields.append("")
                    continue
                number += 1
                words = line.split(None, 1)
                if not words:
                    raise CorpusError(f"{path}, line {number}: no SMILES (an empty line)")
                fields.append(words[0])
            yield "\n".join(fields)

    def text_bytes(self, path: str) -> int:
        with open(path, "rb") as f:
            return sum(len(block.encode("utf-8")) for block in self.text_blocks(path, Tap(f)))
