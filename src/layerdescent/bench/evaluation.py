"""A bench's finished runs tested again, each into a new folder of the same layout, one or several at a time."""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

from layerdescent.analysis.report import write_report
from layerdescent.bench.executors import worker_init
from layerdescent.bench.executors.watchdog import job as pool_job
from layerdescent.bench.executors.watchdog import stopping_workers
from layerdescent.errors import ConfigError, LayerdescentError
from layerdescent.registry import Registry
from layerdescent.run import files, layout, publish, rundir
from layerdescent.run.config_file import read_toml
from layerdescent.run.reevaluate import evaluate_config, evaluate_run

# What only a trained run writes; an evaluation writes config.toml and results.json alone.
RUN_ONLY = ("checkpoint.pt", "best.pt", "metrics.jsonl", layout.MODEL_FILE)


def _check_evaluation_out(root: Path, out: Path, runs: list[Path]) -> None:
    """Raise ConfigError unless ``out`` holds nothing but earlier evaluations of ``runs`` (and no summary or plot of yours)."""
    if root.resolve().is_relative_to(out.resolve()):
        raise ConfigError(f"--out {out} holds {root}, the runs it tests: the new results would mix with them; --out a directory outside it")
    if not out.is_dir():
        return
    for run_dir in runs:
        files.refuse_linked_path(out, out / run_dir.relative_to(root))
    sources = {(out / run_dir.relative_to(root)).resolve(): run_dir for run_dir in runs}
    for target in sources:
        present = [name for name in RUN_ONLY if (target / name).exists()]
        if present:
            raise ConfigError(
                f"--out {out}: {target} holds a run ({present[0]}), which the evaluation would overwrite: --out a new directory"
            )
    for path in rundir.result_files(out):
        evaluation = rundir.json_object(path)
        if path.parent.resolve() not in sources or "evaluated_from" not in evaluation:
            raise ConfigError(f"--out {out} holds a run or bench ({path}) that is not an evaluation of {root}: --out a new directory")
        # An evaluation copies its run's training record (steps, step times, final multipliers), so a path moved since still matches.
        source = rundir.json_object(sources[path.parent.resolve()] / "results.json")
        if any(evaluation.get(key) != source.get(key) for key in ("label", "seed", "train", "constraints")):
            raise ConfigError(
                f"--out {out}: {path} is an evaluation of another run than {sources[path.parent.resolve()]}: --out a new directory"
            )
    publish.refuse_foreign(out, "evaluation")


def _evaluate_in_pool(
    root: Path, out: Path, todo: list[Path], overrides: list[str], workers: int, on_run: Callable[[Path, str], None] | None
) -> None:
    """Evaluate ``todo`` in ``workers`` processes of one torch thread, told as each ends; the first error cancels the rest and is raised."""
    with (
        ProcessPoolExecutor(min(workers, len(todo)), initializer=worker_init, initargs=(os.getpid(),)) as pool,
        stopping_workers(pool),  # an interrupt stops the workers too
    ):
        jobs = {
            pool.submit(pool_job, evaluate_run, run_dir, out / run_dir.relative_to(root), overrides, None, 1): run_dir for run_dir in todo
        }
        for job in as_completed(jobs):
            if isinstance(job.exception(), BrokenProcessPool):  # a worker killed (by a signal, or out of memory) takes the pool down
                left = sum(not (out / run_dir.relative_to(root) / "results.json").exists() for run_dir in todo)
                raise LayerdescentError(
                    f"an evaluation worker stopped before its run was evaluated (killed, or out of memory): the evaluated runs are kept; the same command again evaluates the {left} left"
                )
            if job.exception() is not None:
                pool.shutdown(wait=True, cancel_futures=True)  # those under way finish (and are kept); the rest never start
                raise job.exception()
            if on_run:
                on_run(out / jobs[job].relative_to(root), "evaluated")


def evaluate_bench(
    root: str | Path,
    out: str | Path,
    overrides: list[str] = (),
    registry: Registry | None = None,
    on_run: Callable[[Path, str], None] | None = None,
    command: str | None = None,
    workers: int = 1,
) -> Path:
    """Test every finished run under ``root`` again into the same layout under ``out``, then report.

    A run already evaluated in ``out`` is not evaluated again, so an interrupted call continues.
    ``workers`` > 1 evaluates that many runs at once, each in its own process on one torch thread
    (which find plugins through entry points, as a bench's workers do); the first error stops the rest.
    """
    if workers < 1:
        raise ConfigError(f"--workers must be at least 1, got {workers}")
    root, out = Path(root), Path(out)
    if not root.is_dir():
        raise ConfigError(f"{root} is not a directory of runs")
    if out.resolve() == root.resolve() or out.resolve().is_relative_to(root.resolve()):
        raise ConfigError(
            f"--out {out} lies inside {root}: the new results would mix with the runs they test; --out a directory outside it"
        )
    runs = [p.parent for p in rundir.result_files(root)]
    if not runs:
        raise ConfigError(f"no finished run (results.json) under {root}")
    _check_evaluation_out(root, out, runs)
    status = {}
    for run_dir in runs:  # every finished evaluation is checked before anything is evaluated
        target = out / run_dir.relative_to(root)
        status[run_dir] = done = (target / "results.json").exists() and (target / "config.toml").exists()
        if done:
            difference = rundir.config_difference(
                read_toml(target / "config.toml"), evaluate_config(run_dir, overrides, registry), registry
            )
            if difference:
                raise ConfigError(
                    f"{target} was evaluated under another config, first at {difference}: --out a new directory, or remove it to evaluate again"
                )
    todo = [run_dir for run_dir in runs if not status[run_dir]]
    if workers > 1 and len(todo) > 1:
        for run_dir in runs:
            if status[run_dir] and on_run:
                on_run(out / run_dir.relative_to(root), "done")
        _evaluate_in_pool(root, out, todo, list(overrides), workers, on_run)
    else:
        for run_dir in runs:
            target = out / run_dir.relative_to(root)
            if not status[run_dir]:
                if on_run:
                    on_run(target, "evaluating")  # loading a model can take a while: say at once which run is under way
                evaluate_run(run_dir, target, overrides, registry)
            if on_run:
                on_run(target, "done" if status[run_dir] else "evaluated")
    command = command or " ".join(["layerdescent evaluate", str(root), "--out", str(out), *(f"--set {o}" for o in overrides)])
    return write_report(out, title=f"Re-evaluation of {root}", note=f"Made by `{command}` from the final models of {root}.")
