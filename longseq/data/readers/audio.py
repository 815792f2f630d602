"""``audio``: WAV, FLAC, Ogg and AIFF files as 16 kHz mono mu-law clips; ``playlist``: an M3U list of such files.

A file's text is its clips, one line each, every sample a character (:mod:`longseq.data.audio` says how; read it with
``--tokenizer mulaw``).  ``data.clip_seconds`` cuts every file into clips of that length (SaShiMi: 8 s), dropping a
shorter tail; 0 keeps each file whole.  A directory of audio files is a corpus of documents (split 90/5/5 by samples);
a directory holding ``train.m3u``, ``valid.m3u`` and ``test.m3u`` is the ``playlist`` layout, each split the files its
list names (one path a line, relative to the list; ``#`` lines are comments), so that a split can keep whole tracks
apart at any share (SaShiMi's 88/6/6).  A corrupt, empty or undecodable file is refused by name.

A playlist's sha256 (what a prepared corpus records) is the list's own; each listed file is named in errors."""

from __future__ import annotations

import os
from collections.abc import Iterator

from longseq.data.audio import AudioError, audio_text, audio_text_bytes
from longseq.data.readers.base import CorpusError, Reader, ReadOptions, Tap, utf8_blocks

AUDIO_SUFFIXES = (".wav", ".flac", ".ogg", ".oga", ".aif", ".aiff")


class Audio(Reader):
    name = "audio"
    suffixes = AUDIO_SUFFIXES

    def __init__(self, clip_seconds: float = 0.0) -> None:
        self.clip_seconds = clip_seconds

    @classmethod
    def from_options(cls, options: ReadOptions) -> Audio:
        return cls(options.clip_seconds)

    def settings(self) -> dict:
        return {"clip_seconds": self.clip_seconds}

    def text_bytes(self, path: str) -> int:
        try:
            return audio_text_bytes(path, self.clip_seconds)
        except AudioError as exc:
            raise CorpusError(str(exc)) from None

    def text_blocks(self, path: str, tap: Tap) -> Iterator[str]:
        try:
            yield audio_text(tap.read(), path, self.clip_seconds)
        except AudioError as exc:
            raise CorpusError(str(exc)) from None

    def where(self, path: str, line: int, column: int) -> str:
        return f"clip {line}, sample {column}"


class Playlist(Reader):
    name = "playlist"
    suffixes = (".m3u", ".m3u8")
    layouts = {"playlist": "{}.m3u"}

    def __init__(self, clip_seconds: float = 0.0) -> None:
        self.audio = Audio(clip_seconds)

    @classmethod
    def from_options(cls, options: ReadOptions) -> Playlist:
        return cls(options.clip_seconds)

    def settings(self) -> dict:
        return self.audio.settings()

    def entries(self, path: str, text: str | None = None) -> list[str]:
        """The audio files the list ``path`` names, in order (each checked to exist)."""
        if text is None:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        base, files = os.path.dirname(os.path.abspath(path)), []
        for number, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            entry = line if os.path.isabs(line) else os.path.join(base, line)
            if not os.path.isfile(entry):
                raise CorpusError(f"{path}, line {number}: {line} is not a file")
            if not entry.lower().endswith(AUDIO_SUFFIXES):
                raise CorpusError(f"{path}, line {number}: {line} is not an audio file ({', '.join(AUDIO_SUFFIXES)})")
            files.append(entry)
        if not files:
            raise CorpusError(f"{path} lists no audio file")
        return files

    def text_bytes(self, path: str) -> int:
        files = self.entries(path)
        return sum(self.audio.text_bytes(f) for f in files) + len(files) - 1

    def text_blocks(self, path: str, tap: Tap) -> Iterator[str]:
        files = self.entries(path, "".join(utf8_blocks(path, tap.blocks())))
        for i, entry in enumerate(files):
            with open(entry, "rb") as f:
                yield from self.audio.text_blocks(entry, Tap(f))
            if i < len(files) - 1:
                yield "\n"

    def where(self, path: str, line: int, column: int) -> str:
        return f"clip {line} of the files it lists, sample {column}"
