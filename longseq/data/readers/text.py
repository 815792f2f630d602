"""``plain``: UTF-8 text files, read as they are; the layouts of Mikolov's PTB (``ptb.{train,valid,test}.txt``),
WikiText (``wiki.{train,valid,test}.tokens``) and plain ``{train,valid,test}.txt``."""

from __future__ import annotations

from collections.abc import Iterator

from longseq.data.readers.base import Reader, Tap, utf8_blocks


class PlainText(Reader):
    name = "plain"
    layouts = {"ptb": "ptb.{}.txt", "wikitext": "wiki.{}.tokens", "plain": "{}.txt"}
    raw_bytes = True

    def text_blocks(self, path: str, tap: Tap) -> Iterator[str]:
        return utf8_blocks(path, tap.blocks())
