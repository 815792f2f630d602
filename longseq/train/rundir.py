"""A run's output directory: it is never overwritten unasked, never shared by two trainers, and not left behind
empty by a run that failed before it wrote anything.

    last/           full checkpoint (weights + optimizer + RNG + data position + memory): what --resume reads
    best/           weights of the best validation loss
    history/        older training checkpoints (keep_last > 1)
    metrics.jsonl   one JSON object per logged step and per validation
    run.toml        the resolved run configuration
    .lock           held (flock) by the process training into the directory; removed when it ends
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil

from longseq.config import ConfigError
from longseq.config.files import RUN_HEADER
from longseq.train.checkpoint import CheckpointError, checkpoint_parts, recover_checkpoint
from longseq.train.tracking import WANDB_ID_FILE

RUN_FILES = ("last", "best", "history", "metrics.jsonl", "run.toml", "tensorboard", "wandb")


def has_checkpoint(run_dir: str) -> bool:
    """Whether ``run_dir`` holds a ``last/`` checkpoint to resume (or the parts of one whose save was killed)."""
    last = os.path.join(os.path.abspath(os.path.expanduser(run_dir)), "last")
    return os.path.isdir(last) or bool(checkpoint_parts(last))


def _is_checkpoint(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "manifest.json"))


def _is_metrics(path: str) -> bool:
    """A metrics.jsonl longseq wrote: empty, or its first line a JSON object with a ``step``."""
    with open(path, encoding="utf-8", errors="replace") as f:
        first = f.readline()
    if not first.strip():
        return True
    try:
        record = json.loads(first)
    except json.JSONDecodeError:
        return False
    return isinstance(record, dict) and "step" in record


def is_longseq_file(path: str) -> bool:
    """Whether ``path`` (one of :data:`RUN_FILES` in a run directory) is what longseq writes there: a checkpoint
    with its manifest, a history of them, its metrics, its run.toml, TensorBoard event files, W&B's directory."""
    name = os.path.basename(path)
    if name in ("last", "best"):
        return os.path.isdir(path) and _is_checkpoint(path)
    if name == "history":
        return os.path.isdir(path) and all(
            n.startswith("step-") and _is_checkpoint(os.path.join(path, n)) for n in os.listdir(path)
        )
    if name == "tensorboard":
        return os.path.isdir(path) and all(n.startswith("events.out.tfevents") for n in os.listdir(path))
    if name == "wandb":  # W&B's own files, beside the id a run keeps there
        return os.path.isfile(os.path.join(path, WANDB_ID_FILE))
    if not os.path.isfile(path):
        return False
    if name == "metrics.jsonl":
        return _is_metrics(path)
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.readline().startswith(f"# {RUN_HEADER[:-1]}")  # run.toml: the header write_run_config writes


class RunDirectory:
    """Open ``path`` for training: refuse an existing run unless resuming or ``overwrite``; take the lock.

    Only what longseq writes is ever replaced or deleted (:func:`is_longseq_file`); anything else under one of
    the run's names (a ``best/`` folder of the user's own) is refused by name, with any flag.  A run that stopped
    before its first checkpoint (killed early, or three non-finite steps at the start) left its ``run.toml`` and
    log but nothing to resume: it is started afresh, with or without ``--resume``, and ``fresh_start`` says so."""

    def __init__(self, path: str, *, resume: bool, overwrite: bool, main: bool = True) -> None:
        self.path = os.path.abspath(os.path.expanduser(path))
        self.main, self.created, self._lock = main, False, None
        if os.path.exists(self.path) and not os.path.isdir(self.path):
            raise ConfigError(f"--out {path} is a file, not a directory; give a directory for the run")
        if resume and overwrite:
            raise ConfigError("--resume continues a run and --overwrite starts it over: give one of them")
        # Nothing is repaired before the lock is held: a save killed halfway is put back in open(), under the lock.
        # Repairing here removed the temporary checkpoint of a live run that a refused second process looked at.
        existing = [name for name in RUN_FILES if os.path.exists(os.path.join(self.path, name))]
        foreign = [name for name in existing if not is_longseq_file(os.path.join(self.path, name))]
        if foreign:
            raise ConfigError(
                f"{self.path} holds {', '.join(foreign)}, which longseq did not write (no checkpoint manifest, not "
                f"its log or run.toml); longseq never deletes or replaces it: move it away or choose another --out"
            )
        saved = has_checkpoint(self.path)  # a save killed halfway: repaired in open()
        self.fresh_start = bool(existing) and not saved and not os.path.isdir(self.best) and not overwrite
        if resume and not saved and not self.fresh_start:
            raise CheckpointError(
                f"--resume: checkpoint {self.last} does not exist; {self.path} holds no run to continue"
            )
        if existing and not resume and not overwrite and not self.fresh_start:
            raise ConfigError(
                f"{self.path} already holds a run ({', '.join(existing)}); continue it with --resume, or start it "
                f"over with --overwrite, or choose another --out"
            )
        self.resuming = resume and saved
        self.existing = existing

    def open(self) -> RunDirectory:
        """Create the directory if need be, take the lock, and (``overwrite``) remove the previous run."""
        if not self.main:
            return self
        if not os.path.isdir(self.path):
            os.makedirs(self.path)
            self.created = True
        self._lock = self._take_lock()
        self._lock.seek(0)
        self._lock.truncate()
        self._lock.write(f"pid {os.getpid()}\n")
        self._lock.flush()
        recover_checkpoint(self.last)  # under the lock: put back a checkpoint whose save was killed halfway
        recover_checkpoint(self.best)
        if self.fresh_start:  # what a run that never saved left: its run.toml and log; started afresh
            self.clear()
        return self

    def _take_lock(self):
        """The flock of ``.lock``, held until :meth:`close` (which removes the file).  A file removed by the run
        that held it, between our open and our flock, is not the lock any more: it is taken again on the new one."""
        path = os.path.join(self.path, ".lock")
        for _ in range(10):
            lock = open(path, "a+")
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                lock.seek(0)
                holder = lock.read().strip() or "another process"
                lock.close()
                raise ConfigError(
                    f"{self.path} is being trained into by {holder}; wait for it or choose another --out"
                ) from None
            try:
                same = os.stat(path).st_ino == os.fstat(lock.fileno()).st_ino
            except FileNotFoundError:
                same = False
            if same:
                return lock
            lock.close()
        raise ConfigError(f"{self.path}/.lock keeps being replaced by another process; choose another --out")

    def clear(self) -> None:
        """Remove the previous run's files (``--overwrite``), nothing else."""
        self.existing = [name for name in RUN_FILES if os.path.exists(os.path.join(self.path, name))]
        for name in self.existing:
            target = os.path.join(self.path, name)
            shutil.rmtree(target) if os.path.isdir(target) else os.remove(target)

    def close(self, failed: bool = False) -> None:
        """Release the lock and remove ``.lock`` (removed while held, so no other process can take the old file);
        a directory this run created and wrote nothing into is removed after a failure."""
        if self._lock is not None:
            try:
                os.remove(os.path.join(self.path, ".lock"))
            except OSError:
                pass
            self._lock.close()
            self._lock = None
        if failed and self.created and not os.listdir(self.path):
            shutil.rmtree(self.path, ignore_errors=True)

    @property
    def last(self) -> str:
        return os.path.join(self.path, "last")

    @property
    def best(self) -> str:
        return os.path.join(self.path, "best")

    @property
    def metrics(self) -> str:
        return os.path.join(self.path, "metrics.jsonl")

    def append_metrics(self, record: dict) -> None:
        with open(self.metrics, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")

    def last_logged(self) -> tuple[dict, dict]:
        """The last training record (``loss``, ``tokens_per_s``) and the last validation record (its ``valid_``
        keys without the prefix, and ``step``) of ``metrics.jsonl``; empty dicts when there are none."""
        train, valid = {}, {}
        try:
            with open(self.metrics, encoding="utf-8") as f:
                for line in f:
                    try:
                        record = json.loads(line)
                    except json.JSONDecodeError:
                        continue
                    if "loss" in record:
                        train = record
                    elif any(key.startswith("valid_") for key in record):
                        valid = {k.removeprefix("valid_"): v for k, v in record.items() if k != "elapsed_s"}
        except OSError:
            pass
        return train, valid

    def truncate_metrics(self, step: int) -> float:
        """Drop log records written after the checkpoint we resume from, so the log matches the run; returns the
        training wall time (``elapsed_s``) logged by then, so the resumed run's clock continues from it."""
        if not os.path.exists(self.metrics):
            return 0.0
        records = []
        with open(self.metrics, encoding="utf-8") as f:
            for line in f:
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError:  # a line cut short by a kill: the resumed run writes it again
                    continue
        kept = [r for r in records if r.get("step", 0) <= step]
        with open(self.metrics, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in kept)
        return max((r.get("elapsed_s", 0.0) for r in kept), default=0.0)
