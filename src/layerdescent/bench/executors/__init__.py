"""Executors: where a bench's runs train; the contract in ``base``, the built-in local, Ray and SLURM executors beside it."""

from __future__ import annotations

from layerdescent.bench.executors.base import (
    MARKER,
    Executor,
    ExecutorChoice,
    ExecutorOptions,
    Job,
    RunFailure,
    RunsFailed,
    choose_executor,
    executor_class,
    executor_table,
    failure_report,
)
from layerdescent.bench.executors.local import Local
from layerdescent.bench.executors.ray import Ray, RayOptions
from layerdescent.bench.executors.slurm import Slurm, SlurmOptions
from layerdescent.bench.executors.watchdog import worker_init
from layerdescent.hookspecs import hookimpl


@hookimpl
def register_executors(register) -> None:
    """The built-in executors go through the same hook a third-party plugin uses."""
    for executor in (Local, Ray, Slurm):
        register(executor)


__all__ = [
    "MARKER",
    "Executor",
    "ExecutorChoice",
    "ExecutorOptions",
    "Job",
    "Local",
    "Ray",
    "RayOptions",
    "RunFailure",
    "RunsFailed",
    "Slurm",
    "SlurmOptions",
    "choose_executor",
    "executor_class",
    "executor_table",
    "failure_report",
    "worker_init",
]
