"""Progress for people, on stderr: a tqdm bar on a terminal; elsewhere (a log file, CI, a notebook, ``nohup``),
where a bar prints nothing useful, a plain line now and then.

* :class:`Meter`: a count towards a total (bytes read, segments scored) with named counters beside it (tokens
  written); ``longseq data prepare``, ``longseq eval`` and a language model's validation report through it.
* :class:`TrainingProgress`: the training loop's bar, or its line ``step 120/1200 (10%) | loss 2.3456 | lr
  1.00e-03 | 12,345 tok/s | elapsed 1m30s | ETA 13m20s``, the first after the first step, then at most every
  ``interval_s`` seconds; the ETA comes from the speed measured in this session and, with a time budget,
  is the earlier of the two ends.

Nothing here reads a random number or changes what is computed: only what is shown.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

from tqdm import tqdm


def on_terminal() -> bool:
    """Whether stderr is a terminal (where a bar redraws in place)."""
    isatty = getattr(sys.stderr, "isatty", None)
    return bool(isatty and isatty())


def to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def duration(seconds: float) -> str:
    """``45s``, ``3m05s``, ``2h03m``: a span of time as a person reads it."""
    if seconds != seconds or seconds == float("inf"):
        return "?"
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def size(n: float) -> str:
    """Bytes as ``812 B``, ``3.4 MB``, ``1.20 GB`` (powers of 1000, as tqdm's ``unit_scale`` shows them)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.{2 if unit == 'GB' else 1}f} {unit}"
    return f"{int(n)} B"


class Every:
    """Says when a plain line is due: the first time asked (``wait_first``: once ``interval_s`` seconds have passed
    since it was made), then once ``interval_s`` seconds have passed since the last line (``interval_s`` 0: never)."""

    def __init__(self, interval_s: float, clock: Callable[[], float] = time.monotonic, wait_first: bool = False):
        self.interval_s, self.clock, self.last = interval_s, clock, clock() if wait_first else None

    def due(self) -> bool:
        if self.interval_s <= 0:
            return False
        now = self.clock()
        if self.last is not None and now - self.last < self.interval_s:
            return False
        self.last = now
        return True


class Meter:
    """``done`` of ``total`` (``unit`` "B" shows bytes) and named counters (``totals`` gives some of them a total),
    as a bar on a terminal or as plain lines (``encode: 3.4 MB of 12.0 MB (28%) | files 1/3 | tokens 3,400,112 |
    1.1 MB/s | ETA 8s``), the first at the first update, then at most every ``interval_s`` seconds, and one at the
    end.  ``quiet_start``: the first line once ``interval_s`` seconds have passed, the last only if one was
    written (a pass that ends sooner says nothing), and the bar leaves no line behind.  ``enabled=False`` shows
    nothing; ``terminal`` (default: whether stderr is one) chooses bar or lines."""

    def __init__(
        self,
        total: int,
        desc: str,
        *,
        unit: str = "",
        enabled: bool = True,
        interval_s: float = 30.0,
        totals: dict[str, int] | None = None,
        write: Callable[[str], None] = to_stderr,
        terminal: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
        quiet_start: bool = False,
    ) -> None:
        terminal = on_terminal() if terminal is None else terminal
        self.total, self.desc, self.unit, self.write, self.clock = total, desc, unit, write, clock
        self.totals, self.quiet_start, self.written = dict(totals or {}), quiet_start, False
        self.done, self.counts, self.start = 0, dict.fromkeys(self.totals, 0), clock()
        self.bar = tqdm(
            total=total,
            desc=desc,
            unit=unit or "it",
            unit_scale=unit == "B",
            disable=not (enabled and terminal),
            leave=not quiet_start,
        )
        self.lines = Every(interval_s if enabled and not terminal else 0.0, clock, wait_first=quiet_start)

    def update(self, n: int) -> None:
        self.done += n
        self.bar.update(n)
        if self.lines.due():
            self.write(self.line())
            self.written = True

    def count(self, name: str, n: int) -> None:
        """Add ``n`` to the counter ``name`` (shown beside the total)."""
        self.counts[name] = self.counts.get(name, 0) + n
        if not self.bar.disable:
            self.bar.set_postfix_str(" ".join(self._counters()), refresh=False)

    def _counters(self) -> list[str]:
        return [
            f"{name} {value:,}" + (f"/{self.totals[name]:,}" if name in self.totals else "")
            for name, value in self.counts.items()
        ]

    def line(self, final: bool = False) -> str:
        show = size if self.unit == "B" else (lambda n: f"{n:,.0f}")
        parts = [f"{self.desc}: {show(self.done)} of {show(self.total)} ({self.done / max(self.total, 1):.0%})"]
        parts += self._counters()
        elapsed = self.clock() - self.start
        rate = self.done / elapsed if elapsed > 0 else 0.0
        if rate:  # a slow count (segments of a long validation) keeps its first figures
            parts.append(f"{show(rate) if self.unit == 'B' or rate >= 10 else f'{rate:.2g}'}/s")
        if final:
            parts.append(f"done in {duration(elapsed)}")
        elif rate:
            parts.append(f"ETA {duration((self.total - self.done) / rate)}")
        return " | ".join(parts)

    def __enter__(self) -> Meter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self.lines.interval_s > 0 and (self.written or not self.quiet_start):  # lines end where the count ended
            self.write(self.line(final=True))
        self.bar.close()


class TrainingProgress:
    """The training loop's progress: a bar on a terminal, or plain lines to ``log`` (see the module docstring).
    ``interval_s`` 0 turns the lines off; ``enabled=False`` (``--quiet``, ranks other than 0) shows nothing."""

    def __init__(
        self,
        *,
        step: int,
        max_steps: int,
        max_time_s: float,
        interval_s: float,
        enabled: bool,
        log: Callable[[str], None],
        clock: Callable[[], float],
        terminal: bool | None = None,
    ) -> None:
        terminal = on_terminal() if terminal is None else terminal
        self.max_steps, self.max_time_s, self.log, self.clock = max_steps, max_time_s, log, clock
        self.bar = tqdm(
            total=max_steps,
            initial=step,
            desc="train",
            unit="step",
            dynamic_ncols=True,
            disable=not (enabled and terminal),
        )
        self.lines = Every(interval_s if enabled and not terminal else 0.0, clock)
        self.first_step, self.start = step, clock()

    def __enter__(self) -> TrainingProgress:
        return self

    def __exit__(self, *exc) -> None:
        self.bar.close()

    def update(self, step: int, loss: float, lr: float, tokens_per_s: float, elapsed_s: float) -> None:
        """After optimizer step ``step``; ``elapsed_s``: the run's training time so far (across resumes)."""
        self.bar.update(1)
        if not self.bar.disable:
            self.bar.set_postfix(loss=f"{loss:.3f}", lr=f"{lr:.2e}", tok_s=f"{tokens_per_s:,.0f}")
        if self.lines.due():
            self.log(self.line(step, loss, lr, tokens_per_s, elapsed_s))

    def eta(self, step: int, elapsed_s: float) -> float:
        """Seconds to the end: the remaining steps at this session's speed, or what is left of ``max_time_s`` when
        that comes first."""
        spent = self.clock() - self.start
        done = step - self.first_step
        left = (self.max_steps - step) * spent / done if done > 0 and spent > 0 else float("inf")
        if self.max_time_s > 0:
            left = min(left, max(0.0, self.max_time_s - elapsed_s))
        return left

    def line(self, step: int, loss: float, lr: float, tokens_per_s: float, elapsed_s: float) -> str:
        budget = f" of max_time_s {duration(self.max_time_s)}" if self.max_time_s > 0 else ""
        return (
            f"step {step}/{self.max_steps} ({step / self.max_steps:.0%}) | loss {loss:.4f} | lr {lr:.2e} | "
            f"{tokens_per_s:,.0f} tok/s | elapsed {duration(elapsed_s)}{budget} | ETA {duration(self.eta(step, elapsed_s))}"
        )
