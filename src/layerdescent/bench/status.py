"""Where each run of a bench stands (done, training, failed, stopped, pending), and the training time left."""

from __future__ import annotations

import statistics
from pathlib import Path

from layerdescent.bench.plan import BenchRun, plan, select
from layerdescent.registry import Registry
from layerdescent.run import lock, rundir


def run_state(run: BenchRun, registry: Registry | None = None) -> tuple[str, str]:
    """Where one run stands, read from its directory without touching it: a state and its details.

    The state is one of done, training (a live process holds the directory), failed (its
    failure.json says why, until it trains again), stopped (a checkpoint to resume from), pending,
    or conflict (the directory holds a run under another config, which the bench would refuse).
    """
    conflict = rundir.conflict(run.run_dir, run.config, registry)
    if conflict:
        return "conflict", conflict
    if (run.run_dir / "results.json").exists():
        return "done", ""
    epochs = run.config.train.epochs
    where = _position(rundir.last_record(run.run_dir), epochs)
    pid = lock.holder(run.run_dir) if run.run_dir.is_dir() else None
    if pid is not None:
        return "training", ", ".join(filter(None, [f"pid {pid}", where]))
    failed = rundir.failure(run.run_dir)
    if failed:
        error = str(failed.get("error") or "").strip() or "no error recorded"
        where = (
            f"in its final evaluation, after step {failed.get('step')}"
            if failed.get("stage") == "evaluation"
            else f"at {_position(failed, epochs)}"
        )
        return "failed", f"{where}: {error.splitlines()[0]}"
    if (run.run_dir / "checkpoint.pt").exists():
        return "stopped", f"at {where or 'its checkpoint'}; the bench resumes it"
    return "pending", ""


def _position(record: dict | None, epochs: int) -> str:
    """Where a log record or a failure.json says the run was: "step S, epoch E of N" (epochs shown from 1), or "" for none."""
    if not record:
        return ""
    epoch = record.get("epoch")
    return f"step {record.get('step')}" + (f", epoch {epoch + 1} of {epochs}" if isinstance(epoch, int) else "")


STATES = ("done", "training", "failed", "stopped", "pending", "conflict")


def bench_status(
    path: str | Path, out: str | Path, overrides: list[str] = (), only: list[str] = (), registry: Registry | None = None
) -> list[tuple[BenchRun, str, str]]:
    """Every run of the bench (those ``only`` selects) with its :func:`run_state`; trains and writes nothing."""
    return [(run, *run_state(run, registry)) for run in select(plan(path, out, overrides, registry, build_tasks=False), list(only))]


def time_left(runs: list[tuple[BenchRun, str, str]]) -> tuple[float, int, int] | None:
    """About how long the unfinished runs of ``bench_status`` have left to train: (seconds, runs at a time, finished runs it is read from).

    A run's training time is its steps times its median step time (``results.json``). An unfinished
    run is expected to take what the finished runs of its variant took (of the bench, where its
    variant has none), less the share of their steps it has done; the total is divided by the runs
    training now (at least 1). Evaluations are not counted, nor failed runs; None before any run finished.
    """
    finished: dict[str, list[tuple[float, int]]] = {}
    for run, state, _ in runs:
        train = rundir.json_object(run.run_dir / "results.json").get("train", {}) if state == "done" else {}
        steps, step_time = train.get("steps"), train.get("step_time_median")
        if isinstance(steps, int) and isinstance(step_time, (int, float)):
            finished.setdefault(run.variant, []).append((steps * step_time, steps))
    if not finished:
        return None
    every = [entry for entries in finished.values() for entry in entries]
    seconds = 0.0
    for run, state, _ in runs:
        if state not in ("training", "stopped", "pending"):
            continue
        taken = finished.get(run.variant, every)
        expected, steps = statistics.median(t for t, _ in taken), statistics.median(n for _, n in taken)
        record = rundir.last_record(run.run_dir) if state != "pending" else None
        done = record.get("step", 0) if record else 0
        seconds += expected * max(0.0, 1 - done / steps) if steps else expected
    at_once = max(1, sum(state == "training" for _, state, _ in runs))
    return seconds / at_once, at_once, len(every)
