"""Where a command writes: never over what longseq did not write.

Every command that writes a file (a figure, a JSON report, predictions) or fills a directory (a diagnostics
report, an export, a converted checkpoint, generated data) checks its target first, before any work: it may be
missing or empty, or hold only what this same command writes, each file recognised as such (a PNG longseq drew
carries ``Software: longseq``; a report, an export, a converted checkpoint its own keys or marker), which is then
replaced.  Anything else is refused by name (:class:`OutputError`) and never deleted, and so is a path inside a run
directory that a trainer holds (its ``.lock``).  Training runs have their own, stricter rule
(:mod:`longseq.train.rundir`).
"""

from __future__ import annotations

import fcntl
import fnmatch
import json
import os
import shutil
import struct
from collections.abc import Callable

SOFTWARE = "longseq"  # the PNG text chunk of every figure longseq draws: how it knows the file is its own
PNG_METADATA = {"Software": SOFTWARE}
EXPORTED_BY = "longseq convert"  # the safetensors metadata of a directory ``longseq convert`` wrote

Recogniser = Callable[[str], bool]


class OutputError(ValueError):
    """An output path that holds something longseq did not write, or that a training run holds."""


def is_longseq_png(path: str) -> bool:
    """Whether ``path`` is a PNG whose ``Software`` text chunk says longseq drew it."""
    try:
        with open(path, "rb") as f:
            if f.read(8) != b"\x89PNG\r\n\x1a\n":
                return False
            while True:
                head = f.read(8)
                if len(head) < 8:
                    return False
                size, kind = struct.unpack(">I4s", head)
                if kind == b"IDAT":  # text chunks written by matplotlib come before the image data
                    return False
                body = f.read(size)
                f.seek(4, os.SEEK_CUR)  # the CRC
                if kind == b"tEXt" and body.split(b"\0", 1) == [b"Software", SOFTWARE.encode()]:
                    return True
    except OSError:
        return False


def json_object_with(*keys: str) -> Recogniser:
    """A recogniser of a JSON file holding an object with every one of ``keys`` (a report longseq wrote)."""

    def recognise(path: str) -> bool:
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        except (OSError, ValueError):
            return False
        return isinstance(data, dict) and all(key in data for key in keys)

    return recognise


def jsonl_rows_with(key: str) -> Recogniser:
    """A recogniser of a JSON-lines file every row of which is an object with ``key``."""

    def recognise(path: str) -> bool:
        try:
            with open(path, encoding="utf-8") as f:
                rows = [json.loads(line) for line in f if line.strip()]
        except (OSError, ValueError):
            return False
        return bool(rows) and all(isinstance(row, dict) and key in row for row in rows)

    return recognise


def first_line_is(text: str) -> Recogniser:
    def recognise(path: str) -> bool:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                return f.readline().rstrip("\n") == text
        except OSError:
            return False

    return recognise


def training_into(path: str) -> str | None:
    """The run directory among ``path`` and its parents whose lock a trainer holds (with the holder's words), or
    None.  The lock is tried, never created."""
    current = os.path.abspath(path)
    while True:
        lock = os.path.join(current, ".lock")
        if os.path.isfile(lock):
            try:
                with open(lock) as f:
                    try:
                        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    except OSError:
                        return f"{current} (being trained into by {f.read().strip() or 'another process'})"
                    fcntl.flock(f, fcntl.LOCK_UN)
            except OSError:
                pass
        parent = os.path.dirname(current)
        if parent == current:
            return None
        current = parent


def _refuse_live_run(path: str, flag: str) -> None:
    live = training_into(path)
    if live is not None:
        raise OutputError(f"{flag} {path} lies in the run directory {live}; wait for the run or choose another {flag}")


def check_output_file(path: str, flag: str, what: str, recognise: Recogniser) -> None:
    """``path`` may receive the ``what`` (a figure, a recall report): it is new, empty, or one that ``recognise``
    says this command wrote.  Otherwise an :class:`OutputError` names it."""
    _refuse_live_run(path, flag)
    if os.path.isdir(path):
        raise OutputError(f"{flag} {path} is a directory; give the path of the {what} file to write")
    if os.path.exists(path) and os.path.getsize(path) > 0 and not recognise(path):
        raise OutputError(
            f"{flag} {path} exists and is not a {what} longseq wrote; longseq never replaces it: move it away or "
            f"choose another {flag}"
        )


def check_output_directory(path: str, flag: str, what: str, owned: dict[str, Recogniser]) -> None:
    """``path`` may be filled with the ``what``: it is new, empty, or holds only entries whose names match a pattern
    of ``owned`` and that its recogniser accepts (this command's earlier output).  Otherwise an
    :class:`OutputError` names what longseq did not write."""
    _refuse_live_run(path, flag)
    if os.path.exists(path) and not os.path.isdir(path):
        raise OutputError(f"{flag} {path} is a file; give a directory for the {what}")
    if not os.path.isdir(path):
        return
    foreign = []
    for name in sorted(os.listdir(path)):
        recognise = next((r for pattern, r in owned.items() if fnmatch.fnmatchcase(name, pattern)), None)
        if recognise is None or not recognise(os.path.join(path, name)):
            foreign.append(name)
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise OutputError(
            f"{flag} {path} holds {shown}, which longseq did not write as {what}; longseq never deletes or "
            f"replaces it: move it away or choose another {flag}"
        )


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_directory(out: str, write: Callable[[str], None], what: str, errors: tuple[type[BaseException], ...] = ()):
    """Fill the directory ``out`` as a whole or not at all, as checkpoints are written: ``write(tmp)`` fills a new
    directory beside it (``.NAME.tmp-PID``), every file is fsynced, and it then takes the place of ``out`` (an
    earlier output or an empty directory, checked by the caller) by two renames.  Any failure removes the temporary
    directory and leaves ``out`` as it was; a failed write (an ``OSError``: a full disk, permissions; or one of
    ``errors``, a library's own write error) is an :class:`OutputError` naming ``out`` and the reason."""
    out = os.path.abspath(out)
    parent, name = os.path.split(out)
    tmp = os.path.join(parent, f".{name}.tmp-{os.getpid()}")
    old = os.path.join(parent, f".{name}.old-{os.getpid()}")
    try:
        os.makedirs(parent, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        write(tmp)
        for entry in os.listdir(tmp):
            _fsync(os.path.join(tmp, entry))
        if os.path.exists(out):
            os.replace(out, old)
        os.replace(tmp, out)
        _fsync(parent)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if os.path.exists(old) and not os.path.exists(out):
            os.replace(old, out)
        if isinstance(exc, (OSError, *errors)):
            kept = "the earlier one is intact" if os.path.isdir(out) and os.listdir(out) else "nothing was written"
            raise OutputError(f"could not write {what} {out}: {exc}; {kept}") from exc
        raise
    shutil.rmtree(old, ignore_errors=True)
