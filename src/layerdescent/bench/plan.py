"""A bench file's plan: its variants x grid points x seeds, each run's config checked before any run trains."""

from __future__ import annotations

import copy
import fnmatch
import itertools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from layerdescent.analysis.endpoints import JUDGING_KEYS, BenchSpec
from layerdescent.analysis.endpoints_file import parse_spec
from layerdescent.analysis.groups import KEPT_EPOCH, mean_domains
from layerdescent.analysis.tuning import checked_decision, read_adopted, trials_of
from layerdescent.analysis.tuning_search import BEST_VAL_LOSS, safe_name
from layerdescent.bench.executors import (
    executor_table,
)
from layerdescent.errors import ConfigError
from layerdescent.options import flat_keys, refuse_unknown
from layerdescent.registry import Registry
from layerdescent.run.config import RunConfig, check_depth, check_seed, config_from_dict
from layerdescent.run.config_file import apply_overrides, read_toml, set_path
from layerdescent.run.guard import build_task
from layerdescent.run.tracking import check_trackers


@dataclass(frozen=True)
class BenchRun:
    """One variant at one seed, and where it runs."""

    variant: str
    seed: int
    config: RunConfig
    run_dir: Path
    trial_of: str | None = None  # a tuning trial: the variant whose declared search it belongs to
    awaits: bool = False  # a tuned variant's main run before its search is decided (its config still the placeholder)


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


RUN_HELP = {
    "seeds": "the seeds every variant runs at (default [0]); a variant may list its own",
    "variants": "one table of config overrides per variant, by its label: [bench.variants.NAME]",
    "grid": "dotted config keys mapped to lists of values: every variant crossed with every combination",
    "executor": 'where the runs train: name = "local" (default), "ray" or "slurm", and that executor\'s options',
}
BENCH_KEYS = set(RUN_HELP) | JUDGING_KEYS  # what runs, and what judges them


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


def plan(
    path: str | Path, out: str | Path, overrides: list[str] = (), registry: Registry | None = None, build_tasks: bool = True
) -> list[BenchRun]:
    """Validate every run of a bench file before any of them trains; ``build_tasks=False`` checks all but what needs the task built.

    Without the tasks (``bench --status``, ``report --bench``: no assets needed) the depth and the
    metrics a task reports go unchecked; every key, variant, gamma and domain a plan names still is.
    """
    data = apply_overrides(read_toml(path), list(overrides))
    bench = data.pop("bench", None)
    if not isinstance(bench, dict):
        raise ConfigError(f"{path} has no [bench] table (a plain run file goes to `layerdescent run`)")
    unknown = set(bench) - BENCH_KEYS
    if "slurm" in unknown:  # the table of the releases before executors took options of their own
        raise ConfigError('bench.slurm is now [bench.executor]: name = "slurm" and the same keys (partition, time, mem_gb, ...)')
    refuse_unknown("bench", bench, BENCH_KEYS)
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
    spec = parse_spec(bench)  # the tuned variants, whose trials come first
    count = (
        sum(len(v.get("seeds", seeds)) if isinstance(v, dict) and isinstance(v.get("seeds", seeds), list) else 1 for v in variants.values())
        * points
    ) + sum(search.runs for search in spec.searches.values())
    if count > MAX_RUNS:
        raise ConfigError(
            f"the bench has {count:,} runs (variants x grid points x seeds, and tuning trials x seeds); "
            f"at most {MAX_RUNS:,}: split it into several bench files"
        )
    decided = read_adopted(Path(out))
    runs, where, tasks = [], {}, {}

    def build(merged: dict[str, Any], name: str, settings: dict[str, Any], own: set[str]) -> RunConfig:
        """One run's config, checked as a run's is: ``settings`` (dotted keys) set over ``merged``; errors blamed on what the user typed."""
        try:
            for key, value in settings.items():
                set_path(merged, key, copy.deepcopy(value))
            config = config_from_dict(merged, registry)
            # the depth needs the built task; variants mostly share one, so it is built once each
            key = repr(sorted(config.task.options.items())) + config.task.name
            if build_tasks and key not in tasks:
                tasks[key] = build_task(registry, config.task.name, config.task.options)
            if build_tasks:
                check_depth(config, tasks[key].num_layers, registry)
            check_trackers(config.train, registry)
        except ConfigError as exc:
            lines = (blame(line.removeprefix("--set "), f"bench.variants.{name}", overrides, own) for line in str(exc).splitlines())
            raise ConfigError("\n".join(dict.fromkeys(lines))) from None
        return config

    for variant, override in variants.items():
        _check_variant_name(variant)
        if not isinstance(override, dict):
            raise ConfigError(f"bench.variants.{variant} must be a table of config overrides")
        override = dict(override)
        # e.g. one seed for an ablation beside three-seed baselines
        variant_seeds = _check_seeds(override.pop("seeds", seeds), f"bench.variants.{variant}.seeds")
        own = {*flat_keys(override, arrays=False), *grid}  # keys the variant or the grid set over a --set
        search = spec.search_for(variant)  # its own, or the one whose adopted settings it takes
        adopted = None
        if search is not None:
            if grid:
                raise ConfigError(f"bench.tuning.{search.variant}: a variant the tool tunes cannot also be crossed with bench.grid")
            # recomputed from the trials' results, never read from tuning.json alone (which must agree with it)
            if decision := checked_decision(search, Path(out), decided):
                adopted = decision.get("adopted")  # None where no trial qualified: the main runs wait, and the bench says why
            for name, trial in trials_of(search, Path(out)) if search.variant == variant else ():
                if name in variants:
                    raise ConfigError(f"bench.tuning.{variant}: its trial {name!r} has the name of a variant; rename the variant")
                for seed, run_dir in zip(search.seeds, search.run_dirs(Path(out), name)):
                    merged = merge(data, {**override, "seed": seed, "label": name})
                    merged["eval"] = {**merged.get("eval", {}), "split": "validation", "gammas": list(search.gammas), "domains": []}
                    if search.criterion == BEST_VAL_LOSS:  # read from training's validation, which must run at the rule's gamma
                        merged["train"] = {**merged.get("train", {}), "validation_gamma": search.gamma}
                    config = build(merged, name, dict(trial), own)
                    if search.criterion == BEST_VAL_LOSS and not config.train.early_stopping:
                        raise ConfigError(
                            f"bench.tuning.{variant}: criterion {BEST_VAL_LOSS!r} is the validation loss of the epoch early stopping keeps; "
                            'set train.early_stopping, or read the criterion at the end ("loss")'
                        )
                    _check_criterion(search, config, tasks)
                    runs.append(BenchRun(name, seed, config, run_dir, trial_of=variant))
        for point in itertools.product(*(range(len(v)) for v in grid.values())):
            name = ",".join([variant, *(f"{key.rsplit('.', 1)[-1]}={names[key][i]}" for key, i in zip(grid, point))])
            if name in where and where[name] != (variant, point):
                raise ConfigError(f"bench: variant {where[name][0]!r} and variant {variant!r} both name a run {name!r}; rename one of them")
            where[name] = (variant, point)
            for seed in variant_seeds:
                merged = merge(data, {**override, "seed": seed, "label": name})
                settings = {key: grid[key][i] for key, i in zip(grid, point)} | (adopted or {})
                config = build(merged, name, settings, own)
                awaits = search is not None and adopted is None
                folder = safe_name(name, safe_name(variant))  # a grid value may hold any character; the label keeps it readable
                runs.append(BenchRun(name, seed, config, Path(out) / folder / f"seed-{seed}", awaits=awaits))
    _check_folders(runs, Path(out))
    spec = parse_spec(bench, [run.variant for run in runs])  # a bad [bench.primary] or baseline fails before anything trains
    if spec.primary:
        _check_primary(spec.primary, runs, tasks)
    _check_plan(spec.plan, runs, tasks)
    return runs


def _check_criterion(search, config: RunConfig, tasks: dict) -> None:
    """A search's criterion is the last layer's loss, the kept epoch's, or a metric its trials' task reports."""
    task = tasks.get(repr(sorted(config.task.options.items())) + config.task.name)
    if search.criterion in ("loss", BEST_VAL_LOSS) or task is None:  # without the built tasks (status, report) metrics go unchecked
        return
    metrics = list(task.metrics().keys())
    if search.criterion not in metrics:
        raise ConfigError(
            f"bench.tuning.{search.variant}.criterion: {search.criterion!r} is not a metric of task {config.task.name!r} "
            f'(it reports: {", ".join(metrics) or "none"}; or "loss", "{BEST_VAL_LOSS}")'
        )


def _check_folders(runs: list[BenchRun], out: Path) -> None:
    """Each run its own folder, one level under --out: checked before anything is written."""
    owner: dict[Path, str] = {}
    for run in runs:
        folder = run.run_dir.parent
        if folder.parent != out or folder.name in ("", ".", "..") or run.run_dir.name != f"seed-{run.seed}":
            raise ConfigError(f"{run.variant!r} would run at {run.run_dir}, outside its own folder under --out {out}; rename it")
        if owner.setdefault(folder, run.variant) != run.variant:
            raise ConfigError(f"{owner[folder]!r} and {run.variant!r} would share the folder {folder}; rename one of them")


def _check_plan(plan, runs: list[BenchRun], tasks: dict) -> None:
    """Each declared endpoint reads a metric its runs' task reports, on a split they are evaluated on."""
    for e in plan:
        if e.on == KEPT_EPOCH:
            _check_kept_epoch(runs, e)
            continue
        metric = e.metric if e.statistic == "difference" else None
        _check_reads(runs, tasks, (e.variant, e.against), metric, e.on, f"bench.plan.{e.name}.metric", f"bench.plan.{e.name}.on")
        _check_gammas(runs, e)


def _check_kept_epoch(runs: list[BenchRun], e) -> None:
    """An endpoint on the kept epoch's validation reads its last-layer loss, at the gamma its runs validate at, where early stopping keeps one."""
    where = f"bench.plan.{e.name}"
    if e.statistic == "difference" and e.metric != "loss":
        raise ConfigError(f'{where}.metric: on {KEPT_EPOCH!r} the metric is "loss" (the last layer\'s), got {e.metric!r}')
    for run in runs:
        if run.variant in (e.variant, e.against):
            if not run.config.train.early_stopping:
                raise ConfigError(f"{where}.on: variant {run.variant!r} keeps no epoch (set train.early_stopping)")
            if run.config.train.validation_gamma != e.gamma:
                raise ConfigError(
                    f"{where}.gamma: variant {run.variant!r} validates at train.validation_gamma {run.config.train.validation_gamma:g}, not {e.gamma:g}"
                )


def _check_primary(primary, runs: list[BenchRun], tasks: dict) -> None:
    """The primary metric is one the variants' task reports, and each primary split is one they are evaluated on."""
    for split in primary.splits:
        _check_reads(runs, tasks, primary.variants + primary.adopted, primary.metric, split, "bench.primary.metric", "bench.primary.splits")


def _check_reads(runs: list[BenchRun], tasks: dict, variants, metric: str | None, split: str, metric_key: str, split_key: str) -> None:
    """The runs of ``variants`` report ``metric`` (None: any; unchecked without the built ``tasks``) and are evaluated on ``split``: test, one of their domains or a mean of them."""
    for run in runs:
        if run.variant not in variants:
            continue
        task = tasks.get(repr(sorted(run.config.task.options.items())) + run.config.task.name)
        metrics = list(task.metrics().keys()) if task is not None else []
        if metric is not None and task is not None and metric not in metrics:
            raise ConfigError(
                f"{metric_key}: {metric!r} is not a metric of task {run.config.task.name!r} (it reports: {', '.join(metrics) or 'none'})"
            )
        for name in mean_domains(split) or [split]:
            if name != "test" and name not in run.config.eval.domains:
                raise ConfigError(
                    f"{split_key}: variant {run.variant!r} is not evaluated on {name!r} (test, one of its eval.domains "
                    f'or a mean of them, "mean(a, b)": {", ".join(run.config.eval.domains) or "no domains"})'
                )


def _check_gammas(runs: list[BenchRun], e) -> None:
    """Each gamma an endpoint reads is one its variant's and its baseline's main runs are evaluated at."""
    for run in runs:
        if run.trial_of is None and run.variant in (e.variant, e.against):
            evaluated = [float(g) for g in run.config.eval.gammas]
            missing = next((g for g in (e.gamma if e.aggregate else (e.gamma,)) if g not in evaluated), None)
            if missing is not None:
                raise ConfigError(
                    f"bench.plan.{e.name}.gamma: variant {run.variant!r} is not evaluated at γ {missing:g} "
                    f"(its eval.gammas: {', '.join(f'{g:g}' for g in evaluated)})"
                )


def bench_spec(path: str | Path, overrides: list[str] = ()) -> BenchSpec:
    """The bench file's judging keys: its baselines, primary endpoints and tuning budgets."""
    return parse_spec(apply_overrides(read_toml(path), list(overrides)).get("bench", {}))


def select(runs: list[BenchRun], only: list[str]) -> list[BenchRun]:
    """The runs whose variant label matches one of the shell-style patterns ``only`` (all runs when it is empty)."""
    if not only:
        return runs
    chosen = [run for run in runs if any(fnmatch.fnmatchcase(run.variant, pattern) for pattern in only)]
    if not chosen:
        labels = ", ".join(dict.fromkeys(run.variant for run in runs))
        raise ConfigError(f"--only {' '.join(only)} matches no variant; the bench's are: {labels} (patterns as in the shell: * ? [seq])")
    return chosen
