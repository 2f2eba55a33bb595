"""Training progress: a tqdm bar on a terminal, plain timed lines when stderr is a pipe or a log file."""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

# Seconds between two progress lines when stderr is not a terminal: often enough to show a run is
# alive, rare enough that a log of a long run stays readable.
LINE_INTERVAL = 30.0


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"


class ProgressLines:
    """A tqdm-like counter that prints 'NAME: step n/N, elapsed, about T left' every ``interval`` seconds."""

    def __init__(self, total: int, initial: int = 0, desc: str = "", interval: float = LINE_INTERVAL, file: TextIO | None = None) -> None:
        self.total, self.n, self.desc, self.interval = total, initial, desc, interval
        self.file = file if file is not None else sys.stderr
        self._start_n = initial
        self._start = self._last = time.monotonic()
        self._print()  # say at once that the run started, and where (a resumed run starts past 0)

    def _print(self) -> None:
        elapsed = time.monotonic() - self._start
        done = self.n - self._start_n
        left = f", about {_clock(elapsed / done * (self.total - self.n))} left" if done > 0 and self.n < self.total else ""
        resumed = f" (resumed at step {self._start_n})" if self._start_n else ""
        print(f"{self.desc}: step {self.n}/{self.total}{resumed}, {_clock(elapsed)} elapsed{left}", file=self.file, flush=True)

    def update(self, steps: int = 1) -> None:
        self.n += steps
        now = time.monotonic()
        if now - self._last >= self.interval or self.n == self.total:
            self._last = now
            self._print()

    def close(self) -> None:
        """Nothing to clear: every line printed stays in the log."""


def progress_bar(total: int, initial: int = 0, desc: str = "", enabled: bool = True, interval: float = LINE_INTERVAL) -> Any:
    """A tqdm bar when stderr is a terminal, ProgressLines when it is not, a silent counter when disabled."""
    from tqdm.auto import tqdm

    if enabled and not sys.stderr.isatty():
        return ProgressLines(total, initial, desc, interval)
    return tqdm(total=total, initial=initial, disable=not enabled, desc=desc, leave=False)
