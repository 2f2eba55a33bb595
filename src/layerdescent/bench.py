"""Run variants x seeds from one file and summarize them against the ERM baseline.

    # benchmarks/lista.toml: a run config plus a [bench] table
    [bench]
    seeds = [0, 1, 2]
    [bench.variants.erm]
    solver.name = "erm"
    [bench.variants.primal-dual]
    solver.name = "primal-dual"

    layerdescent bench benchmarks/lista.toml --out benchmarks/results/lista

Each variant's table is merged into the base config. Every run lands in ``OUT/VARIANT/seed-N``;
a finished run (its ``results.json`` exists) is not run again and an interrupted one resumes,
so a bench that stopped halfway continues where it was.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from layerdescent.config import RunConfig, apply_overrides, config_from_dict, read_toml
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


def plan(path: str | Path, out: str | Path, overrides: list[str] = (), registry: Registry | None = None) -> list[BenchRun]:
    """Validate every run of a bench file before any of them trains."""
    data = apply_overrides(read_toml(path), list(overrides))
    bench = data.pop("bench", None)
    if not isinstance(bench, dict):
        raise ConfigError(f"{path} has no [bench] table (a plain run file goes to `layerdescent run`)")
    unknown = set(bench) - {"seeds", "variants"}
    if unknown:
        raise ConfigError(f"unknown key bench.{sorted(unknown)[0]} (allowed: seeds, variants)")
    seeds = bench.get("seeds", [0])
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds):
        raise ConfigError("bench.seeds must be a non-empty list of integers")
    if len(set(seeds)) != len(seeds):
        raise ConfigError("bench.seeds lists a seed twice")
    variants = bench.get("variants", {})
    if not isinstance(variants, dict) or not variants:
        raise ConfigError("bench.variants must hold at least one table, e.g. [bench.variants.erm] solver.name = \"erm\"")
    runs = []
    for name, override in variants.items():
        if not isinstance(override, dict):
            raise ConfigError(f"bench.variants.{name} must be a table of config overrides")
        for seed in seeds:
            merged = merge(data, {**override, "seed": seed, "label": name})
            try:
                config = config_from_dict(merged, registry)
            except ConfigError as exc:
                raise ConfigError(f"bench.variants.{name}: {exc}") from None
            runs.append(BenchRun(name, seed, config, Path(out) / name / f"seed-{seed}"))
    return runs


def run_bench(
    path: str | Path,
    out: str | Path,
    overrides: list[str] = (),
    registry: Registry | None = None,
    on_run: Callable[[BenchRun, str], None] | None = None,
    command: str | None = None,
) -> Path:
    """Train every pending run of the bench file, then write ``summary.md`` and plots in ``out``.

    ``command`` is how the summary says it was made (default: the equivalent `layerdescent bench`).
    """
    for run in plan(path, out, overrides, registry):
        if (run.run_dir / "results.json").exists():
            status = "done"
        else:
            resume = (run.run_dir / "checkpoint.pt").exists()
            train(run.config, run.run_dir, resume=resume, registry=registry)
            status = "resumed" if resume else "trained"
        if on_run:
            on_run(run, status)
    command = command or " ".join(["layerdescent bench", str(path), "--out", str(out), *(f"--set {o}" for o in overrides)])
    return write_report(Path(out), title=f"Bench {Path(path).name}", note=f"Made by `{command}`.")


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
