"""Stopping on a scheduler's signal without losing work.

SLURM, Kubernetes and ``docker stop`` send SIGTERM; a closed terminal sends SIGHUP; Ctrl-C sends SIGINT.  While
training, each of them only records that it came: the trainer looks at the record at the next step boundary,
saves ``last/`` (always one whole optimizer step), and raises :class:`Interrupted`, which the command line turns
into the resume command and the exit code 128 + the first signal's number (SIGHUP 129, SIGINT 130, SIGTERM 143).

A second or third signal changes nothing: the step under way still finishes and the same checkpoint is saved,
so a double Ctrl-C or a repeated ``kill`` never leaves a half-applied step behind.  (A process that must die at
once takes SIGKILL; the checkpoint saved before stays valid, since every save is atomic.)

Validation changes nothing that a checkpoint holds, so a signal that arrives while the trainer validates stops
the validation at once (:meth:`StopSignals.interruptible`); the trainer records it as pending, and the resumed
run validates that step again before it trains on.
"""

from __future__ import annotations

import signal

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Interrupted(Exception):
    """Training stopped on a signal after saving a checkpoint it can resume from."""

    def __init__(self, signum: int, step: int, checkpoint: str) -> None:
        self.signum, self.step, self.checkpoint = signum, step, checkpoint
        name = signal.Signals(signum).name
        super().__init__(f"stopped by {name} at step {step}; {checkpoint} holds everything needed to resume")

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class _StopNow(Exception):
    """Raised inside an interruptible section (validation) when the first signal arrives."""


class StopSignals:
    """Within ``with StopSignals() as stop:`` the signals of :data:`SIGNALS` are recorded: ``stop.signum`` is the
    first one's number, ``stop.count`` how many came.  Inside ``stop.interruptible()`` the first one also aborts
    the section (raising :class:`_StopNow` there, and only there)."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.count = 0
        self._interruptible = False
        self._previous: dict = {}

    def __enter__(self) -> StopSignals:
        for sig in SIGNALS:
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread: signals stay as they are
                pass
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum, frame) -> None:
        self.count += 1
        if self.signum is None:
            self.signum = signum
        if self._interruptible:
            self._interruptible = False  # one abort per section: the handler never raises twice
            raise _StopNow

    def interruptible(self, function, *args, **kwargs):
        """``function(*args, **kwargs)``, aborted by a signal; returns None when aborted (or when a signal had
        already come, in which case it does not start)."""
        try:
            try:
                self._interruptible = True
                if self.signum is not None:
                    return None
                return function(*args, **kwargs)
            finally:
                self._interruptible = False
        except _StopNow:  # also when the signal lands in the inner finally, before the flag is down
            return None
