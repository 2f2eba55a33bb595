"""Progress through training and the evaluation after it: a tqdm bar on a terminal, plain timed lines when stderr is a pipe or a log file."""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

# Seconds between two progress lines when stderr is not a terminal: often enough to show a run is
# alive, rare enough that a log of a long run stays readable.
LINE_INTERVAL = 30.0
# A training step is a forward and a backward pass, about three forward passes' work; evaluating a
# row is one forward pass, so it costs about a third of training on it.
FORWARD_SHARE = 1 / 3
_shared_terminal = False  # several runs (bench workers) write to one terminal: lines, never bars that overwrite each other


def share_terminal() -> None:
    """Say that other processes print progress to the same terminal, so this one prints lines instead of a bar."""
    global _shared_terminal
    _shared_terminal = True


def clock(seconds: float) -> str:
    """Seconds as '4m03s', or '2h05m' from an hour on."""
    seconds = round(seconds)
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"


def evaluation_in_steps(rows: int, gammas: int, rows_per_step: int) -> float:
    """About how many training steps' time evaluating ``rows`` rows at ``gammas`` levels takes (steps of ``rows_per_step`` rows)."""
    return rows * gammas * FORWARD_SHARE / max(rows_per_step, 1)


class ProgressLines:
    """A tqdm-like counter that prints 'NAME: step n/N, elapsed, about T left' every ``interval`` seconds.

    ``after`` is the work that follows, in the same units (the evaluation after training), so the
    time left covers it too.
    """

    def __init__(
        self,
        total: int,
        initial: int = 0,
        desc: str = "",
        interval: float = LINE_INTERVAL,
        file: TextIO | None = None,
        unit: str = "step",
        after: float = 0.0,
    ) -> None:
        self.total, self.n, self.desc, self.interval, self.unit, self.after = total, initial, desc, interval, unit, after
        self.file = file if file is not None else sys.stderr
        self._start_n = initial
        self._start = self._last = time.monotonic()
        self._print()  # say at once that the run started, and where (a resumed run starts past 0)

    def _print(self) -> None:
        elapsed = time.monotonic() - self._start
        done = self.n - self._start_n
        rest = self.total - self.n + self.after
        then = " (evaluation included)" if self.after else ""
        left = f", about {clock(elapsed / done * rest)} left{then}" if done > 0 and rest > 0 else ""
        resumed = f" (resumed at {self.unit} {self._start_n})" if self._start_n else ""
        print(f"{self.desc}: {self.unit} {self.n}/{self.total}{resumed}, {clock(elapsed)} elapsed{left}", file=self.file, flush=True)

    def update(self, steps: int = 1) -> None:
        self.n += steps
        now = time.monotonic()
        if now - self._last >= self.interval or self.n == self.total:
            self._last = now
            self._print()

    def close(self) -> None:
        """Nothing to clear: every line printed stays in the log."""


def progress_bar(
    total: int,
    initial: int = 0,
    desc: str = "",
    enabled: bool = True,
    interval: float = LINE_INTERVAL,
    unit: str = "step",
    after: float = 0.0,
) -> Any:
    """A tqdm bar when stderr is a terminal of this process alone, ProgressLines otherwise, a silent counter when disabled."""
    from tqdm.auto import tqdm

    if enabled and (_shared_terminal or not sys.stderr.isatty()):
        return ProgressLines(total, initial, desc, interval, unit=unit, after=after)
    return tqdm(total=total, initial=initial, disable=not enabled, desc=desc, leave=False, unit=unit)
