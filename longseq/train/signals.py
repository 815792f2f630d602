"""Stopping on a scheduler's signal without losing work.

SLURM, Kubernetes and ``docker stop`` send SIGTERM; a closed terminal sends SIGHUP; Ctrl-C sends SIGINT.  While
training, each of them only raises a flag; the trainer looks at it at the next step boundary, saves ``last/``,
and raises :class:`Interrupted`, which the command line turns into the resume command and a non-zero exit
(128 + the signal number).  A signal that arrives while the trainer validates stops the validation at once (it
changes nothing that a checkpoint holds).  A second signal stops the process immediately; the checkpoint saved
before stays valid, since every save is atomic.
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
    """Raised inside an interruptible section (validation) when a signal arrives."""


class StopSignals:
    """Within ``with StopSignals() as stop:`` the signals of :data:`SIGNALS` set ``stop.signum``; inside
    ``stop.interruptible()`` they also abort the section (raising :class:`_StopNow`)."""

    def __init__(self) -> None:
        self.signum: int | None = None
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
        if self.signum is not None:  # the second one: stop now
            raise KeyboardInterrupt
        self.signum = signum
        if self._interruptible:
            raise _StopNow

    def interruptible(self, function, *args, **kwargs):
        """``function(*args, **kwargs)``, aborted by a signal; returns None when aborted."""
        self._interruptible = True
        try:
            if self.signum is not None:
                return None
            return function(*args, **kwargs)
        except _StopNow:
            return None
        finally:
            self._interruptible = False
