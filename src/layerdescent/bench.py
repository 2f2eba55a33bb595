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

Every run lands in ``OUT/VARIANT/seed-N``; a finished run (its ``results.json`` exists) is not
run again and an interrupted one resumes, so a bench that stopped halfway continues where it
was. ``workers > 1`` trains independent runs in that many processes, one torch thread each.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from layerdescent.config import RunConfig, apply_overrides, config_from_dict, read_toml, set_path
from layerdescent.errors import ConfigError
from layerdescent.registry import Registry
from layerdescent.report import write_report
from layerdescent.trainer import evaluate_run, train


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


def _flatten(table: Any, prefix: str = "") -> dict[str, Any]:
    """``{"solver": {"dual_lr": [...]}}`` and ``{"solver.dual_lr": [...]}`` alike as dotted keys."""
    if not isinstance(table, dict):
        return {prefix.rstrip("."): table}
    out: dict[str, Any] = {}
    for key, value in table.items():
        out.update(_flatten(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value})
    return out


def _short(value: Any) -> str:
    """A grid value as it appears in a run's name (and directory)."""
    return f"{value:g}" if isinstance(value, float) else str(value)


def plan(path: str | Path, out: str | Path, overrides: list[str] = (), registry: Registry | None = None) -> list[BenchRun]:
    """Validate every run of a bench file before any of them trains."""
    data = apply_overrides(read_toml(path), list(overrides))
    bench = data.pop("bench", None)
    if not isinstance(bench, dict):
        raise ConfigError(f"{path} has no [bench] table (a plain run file goes to `layerdescent run`)")
    unknown = set(bench) - {"seeds", "variants", "grid"}
    if unknown:
        raise ConfigError(f"unknown key bench.{sorted(unknown)[0]} (allowed: seeds, variants, grid)")
    seeds = bench.get("seeds", [0])
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds):
        raise ConfigError("bench.seeds must be a non-empty list of integers")
    if len(set(seeds)) != len(seeds):
        raise ConfigError("bench.seeds lists a seed twice")
    variants = bench.get("variants", {})
    if not isinstance(variants, dict) or not variants:
        raise ConfigError("bench.variants must hold at least one table, e.g. [bench.variants.erm] solver.name = \"erm\"")
    grid = _flatten(bench.get("grid", {}))
    if not all(isinstance(v, list) and v for v in grid.values()):
        raise ConfigError('bench.grid must map dotted config keys to non-empty lists, e.g. "solver.dual_lr" = [0.1, 1.0]')
    runs = []
    for variant, override in variants.items():
        if not isinstance(override, dict):
            raise ConfigError(f"bench.variants.{variant} must be a table of config overrides")
        override = dict(override)
        variant_seeds = override.pop("seeds", seeds)  # e.g. one seed for an ablation beside three-seed baselines
        if not isinstance(variant_seeds, list) or not variant_seeds or not all(isinstance(s, int) and not isinstance(s, bool) for s in variant_seeds):
            raise ConfigError(f"bench.variants.{variant}.seeds must be a non-empty list of integers")
        for point in itertools.product(*grid.values()):
            name = ",".join([variant, *(f"{key.rsplit('.', 1)[-1]}={_short(value)}" for key, value in zip(grid, point))])
            for seed in variant_seeds:
                merged = merge(data, {**override, "seed": seed, "label": name})
                try:
                    for key, value in zip(grid, point):
                        set_path(merged, key, copy.deepcopy(value))
                    config = config_from_dict(merged, registry)
                except ConfigError as exc:
                    raise ConfigError(f"bench.variants.{name}: {str(exc).removeprefix('--set ')}") from None
                runs.append(BenchRun(name, seed, config, Path(out) / name / f"seed-{seed}"))
    return runs


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


def _train_one(run: BenchRun, resume: bool) -> None:
    """A worker process's job: one run on one torch thread."""
    config = dataclasses.replace(run.config, train=dataclasses.replace(run.config.train, threads=1))
    train(config, run.run_dir, resume=resume)


def run_bench(
    path: str | Path,
    out: str | Path,
    overrides: list[str] = (),
    registry: Registry | None = None,
    on_run: Callable[[BenchRun, str], None] | None = None,
    command: str | None = None,
    workers: int = 1,
) -> Path:
    """Train every pending run of the bench file, then write ``summary.md`` and plots in ``out``.

    ``command`` is how the summary says it was made (default: the equivalent `layerdescent bench`).
    Worker processes find plugins through entry points, so ``registry`` applies only with one worker.
    """
    if workers < 1:
        raise ConfigError(f"--workers must be at least 1, got {workers}")
    pending = []
    runs = plan(path, out, overrides, registry)
    for run in runs:
        _check_same_task(run)  # before anything trains: a folder of another task's runs is never mixed in
    for run in runs:
        if (run.run_dir / "results.json").exists():
            if on_run:
                on_run(run, "done")
        else:
            pending.append((run, (run.run_dir / "checkpoint.pt").exists()))
    if workers == 1:
        for run, resume in pending:
            train(run.config, run.run_dir, resume=resume, registry=registry)
            if on_run:
                on_run(run, "resumed" if resume else "trained")
    else:
        with ProcessPoolExecutor(workers) as pool:
            jobs = [(run, resume, pool.submit(_train_one, run, resume)) for run, resume in pending]
            for run, resume, job in jobs:
                job.result()  # the first failure stops the bench with its own error
                if on_run:
                    on_run(run, "resumed" if resume else "trained")
    command = command or " ".join(["layerdescent bench", str(path), "--out", str(out), *(f"--set {o}" for o in overrides)])
    return write_report(Path(out), title=f"Bench {Path(path).name}", note=f"Made by `{command}`.", workers=workers)


def evaluate_bench(
    root: str | Path,
    out: str | Path,
    overrides: list[str] = (),
    registry: Registry | None = None,
    on_run: Callable[[Path, str], None] | None = None,
    command: str | None = None,
) -> Path:
    """Test every finished run under ``root`` again into the same layout under ``out``, then report.

    A run already evaluated in ``out`` is not evaluated again, so an interrupted call continues.
    """
    root, out = Path(root), Path(out)
    runs = sorted(p.parent for p in root.rglob("results.json"))
    if not runs:
        raise ConfigError(f"no finished run (results.json) under {root}")
    for run_dir in runs:
        target = out / run_dir.relative_to(root)
        done = (target / "results.json").exists()
        if not done:
            evaluate_run(run_dir, target, overrides, registry)
        if on_run:
            on_run(target, "done" if done else "evaluated")
    command = command or " ".join(["layerdescent evaluate", str(root), "--out", str(out), *(f"--set {o}" for o in overrides)])
    return write_report(out, title=f"Re-evaluation of {root}", note=f"Made by `{command}` from the final models of {root}.")
