"""The local executor: runs in the bench's process, or in a pool of processes of one torch thread each."""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from layerdescent.bench.executors.base import Executor, RunFailure, environment, failed_status, run_failure
from layerdescent.bench.executors.watchdog import job, stopping_workers, worker_init


def _train_one(run: Any, resume: bool) -> None:
    """A worker process's job: one run on one torch thread."""
    from layerdescent.run.trainer import train

    config = dataclasses.replace(run.config, train=dataclasses.replace(run.config.train, threads=1))
    train(config, run.run_dir, resume=resume)


def _settle(
    run: Any, resume: bool, outcome: Callable[[], Any], out: Path, failures: list, on_run: Callable[[Any, str], None] | None
) -> None:
    """Wait for one run's ``outcome`` and tell how it ended; a failed run is recorded and the others go on."""
    try:
        outcome()
        status = "resumed" if resume else "trained"
    except Exception as exc:
        failures.append(run_failure(run, out, exc))
        status = failed_status(failures[-1])
    if on_run:
        on_run(run, status)


class Local(Executor):
    """This machine: --workers N processes of one torch thread each (default: one run at a time, in the bench's process)."""

    name = "local"

    def run(self, pending: list[tuple[Any, bool]], on_run: Callable[[Any, str], None] | None = None) -> tuple[list[RunFailure], int | None]:
        from layerdescent.run.trainer import train

        workers, failures = self.options.workers or 1, []
        if workers == 1:
            with environment(self.env):  # for the block and the workers it starts
                for run, resume in pending:
                    _settle(
                        run,
                        resume,
                        functools.partial(train, run.config, run.run_dir, resume=resume, registry=self.registry),
                        self.out,
                        failures,
                        on_run,
                    )
        else:
            with (
                environment(self.env),
                ProcessPoolExecutor(workers, initializer=worker_init, initargs=(os.getpid(),)) as pool,
                stopping_workers(pool),  # an interrupt stops the workers too
            ):
                jobs = {pool.submit(job, _train_one, run, resume): (run, resume) for run, resume in pending}
                for done in as_completed(jobs):  # told as each ends
                    _settle(*jobs[done], done.result, self.out, failures, on_run)
        return failures, workers
