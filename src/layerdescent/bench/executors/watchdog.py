"""A worker's life tied to its parent's: a killed bench or evaluation leaves no run training."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

from layerdescent.run import progress

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _watch_parent(parent: int) -> None:
    """Exit as soon as the bench that started this worker is gone (where PR_SET_PDEATHSIG is not available)."""
    while True:
        if os.getppid() != parent:
            os._exit(1)
        time.sleep(1.0)


def worker_init(parent: int) -> None:
    """Tie a worker's life to its parent's (a bench's, an evaluation's): a killed parent leaves no run going on."""
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
