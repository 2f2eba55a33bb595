"""Run variants x seeds from one file and summarize them against the ERM baseline.

    # a bench file: a run config plus a [bench] table
    [bench]
    seeds = [0, 1, 2]
    [bench.variants.erm]
    solver.name = "erm"
    [bench.variants.primal-dual]
    solver.name = "primal-dual"
    [bench.variants.live]                        # a variant may run fewer seeds
    seeds = [0]
    constraints = [{ kind = "descent", reference = "live" }]

    layerdescent bench benchmarks/lista.toml --out benchmarks/results/lista

Each variant's table is merged into the base config. A ``[bench.grid]`` table of dotted config
keys and value lists crosses every variant with every combination, named by the values:

    [bench.grid]
    "constraints.0.alpha" = [0.0, 0.05, 0.1]     # -> primal-dual,alpha=0 ... primal-dual,alpha=0.1

``baselines``, ``[bench.plan]`` (or its older form ``[bench.primary]``) and ``[bench.tuning]`` say how
the summary judges the runs (the solvers constrained variants are judged against, the declared
endpoints, the tuning budgets; see ``layerdescent.analysis.endpoints``); they are checked with the
rest before anything trains, and each run records the plan it was made under
(``layerdescent.analysis.registration``).

Every run lands in ``OUT/VARIANT/seed-N``; a finished run (its ``results.json`` exists) whose
recorded config is the one asked for is not run again and an interrupted one resumes, so a bench
that stopped halfway continues where it was; a finished run under another config is refused.
The runs train on a registered executor (``layerdescent.bench.executors``): by default this process,
or with ``workers > 1`` that many processes of one torch thread each, which die with the bench.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from layerdescent.analysis import registration, tuning, tuning_sampler
from layerdescent.analysis.endpoints import BenchSpec
from layerdescent.analysis.report import write_report
from layerdescent.bench.executors import (
    ExecutorChoice,
    ExecutorOptions,
    RunFailure,
    choose_executor,
    executor_class,
    failure_report,
)
from layerdescent.bench.plan import BenchRun, bench_spec, plan, select
from layerdescent.bench.trackers import BENCH_ENV, STORE_ENV
from layerdescent.errors import ConfigError
from layerdescent.registry import Registry
from layerdescent.run import files, publish, rundir
from layerdescent.run.config_file import apply_overrides, read_toml


def _check_same_task(run: BenchRun) -> None:
    """Refuse a run directory that already records a run of another task or solver (say, another demo's)."""
    recorded = run.run_dir / "config.toml"
    if not recorded.exists():
        return
    try:
        table = read_toml(recorded)
    except ConfigError:
        raise ConfigError(f"{recorded} is damaged; move {run.run_dir} away or choose another --out") from None
    theirs = (table.get("task", {}).get("name"), table.get("solver", {}).get("name"))
    ours = (run.config.task.name, run.config.solver.name)
    if theirs != ours:
        raise ConfigError(
            f"{run.run_dir} holds a run of task {theirs[0]!r} with solver {theirs[1]!r}, not {ours[0]!r} with {ours[1]!r}: "
            "choose another --out (nothing was trained)"
        )


def tracker_env(path: str | Path, out: str | Path) -> dict[str, str]:
    """What a bench tells its runs' trackers: one MLflow experiment named after the bench, one store in ``out``."""
    return {BENCH_ENV: Path(path).stem, STORE_ENV: str(Path(out).resolve() / "mlruns")}


def executor_choice(
    path: str | Path, overrides: list[str] = (), executor: str | None = None, registry: Registry | None = None, **given: Any
) -> ExecutorChoice:
    """The executor a bench runs on: ``executor`` (else its ``[bench.executor]`` name), that table's options, then ``given`` (flags)."""
    bench = apply_overrides(read_toml(path), list(overrides)).get("bench", {})
    return choose_executor(bench if isinstance(bench, dict) else {}, executor, registry, **given)


def _check_folder(runs: list[BenchRun], out: Path, spec: BenchSpec) -> None:
    """Before anything trains: every run inside --out, no folder of another task's runs, no summary of yours in the way."""
    for run in runs:
        files.refuse_linked_path(out, run.run_dir)  # OUT/VARIANT/seed-N all inside --out
        _check_same_task(run)  # a folder of another task's runs is never mixed in
    studies = [tuning_sampler.study_path(out, search).name for search in spec.searches.values() if search.sampler != "grid"]
    files.refuse_links(out, (tuning.ADOPTED, *studies))  # the tuning records, rewritten later, never through a link
    publish.refuse_foreign(out)  # the summary and plots come last: a file of yours in their way is found first


def _sorted_out(runs: list[BenchRun], registry: Registry | None, skip_failed: bool) -> tuple[list, list, list]:
    """The runs to train (each with whether it resumes), those done, and those left failed (``skip_failed``); a conflict refused."""
    pending, done, left = [], [], []
    for run in runs:
        conflict = rundir.conflict(run.run_dir, run.config, registry)
        if conflict:
            raise ConfigError(f"{run.run_dir} {conflict}: --out a new directory for this config, or remove that run to train it again")
        if (run.run_dir / "results.json").exists():
            done.append(run)
        elif skip_failed and (failure := rundir.failure(run.run_dir)):
            left.append(RunFailure(run, str(failure.get("error") or "no error recorded"), []))
        else:
            pending.append((run, (run.run_dir / "checkpoint.pt").exists()))
    return pending, done, left


def _tell(done: list[BenchRun], left: list[RunFailure], on_run: Callable[[BenchRun, str], None] | None) -> None:
    """Say which runs are done or left failed, once every run is known to match (so nothing is called done and then refused)."""
    if on_run:
        for run in done:
            on_run(run, "done")
        for failure in left:
            on_run(failure.run, "failed before, left as it is (--skip-failed)")


def _train(executor_cls, executor: ExecutorChoice, out: Path, environment: dict[str, str], registry, pending: list, spec, on_run):
    """Train ``pending`` on the executor, each run first recording the plan it is made under; (failures, workers)."""
    # so that a report can tell a plan changed after the runs began (tuning runs: under the tuning declaration alone)
    registration.record(out, [(os.path.relpath(run.run_dir, out), run.config.eval.split != "test") for run, _ in pending], spec)
    return executor_cls(executor.options, out, environment, registry).run(pending, on_run)


def _decide(spec: BenchSpec, out: Path) -> None:
    """Apply each declared search whose trials have all finished or failed, and record the decisions in ``OUT/tuning.json``."""
    decisions = tuning.read_adopted(out)
    changed = False
    for variant, search in spec.searches.items():
        if search.sampler != "grid":
            tuning_sampler.record_study(search, out)
        decision = tuning.decide(search, out)
        if decision is not None and decisions.get(variant) != decision:
            decisions[variant], changed = decision, True
    if changed:
        tuning.write_adopted(out, decisions)


def _refuse_unreachable(runs: list[BenchRun], pending: list, spec: BenchSpec, out: Path) -> None:
    """Main runs whose variant's trials have neither run nor are about to: refused before anything trains."""
    scheduled = {run.run_dir for run, _ in pending}
    for variant in dict.fromkeys(run.variant for run in runs if run.awaits):
        search = spec.search_for(variant)
        for name, _ in tuning.trials_of(search, out):
            for run_dir in search.run_dirs(out, name):
                if run_dir not in scheduled and not (run_dir / "results.json").exists() and rundir.failure(run_dir) is None:
                    _refuse_waiting([run for run in runs if run.variant == variant], spec, out)


def _refuse_waiting(runs: list[BenchRun], spec: BenchSpec, out: Path) -> None:
    """A tuned variant's main runs asked for before its search is decided, or when no trial qualified: one line saying which."""
    waiting = next((run for run in runs if run.awaits), None)
    if waiting is None:
        return
    variant, search = waiting.variant, spec.search_for(waiting.variant)
    if tuning.decide(search, out) is not None:  # decided, and still waiting: nothing was adopted
        raise ConfigError(
            f"bench.tuning.{search.variant}: no trial qualified ({search.qualify!r}, criterion {search.criterion!r}; "
            f"see {out / tuning.ADOPTED}): widen the search, or train {variant} at settings of its own"
        )
    raise ConfigError(
        f"bench.tuning.{search.variant}: {'its' if variant == search.variant else f'the {variant}'} main runs wait for its trials, which have not all run: "
        f"bench --only 'tune-{search.name or search.variant},*' first, or the bench without --only"
    )


def run_bench(
    path: str | Path,
    out: str | Path,
    overrides: list[str] = (),
    registry: Registry | None = None,
    on_run: Callable[[BenchRun, str], None] | None = None,
    command: str | None = None,
    workers: int = 1,
    executor: ExecutorChoice | None = None,
    only: list[str] = (),
    title: str | None = None,
    before: Callable[[int, int], None] | None = None,
    skip_failed: bool = False,
) -> Path | None:
    """Train every pending run of the bench file, then write ``summary.md`` and plots in ``out``.

    ``only`` (shell-style patterns on variant labels) trains those variants alone, say the tuning
    runs a later variant's setting is chosen from; every run is still validated first.
    ``command`` is how the summary says it was made (default: the equivalent `layerdescent bench`).
    Worker processes find plugins through entry points, so ``registry`` applies only to this
    process: the executor's name, and the runs themselves with one local worker.
    ``executor`` (default: the local pool of ``workers``) names any registered executor, Ray or
    SLURM say, with its options; with ``executor.options.wait`` false its jobs are submitted and None is returned, with no
    summary yet.
    ``title`` heads the summary (default: the bench file's name); ``before(pending, total)`` is called
    once every run is checked, before any trains (the demo says there what it is about to do).
    ``skip_failed`` leaves a run that failed before (its failure.json) as it is, not retried, and
    still counted failed: a resume is exact, so a divergence would only diverge again where it did.
    """
    executor = executor or ExecutorChoice("local", ExecutorOptions(workers=workers))
    if executor.name == "local":
        executor = dataclasses.replace(executor, options=dataclasses.replace(executor.options, workers=executor.options.workers or workers))
    executor_cls = executor_class(executor, registry)  # an unknown name or a missing package stops the bench before it plans
    runs = select(plan(path, out, overrides, registry), list(only))
    spec = bench_spec(path, overrides)
    _check_folder(runs, Path(out), spec)
    pending, done, left = _sorted_out([run for run in runs if not run.awaits], registry, skip_failed)
    if before:
        before(len(pending) + sum(run.awaits for run in runs), len(runs))
    _tell(done, left, on_run)
    _refuse_unreachable(runs, pending, spec, Path(out))  # before anything trains
    environment = tracker_env(path, out)
    failures = list(left)
    # every run that can train now does, a tuned variant's trials among them; its main runs wait for what they adopt
    failed, workers = _train(executor_cls, executor, Path(out), environment, registry, pending, spec, on_run)
    failures += failed
    _decide(spec, Path(out))  # with the trials of this bench or of an earlier one
    tried = {run.run_dir for run, _ in pending}
    # what the finished runs unlock trains next: a sampler's next round of trials, then the main runs of a decided search
    while executor.options.wait:
        runs = select(plan(path, out, overrides, registry), list(only))
        now = [(run, resume) for run, resume in _sorted_out([r for r in runs if not r.awaits], registry, skip_failed)[0]]
        now = [(run, resume) for run, resume in now if run.run_dir not in tried]
        if not now:
            _refuse_waiting(runs, spec, Path(out))
            break
        _check_folder([run for run, _ in now], Path(out), spec)
        failed, workers = _train(executor_cls, executor, Path(out), environment, registry, now, spec, on_run)
        failures += failed
        tried |= {run.run_dir for run, _ in now}
        _decide(spec, Path(out))
    if not executor.options.wait:
        return None
    command = command or " ".join(
        ["layerdescent bench", str(path), "--out", str(out), *(f"--set {o}" for o in overrides), *(f"--only '{o}'" for o in only)]
    )
    if failures and len(failures) == len(runs):
        raise failure_report(failures, len(runs), None, len(left))
    summary = write_report(
        Path(out),
        title=title or f"Bench {Path(path).name}",
        note=f"Made by `{command}`.",
        workers=workers,
        spec=spec,
    )
    if failures:
        raise failure_report(failures, len(runs), summary, len(left))
    return summary
