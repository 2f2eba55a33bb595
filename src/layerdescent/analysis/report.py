"""Turn finished run directories into one markdown summary with plots.

Usage::

    from layerdescent.analysis.report import collect, summarize, write_report

    write_report(Path("runs/bench"))          # -> runs/bench/summary.md + *.png
    groups = summarize(collect(Path("runs")))  # {label: per-gamma mean/std over seeds}

This module reads the runs (``collect``, ``read_results``) and writes the summary; who is compared
with whom is ``layerdescent.analysis.groups``, the statistics ``layerdescent.analysis.stats``, the markdown
``layerdescent.analysis.tables``, the plots ``layerdescent.analysis.plots``, and a bench's named baselines and
pre-registered primary endpoints ``layerdescent.analysis.endpoints``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from pathlib import Path

from layerdescent.analysis.endpoints import BenchSpec, spec_table
from layerdescent.analysis.endpoints_file import parse_spec
from layerdescent.analysis.endpoints_page import endpoints_page
from layerdescent.analysis.formatting import format_difference, format_stat  # noqa: F401

# re-exported: the names scripts and tests have imported from here
from layerdescent.analysis.groups import (  # noqa: F401
    TRAINING_CHOICES,
    comparisons,
    context_titles,
    domain_results,
    metric_names,
    role,
    split_mixed_labels,
    summarize,
)
from layerdescent.analysis.paired_differences import paired_cell  # noqa: F401
from layerdescent.analysis.plots import plot
from layerdescent.analysis.registration import plan_status
from layerdescent.analysis.stats import paired_difference  # noqa: F401
from layerdescent.analysis.tables import markdown
from layerdescent.analysis.tuning import decisions
from layerdescent.errors import LayerdescentError
from layerdescent.registry import get_registry
from layerdescent.results import read_results
from layerdescent.run import rundir
from layerdescent.run.config import EvalConfig, TrainConfig
from layerdescent.run.config_file import read_toml
from layerdescent.run.provenance import made_by
from layerdescent.run.publish import Publication


def collect(root: Path) -> list[dict]:
    """Load every results.json under root, each tagged with the run directory and config it came from."""
    root = Path(root)
    if not root.is_dir():
        raise LayerdescentError(f"{root} is not a directory: point at a run or bench directory")
    paths = rundir.result_files(root)
    if not paths:
        raise LayerdescentError(f"no results.json under {root}: train a run first or point at a run/bench directory")
    results = []
    for path in paths:
        config = _config(path.parent)
        context = {k: v for k, v in config.items() if k not in TRAINING_CHOICES}
        data = read_results(path)
        made = made_by(data, read_toml(path.parent / "config.toml") if (path.parent / "config.toml").exists() else {})
        results.append({**data, "run_dir": str(path.parent), "config": config, "context": context, "made_by": made})
    if len({r["task"] for r in results}) > 1:  # runs of two tasks never share a row, even with the same label
        for r in results:
            r["label"] = f"{r['task']}: {r['label']}"
    split_mixed_labels(results)  # two configs under one label are two groups
    return results


def _config(run_dir: Path) -> dict:
    """The run's recorded config.toml as a table, defaults filled in; empty when it has none."""

    path = run_dir / "config.toml"
    if not path.exists():
        return {}
    config = read_toml(path)
    # A run recorded before an option existed lacks its key: its default makes it compare equal.
    solver = config.get("solver", {}) if isinstance(config.get("solver", {}), dict) else {}
    options = getattr(get_registry().solvers.get(solver.get("name", "primal-dual")), "Options", None)
    for section, cls in (("train", TrainConfig), ("solver", options), ("eval", EvalConfig)):
        if cls is None:
            continue
        defaults = {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(cls()).items() if v is not None}
        if isinstance(config.get(section, {}), dict):
            config[section] = {**defaults, **config.get(section, {})}
    task = config.get("task", {})
    if isinstance(task, dict) and task.get("name") in get_registry().tasks:  # a task option added since the run: its default
        config["task"] = {**get_registry().tasks[task["name"]].options, **task}
    return config


def write_report(
    root: Path,
    out: Path | None = None,
    title: str | None = None,
    note: str = "",
    workers: int | None = None,
    spec=None,
    shown: Collection[str] | None = None,
) -> Path:
    """Summarize every run under root into out/summary.md plus plots; return the summary's path.

    ``workers`` says how many runs trained at once, which the Cost section reports (None: unknown);
    ``spec`` (``endpoints.BenchSpec``) names the bench's baselines, primary endpoints and tuning budgets;
    ``shown`` the plots summary.md shows (None: every one; it names the others, drawn beside it all the same).
    """

    root = Path(root)
    out = Path(out) if out is not None else root
    if out.exists() and not out.is_dir():
        raise LayerdescentError(f"--out {out} is a file, not a directory: name a directory for summary.md and the plots")
    results = collect(root)
    groups = summarize(results)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise LayerdescentError(f"cannot create {out}: {exc.strerror or exc}") from None
    domains = {name: (view, summarize(view)) for name, view in domain_results(results).items()}
    with Publication(out) as pub:  # made aside, then moved in over nothing but layerdescent's own files
        # `report` on a bench keeps its title, note and judging keys
        title, note, workers, judging = pub.remembered(root, title, note, workers, spec_table(spec) if spec else None)
        spec = spec or (parse_spec(judging) if judging else BenchSpec())
        images = plot(groups, pub.stage, {name: domain_groups for name, (_, domain_groups) in domains.items()}, spec=spec, results=results)
        title = title or f"layerdescent report: {root.name}"
        tally: list[dict] = []
        status = plan_status(root, results, spec)
        pub.write("summary.md", markdown(groups, results, title, images, note, workers, domains, spec, tally, status, shown))
        if spec.endpoints() or spec.searches:  # the declared plan, judged whole, and the tuning it ran: one page per bench
            views = {"test": (results, groups), **domains}
            pub.write(
                "endpoints.md", endpoints_page(results, spec, views, tally, title, status, decisions(spec.searches, root))
            )  # recomputed from the trials
    return out / "summary.md"
