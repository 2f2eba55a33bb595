"""A worker's life tied to its parent's: a killed bench or evaluation leaves no run training, an interrupted one stops its workers."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from layerdescent.run import progress

PR_SET_PDEATHSIG = 1  # linux/prctl.h


STOP_GRACE = 10.0  # seconds an interrupted worker has to stop at its run's next step before it is killed


def _watch_parent(parent: int) -> None:
    """Exit as soon as the bench that started this worker is gone (where PR_SET_PDEATHSIG is not available)."""
    while True:
        if os.getppid() != parent:
            os._exit(1)
        time.sleep(0.2)  # within the 2 s a user waits for a killed bench's workers to go


@contextlib.contextmanager
def stopping_workers(pool: ProcessPoolExecutor) -> Iterator[None]:
    """Pass an interrupt of the parent (Ctrl-C, or SIGTERM as the CLI turns it) on to ``pool``'s workers: runs not started never start, those training stop as a Ctrl-C stops them, resumable from their last checkpoint."""
    try:
        yield
    except KeyboardInterrupt:
        workers = [process for process in list((getattr(pool, "_processes", None) or {}).values()) if process.is_alive()]
        pool.shutdown(wait=False, cancel_futures=True)  # (it forgets the processes: they were taken first)
        for process in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGINT)
        deadline = time.monotonic() + STOP_GRACE
        for process in workers:
            process.join(max(deadline - time.monotonic(), 0.0))
            if process.is_alive():  # stuck where Python cannot raise: its checkpoint is atomic, so killing it loses nothing saved
                process.kill()
        raise


# Whether this worker is running a job (see :func:`job`), and whether an interrupt came while it was not.
_working = False
_interrupted = False


def _on_interrupt(signum: int, frame: Any) -> None:
    """A worker's SIGINT: a job under way stops as Ctrl-C stops it; a worker waiting for one stays quiet (no traceback) and starts none."""
    global _interrupted
    _interrupted = True
    if _working:
        raise KeyboardInterrupt


def job(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` as a pool worker's job, submitted as ``pool.submit(job, fn, ...)``: an interrupt stops it (see :func:`worker_init`)."""
    global _working
    if _interrupted:  # the pool had queued it before the interrupt: it never starts
        raise KeyboardInterrupt
    _working = True
    try:
        return fn(*args, **kwargs)
    finally:
        _working = False


def worker_init(parent: int) -> None:
    """Tie a worker's life to its parent's (a bench's, an evaluation's): a killed parent leaves no run going on.

    An idle worker ignores an interrupt (Ctrl-C reaches the whole process group): its parent shuts the
    pool down, which ends it without the traceback a KeyboardInterrupt in the pool's queue would print.
    """
    signal.signal(signal.SIGINT, _on_interrupt)
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:  # the bench died before the signal was armed
        os._exit(1)
    progress.share_terminal()  # one terminal, several runs: timed lines, not bars drawn over each other
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True, name="layerdescent-parent-watch").start()
