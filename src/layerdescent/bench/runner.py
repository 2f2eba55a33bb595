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

``baselines``, ``[bench.primary]`` and ``[bench.tuning]`` say how the summary judges the runs (the
solvers constrained variants are judged against, the pre-registered family, the tuning budgets;
see ``layerdescent.analysis.endpoints``); they are checked with the rest before anything trains.

Every run lands in ``OUT/VARIANT/seed-N``; a finished run (its ``results.json`` exists) whose
recorded config is the one asked for is not run again and an interrupted one resumes, so a bench
that stopped halfway continues where it was; a finished run under another config is refused.
The runs train on a registered executor (``layerdescent.bench.executors``): by default this process,
or with ``workers > 1`` that many processes of one torch thread each, which die with the bench.
"""

from __future__ import annotations

import copy
import dataclasses
import fnmatch
import itertools
import json
import math
import os
import statistics
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from layerdescent.analysis.endpoints import BenchSpec, parse_spec
from layerdescent.analysis.report import write_report
from layerdescent.bench.executors import (
    ExecutorChoice,
    ExecutorOptions,
    RunFailure,
    choose_executor,
    executor_class,
    executor_table,
    failure_report,
    worker_init,
)
from layerdescent.bench.trackers import BENCH_ENV, STORE_ENV
from layerdescent.errors import ConfigError
from layerdescent.options import flat_keys
from layerdescent.registry import Registry
from layerdescent.run import files, layout, lock, publish, rundir
from layerdescent.run.config import RunConfig, apply_overrides, check_depth, check_seed, config_from_dict, read_toml, set_path
from layerdescent.run.guard import build_task
from layerdescent.run.reevaluate import evaluate_config, evaluate_run
from layerdescent.run.tracking import check_trackers


@dataclass(frozen=True)
class BenchRun:
    """One variant at one seed, and where it runs."""

    variant: str
    seed: int
    config: RunConfig
    run_dir: Path


def merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``override``'s tables merged in recursively (arrays replaced whole)."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _short(value: Any, exact: bool = False) -> str:
    """A grid value as it appears in a run's name (and directory); ``exact`` keeps every digit of a float."""
    if isinstance(value, float):
        return repr(value) if exact else f"{value:g}"
    if isinstance(value, str):
        # A path (a model directory) is named by its last part: a name is one path component.
        tail = value.replace("\\", "/").rstrip("/").rsplit("/", 1)[-1]
        return tail if tail not in ("", ".", "..") else "_"
    return str(value)


def _grid_names(key: str, values: list[Any]) -> list[str]:
    """How each value of one grid key appears in run names: distinct values get distinct names, or ConfigError."""
    for exact in (False, True):
        names = [_short(v, exact) for v in values]
        if len(set(names)) == len(names):
            return names
    first = next(n for n in names if names.count(n) > 1)
    clashing = [v for v, n in zip(values, names) if n == first]
    raise ConfigError(
        f"bench.grid.{key}: values {clashing[0]!r} and {clashing[1]!r} would share the run name {first!r}; give the grid distinct values"
    )


MAX_RUNS = 10_000  # runs in one bench: far above any real sweep, and a typo'd grid or seed list is refused before it is planned


def _check_seeds(seeds: Any, key: str) -> list[int]:
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds):
        raise ConfigError(f"{key} must be a non-empty list of integers")
    if len(set(seeds)) != len(seeds):
        raise ConfigError(f"{key} lists a seed twice")
    for i, seed in enumerate(seeds):
        check_seed(seed, f"{key}[{i}]")
    return seeds


def _check_variant_name(name: Any) -> str:
    """A variant's name, refused in one line unless it can name one directory."""
    if not isinstance(name, str) or not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
        raise ConfigError(
            f"bench.variants.{name!r} is not a plain name: a variant's name is one directory under --out (no '/', not '.' or '..')"
        )
    return name


BENCH_KEYS = {"seeds", "variants", "grid", "executor", "baselines", "primary", "tuning"}


def blame(line: str, variant: str, overrides: list[str], own: set[str]) -> str:
    """A config error's line prefixed with what the user typed: the ``--set`` it concerns (unless the variant's ``own`` keys replace it), else the variant."""
    for override in overrides:
        key = override.partition("=")[0].strip()
        if (
            key not in own
            and any(line.startswith(f"{start}{key}{end}") for start in ("", "unknown key ") for end in (" ", ";", "[", ":", "."))
        ) or line == f"unknown key {key}":
            return f"--set {override}: {line}"
    return f"{variant}: {line}"


def plan(path: str | Path, out: str | Path, overrides: list[str] = (), registry: Registry | None = None) -> list[BenchRun]:
    """Validate every run of a bench file before any of them trains."""
    data = apply_overrides(read_toml(path), list(overrides))
    bench = data.pop("bench", None)
    if not isinstance(bench, dict):
        raise ConfigError(f"{path} has no [bench] table (a plain run file goes to `layerdescent run`)")
    unknown = set(bench) - BENCH_KEYS
    if unknown:
        raise ConfigError(f"unknown key bench.{sorted(unknown)[0]} (allowed: {', '.join(sorted(BENCH_KEYS))})")
    executor_table(bench)
    if "seed" in data:  # each run's seed comes from bench.seeds, but a mistyped one here is still a mistake
        if not isinstance(data["seed"], int) or isinstance(data["seed"], bool):
            raise ConfigError(f"seed must be an integer, got {data['seed']!r} (a bench's runs take their seeds from bench.seeds)")
        check_seed(data["seed"], "seed")
    seeds = _check_seeds(bench.get("seeds", [0]), "bench.seeds")
    variants = bench.get("variants", {})
    if not isinstance(variants, dict) or not variants:
        raise ConfigError('bench.variants must hold at least one table, e.g. [bench.variants.erm] solver.name = "erm"')
    grid = flat_keys(bench.get("grid", {}), arrays=False)
    if not all(isinstance(v, list) and v for v in grid.values()):
        raise ConfigError('bench.grid must map dotted config keys to non-empty lists, e.g. "solver.dual_lr" = [0.1, 1.0]')
    names = {key: _grid_names(key, values) for key, values in grid.items()}
    points = math.prod(len(values) for values in grid.values())
    count = (
        sum(len(v.get("seeds", seeds)) if isinstance(v, dict) and isinstance(v.get("seeds", seeds), list) else 1 for v in variants.values())
        * points
    )
    if count > MAX_RUNS:
        raise ConfigError(
            f"the bench has {count:,} runs (variants x grid points x seeds); at most {MAX_RUNS:,}: split it into several bench files"
        )
    runs, where, tasks = [], {}, {}
    for variant, override in variants.items():
        _check_variant_name(variant)
        if not isinstance(override, dict):
            raise ConfigError(f"bench.variants.{variant} must be a table of config overrides")
        override = dict(override)
        # e.g. one seed for an ablation beside three-seed baselines
        variant_seeds = _check_seeds(override.pop("seeds", seeds), f"bench.variants.{variant}.seeds")
        for point in itertools.product(*(range(len(v)) for v in grid.values())):
            name = ",".join([variant, *(f"{key.rsplit('.', 1)[-1]}={names[key][i]}" for key, i in zip(grid, point))])
            if name in where and where[name] != (variant, point):
                raise ConfigError(f"bench: variant {where[name][0]!r} and variant {variant!r} both name a run {name!r}; rename one of them")
            where[name] = (variant, point)
            for seed in variant_seeds:
                merged = merge(data, {**override, "seed": seed, "label": name})
                try:
                    for key, i in zip(grid, point):
                        set_path(merged, key, copy.deepcopy(grid[key][i]))
                    config = config_from_dict(merged, registry)
                    # the depth needs the built task; variants mostly share one, so it is built once each
                    key = repr(sorted(config.task.options.items())) + config.task.name
                    if key not in tasks:
                        tasks[key] = build_task(registry, config.task.name, config.task.options)
                    check_depth(config, tasks[key].num_layers, registry)
                    check_trackers(config.train.trackers, registry)
                except ConfigError as exc:
                    own = {*flat_keys(override, arrays=False), *grid}  # keys the variant or the grid set over a --set
                    lines = (blame(line.removeprefix("--set "), f"bench.variants.{name}", overrides, own) for line in str(exc).splitlines())
                    raise ConfigError("\n".join(dict.fromkeys(lines))) from None
                runs.append(BenchRun(name, seed, config, Path(out) / name / f"seed-{seed}"))
    spec = parse_spec(bench, [run.variant for run in runs])  # a bad [bench.primary] or baseline fails before anything trains
    if spec.primary:
        _check_primary(spec.primary, runs, tasks)
    return runs


def _check_primary(primary, runs: list[BenchRun], tasks: dict) -> None:
    """The primary metric is one the variants' task reports, and each primary split is test or a domain they are evaluated on."""
    for run in runs:
        if run.variant not in primary.variants + primary.adopted:
            continue
        task = tasks[repr(sorted(run.config.task.options.items())) + run.config.task.name]
        metrics = list(task.metrics().keys())
        if primary.metric not in metrics:
            raise ConfigError(
                f"bench.primary.metric: {primary.metric!r} is not a metric of task {run.config.task.name!r} (it reports: {', '.join(metrics) or 'none'})"
            )
        for split in primary.splits:
            if split != "test" and split not in run.config.eval.domains:
                raise ConfigError(
                    f"bench.primary.splits: variant {run.variant!r} is not evaluated on {split!r} (test, or one of its eval.domains: {', '.join(run.config.eval.domains) or 'none'})"
                )


def bench_spec(path: str | Path, overrides: list[str] = ()) -> BenchSpec:
    """The bench file's judging keys: its baselines, primary endpoints and tuning budgets."""
    return parse_spec(apply_overrides(read_toml(path), list(overrides)).get("bench", {}))


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


def select(runs: list[BenchRun], only: list[str]) -> list[BenchRun]:
    """The runs whose variant label matches one of the shell-style patterns ``only`` (all runs when it is empty)."""
    if not only:
        return runs
    chosen = [run for run in runs if any(fnmatch.fnmatchcase(run.variant, pattern) for pattern in only)]
    if not chosen:
        labels = ", ".join(dict.fromkeys(run.variant for run in runs))
        raise ConfigError(f"--only {' '.join(only)} matches no variant; the bench's are: {labels} (patterns as in the shell: * ? [seq])")
    return chosen


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
    pending, done, left = [], [], []
    runs = select(plan(path, out, overrides, registry), list(only))
    for run in runs:
        files.refuse_linked_path(Path(out), run.run_dir)  # OUT/VARIANT/seed-N all inside --out
        _check_same_task(run)  # before anything trains: a folder of another task's runs is never mixed in
    publish.refuse_foreign(Path(out))  # the summary and plots come last: a file of yours in their way is found first
    for run in runs:
        conflict = _conflict(run, registry)
        if conflict:
            raise ConfigError(f"{run.run_dir} {conflict}: --out a new directory for this config, or remove that run to train it again")
        if (run.run_dir / "results.json").exists():
            done.append(run)
        elif skip_failed and (failure := rundir.failure(run.run_dir)):
            left.append(RunFailure(run, str(failure.get("error") or "no error recorded"), []))
        else:
            pending.append((run, (run.run_dir / "checkpoint.pt").exists()))
    if before:
        before(len(pending), len(runs))
    for run in done:  # reported once every run is known to match, so nothing is called done and then refused
        if on_run:
            on_run(run, "done")
    for failure in left:
        if on_run:
            on_run(failure.run, "failed before, left as it is (--skip-failed)")
    failures, workers = executor_cls(executor.options, Path(out), tracker_env(path, out), registry).run(pending, on_run)
    failures += left
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
        spec=bench_spec(path, overrides),
    )
    if failures:
        raise failure_report(failures, len(runs), summary, len(left))
    return summary


def _conflict(run: BenchRun, registry: Registry | None) -> str | None:
    """How a run already in ``run.run_dir`` differs from the one asked for ("finished under another config, first at ..."), or None."""
    recorded = run.run_dir / "config.toml"
    finished = (run.run_dir / "results.json").exists()
    if recorded.exists() and (finished or (run.run_dir / "checkpoint.pt").exists()):
        difference = rundir.config_difference(read_toml(recorded), run.config, registry)
        if difference:
            return f"{'finished' if finished else 'started'} under another config, first at {difference}"
    return None


def run_state(run: BenchRun, registry: Registry | None = None) -> tuple[str, str]:
    """Where one run stands, read from its directory without touching it: a state and its details.

    The state is one of done, training (a live process holds the directory), failed (its
    failure.json says why, until it trains again), stopped (a checkpoint to resume from), pending,
    or conflict (the directory holds a run under another config, which the bench would refuse).
    """
    conflict = _conflict(run, registry)
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
    return [(run, *run_state(run, registry)) for run in select(plan(path, out, overrides, registry), list(only))]


def time_left(runs: list[tuple[BenchRun, str, str]]) -> tuple[float, int, int] | None:
    """About how long the unfinished runs of ``bench_status`` have left to train: (seconds, runs at a time, finished runs it is read from).

    A run's training time is its steps times its median step time (``results.json``). An unfinished
    run is expected to take what the finished runs of its variant took (of the bench, where its
    variant has none), less the share of their steps it has done; the total is divided by the runs
    training now (at least 1). Evaluations are not counted, nor failed runs; None before any run finished.
    """
    finished: dict[str, list[tuple[float, int]]] = {}
    for run, state, _ in runs:
        train = _json(run.run_dir / "results.json").get("train", {}) if state == "done" else {}
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


# What only a trained run writes; an evaluation writes config.toml and results.json alone.
RUN_ONLY = ("checkpoint.pt", "best.pt", "metrics.jsonl", layout.MODEL_FILE)


def _json(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``, or an empty one where it holds none (a damaged file is then no match for anything)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


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
        evaluation = _json(path)
        if path.parent.resolve() not in sources or "evaluated_from" not in evaluation:
            raise ConfigError(f"--out {out} holds a run or bench ({path}) that is not an evaluation of {root}: --out a new directory")
        # An evaluation copies its run's training record (steps, step times, final multipliers), so a path moved since still matches.
        source = _json(sources[path.parent.resolve()] / "results.json")
        if any(evaluation.get(key) != source.get(key) for key in ("label", "seed", "train", "constraints")):
            raise ConfigError(
                f"--out {out}: {path} is an evaluation of another run than {sources[path.parent.resolve()]}: --out a new directory"
            )
    publish.refuse_foreign(out, "evaluation")


def _evaluate_in_pool(
    root: Path, out: Path, todo: list[Path], overrides: list[str], workers: int, on_run: Callable[[Path, str], None] | None
) -> None:
    """Evaluate ``todo`` in ``workers`` processes of one torch thread, told as each ends; the first error cancels the rest and is raised."""
    with ProcessPoolExecutor(min(workers, len(todo)), initializer=worker_init, initargs=(os.getpid(),)) as pool:
        jobs = {pool.submit(evaluate_run, run_dir, out / run_dir.relative_to(root), overrides, None, 1): run_dir for run_dir in todo}
        for job in as_completed(jobs):
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
