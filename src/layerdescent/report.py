"""Turn finished run directories into one markdown summary with plots.

Usage::

    from layerdescent.report import collect, summarize, write_report

    write_report(Path("runs/bench"))          # -> runs/bench/summary.md + *.png
    groups = summarize(collect(Path("runs")))  # {label: per-gamma mean/std over seeds}

Runs are grouped by ``label`` (one variant, several seeds). Groups with the same task and
evaluation settings (their ``config.toml`` less how they were trained: solver, constraints,
train, seed and label) share a context: within it, the baseline solver's group (the one labelled
by that solver's name, else the nearest) is the baseline for the cost ratio and for paired differences
over seeds, so the baseline's other variants (clean training, dropout) are compared with it too; groups of
solvers that enforce the constraints are also compared with the reference solver's (deep supervision),
and a bench over several contexts (datasets, architectures) gets one plot panel per context.
Labels alike but for one of alpha, dual_lr or depth (``ABLATED``; evaluation settings aside), with
three or more values, form an ablation: a table and a plot of the metrics against that value.
Constrained runs also get their multiplier and violation traces over training.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path

import numpy as np
from scipy import stats

from layerdescent import rundir
from layerdescent.errors import LayerdescentError
from layerdescent.publish import Publication
from layerdescent.results import check as check_results

# How a model was trained, as opposed to what it is and what it is tested on (its context).
TRAINING_CHOICES = ("solver", "constraints", "train", "seed", "label")


def role(solver: str, attr: str) -> bool:
    """A solver's role in the report (``baseline``, ``reference``, ``enforces_constraints``); False for one no plugin registers now."""
    from layerdescent.registry import get_registry

    return bool(getattr(get_registry().solvers.get(solver), attr, False))


def _baseline_name() -> str:
    from layerdescent.registry import get_registry

    return next((name for name, cls in sorted(get_registry().solvers.items()) if cls.baseline), "baseline")


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
        results.append({**read_results(path), "run_dir": str(path.parent), "config": config, "context": context})
    if len({r["task"] for r in results}) > 1:  # runs of two tasks never share a row, even with the same label
        for r in results:
            r["label"] = f"{r['task']}: {r['label']}"
    return results


# What a summary reads from each results.json, and of each gamma record.
RESULT_KEYS = ("label", "task", "solver", "seed", "num_layers", "gammas")
GAMMA_KEYS = ("gamma", "layer_loss", "descent_rate")


def read_results(path: Path) -> dict:
    """One results.json, checked for what a summary reads; LayerdescentError naming the file if it is damaged."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise LayerdescentError(f"{path} is not text (a binary or damaged file); re-run or re-evaluate that run") from None
    except json.JSONDecodeError as exc:
        raise LayerdescentError(f"{path} is not valid JSON ({exc.msg} at line {exc.lineno}; truncated?); re-run or re-evaluate that run") from None
    except OSError as exc:
        raise LayerdescentError(f"cannot read {path}: {exc.strerror or exc}") from None
    if not isinstance(data, dict):
        raise LayerdescentError(f"{path} holds a JSON {type(data).__name__}, not a results object; re-run or re-evaluate that run")
    missing = [k for k in RESULT_KEYS if k not in data]
    if missing:
        raise LayerdescentError(f"{path} lacks {', '.join(map(repr, missing))}; it is not a layerdescent results.json (or is damaged)")
    records = [data["gammas"], *(data.get("domains") or {}).values()]
    for record in (r for rs in records for r in (rs if isinstance(rs, list) else [None])):
        if not isinstance(record, dict) or any(k not in record for k in GAMMA_KEYS) or not isinstance(record.get("metrics", {}), dict):
            raise LayerdescentError(f"{path}: every gamma record needs {', '.join(GAMMA_KEYS)} and a metrics table; the file is damaged")
    if not data["gammas"]:
        raise LayerdescentError(f"{path} records no gamma; re-run or re-evaluate that run")
    data.setdefault("train", {})
    for record in (r for rs in records for r in rs):
        record.setdefault("metrics", {})
    check_results(data, path)  # types, finiteness and the layer count of every value a summary reads
    return data


def _config(run_dir: Path) -> dict:
    """The run's recorded config.toml as a table, defaults filled in; empty when it has none."""
    from layerdescent.config import EvalConfig, TrainConfig, read_toml
    from layerdescent.registry import get_registry

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


def context_titles(groups: dict) -> dict[str, str]:
    """A short name per context: the settings that differ between contexts, e.g. 'dataset=bikes, arch=dust'."""
    contexts = {g["context_key"]: g["context"] for g in groups.values()}
    flat = {key: _flat(ctx) for key, ctx in contexts.items()}
    keys = dict.fromkeys(k for f in flat.values() for k in f)
    varying = [k for k in keys if len({json.dumps(f.get(k), sort_keys=True) for f in flat.values()}) > 1]
    return {key: ", ".join(f"{k.rsplit('.', 1)[-1]}={f.get(k)}" for k in varying) for key, f in flat.items()}


def _flat(table: dict, prefix: str = "") -> dict:
    """Dotted keys for nested tables; a list of tables (constraints) is numbered: constraints.0.alpha."""
    out = {}
    for k, v in table.items():
        if isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            v = {str(i): x for i, x in enumerate(v)}
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def _stats(values) -> dict:
    """Mean and sample std over seeds, elementwise, and the number of seeds n; std is 0 for a single seed."""
    a = np.asarray(values, dtype=float)
    std = a.std(axis=0, ddof=1) if len(a) > 1 else np.zeros_like(a[0])
    return {"mean": a.mean(axis=0).tolist(), "std": std.tolist(), "n": len(a)}


def paired_difference(a, b, level: float = 0.95) -> dict:
    """Mean of a - b over paired seeds, its t interval, and whether that interval excludes 0."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    d = a - b
    n, mean = len(d), float(d.mean())
    # One pair has no spread to judge it by; nor have pairs that all differ alike (a metric counted
    # on a fixed test set, such as accuracy, takes few values), where t's interval would shrink to a
    # point and call any difference certain. "Alike" is up to float32 rounding of the metrics.
    if n < 2 or np.ptp(d) <= 1e-6 * float(np.abs(np.concatenate([a, b])).max()):
        return {"mean": mean, "low": None, "high": None, "n": n, "distinct": False}
    half = float(stats.t.ppf((1 + level) / 2, n - 1) * d.std(ddof=1) / np.sqrt(n))
    low, high = mean - half, mean + half
    return {"mean": mean, "low": low, "high": high, "n": n, "distinct": low > 0 or high < 0}


def _last_digit(spread: float, mean: float = 0.0, max_digits: int = 4) -> int:
    """The decimal exponent of the last digit worth printing: two significant digits of the spread
    when they start with 1 to 3, else one, but never past ``max_digits`` significant digits of the mean."""
    lead = math.floor(math.log10(spread))
    digits = 2 if spread / 10.0**lead < 3.55 else 1
    last = lead - digits + 1
    if mean and math.isfinite(mean):
        last = max(last, math.floor(math.log10(abs(mean))) - max_digits + 1)
    return last


def _at(x: float, last: int, sign: bool = False) -> str:
    """``x`` rounded to the digit 10**last; scientific for very small or large magnitudes."""
    plus = "+" if sign else ""
    if last < -6 or abs(x) >= 1e7:
        digits = max(math.floor(math.log10(abs(x))) - last, 0) if x else 0
        return f"{x:{plus}.{digits}e}"
    text = f"{round(x, -last) if last > 0 else x:{plus}.{max(-last, 0)}f}"
    if float(text) == 0:  # a bound that rounds to zero keeps its side of zero; a plain zero has no sign
        text = text.lstrip("+-")
        return ("-" if x < 0 else "+") + text if sign else text
    return text


def format_stat(mean: float, spread: float | None = None, n: int = 1) -> str:
    """'mean ± spread' to the precision the spread supports; a single seed (n = 1) shows the mean alone."""
    if not math.isfinite(mean):
        return str(mean)
    if n < 2 or spread is None or not math.isfinite(spread):
        return f"{mean:.4g}"
    if spread == 0:
        return f"{mean:.4g} ± 0"
    last = _last_digit(spread, mean)
    if spread < 0.5 * 10.0**last:  # below what the mean's own precision shows: rounding noise
        return f"{_at(mean, last)} ± <{_at(10.0**last, last)}"
    return f"{_at(mean, last)} ± {_at(spread, last)}"


def format_difference(d: dict) -> str:
    """A paired difference as markdown: 'mean [low, high]' to the interval's precision, bold when it excludes 0."""
    bold = "**" if d["distinct"] else ""
    if d["low"] is None:
        return f"{d['mean']:+.3g}" + (f" (alike in all {d['n']} pairs)" if d["n"] > 1 else "")
    half = (d["high"] - d["low"]) / 2
    last = _last_digit(half, max(abs(d["low"]), abs(d["high"]))) if half > 0 else _last_digit(abs(d["mean"]) or 1.0)
    mean, low, high = (_at(v, last, sign=True) for v in (d["mean"], d["low"], d["high"]))
    return f"{bold}{mean} [{low}, {high}]{bold}"


def _nearest(groups: dict, label: str, candidates: list[str]) -> str | None:
    """Of ``candidates``, the group trained most like ``label``, on a tie the one labelled by its solver's name.

    "Most like it" counts the config keys (solver, constraints and seed aside) that differ, so a
    bench over training regimes (say ``train.train_gamma``) pairs each run with its own regime.
    """
    config = groups[label]["config"]

    def distance(other: str) -> tuple[int, bool]:
        theirs = groups[other]["config"]
        keys = {k for k in {*config, *theirs} if not k.startswith(("solver.", "constraints.", "seed", "label"))}
        return sum(config.get(k) != theirs.get(k) for k in keys), other != groups[other]["solver"]

    return min(candidates, key=distance, default=None)


def _in_context(groups: dict, label: str, attr: str) -> list[str]:
    """The groups in ``label``'s context whose solver has role ``attr``."""
    key = groups[label]["context_key"]
    return [other for other, g in groups.items() if role(g["solver"], attr) and g["context_key"] == key]


def _baseline(groups: dict, label: str) -> str | None:
    """The baseline group ``label`` is compared with: of its context's baseline groups labelled by the solver's name (or "name,..." in a grid), else of all of them, the nearest."""
    candidates = _in_context(groups, label, "baseline")
    main = [c for c in candidates if c.split(",")[0] == groups[c]["solver"]]
    return _nearest(groups, label, main or candidates)


def comparisons(groups: dict) -> list[tuple[str, str]]:
    """(label, reference) pairs in one context: everything against its baseline, and constrained groups against the reference solver's."""
    pairs = [(label, ref) for label in groups if (ref := _baseline(groups, label)) not in (None, label)]
    pairs += [
        (label, ref)
        for label, g in groups.items()
        if role(g["solver"], "enforces_constraints") and (ref := _nearest(groups, label, _in_context(groups, label, "reference"))) is not None
    ]
    return pairs


# Hyperparameters whose sweeps get a table and plot of their own: config key -> name.
ABLATED = {"constraints.0.alpha": "alpha", "solver.dual_lr": "dual_lr", "task.layers": "depth"}


def _ablations(groups: dict) -> dict[str, list[list[str]]]:
    """Per ablated key, its series: labels alike but for that key (seed and evaluation aside), 3+ values, by value."""
    found = {}
    for key in ABLATED:
        series: dict[str, list[str]] = {}
        for label, grp in groups.items():
            if isinstance(grp["config"].get(key), (int, float)):
                # the evaluation grid may differ within a series, the split (test or validation) may not
                rest = {k: v for k, v in grp["config"].items() if k not in (key, "label", "seed") and (k == "eval.split" or not k.startswith("eval."))}
                series.setdefault(json.dumps(rest, sort_keys=True, default=str), []).append(label)
        swept = [sorted(labels, key=lambda label: groups[label]["config"][key]) for labels in series.values()]
        swept = [labels for labels in swept if len({groups[label]["config"][key] for label in labels}) >= 3]
        if swept:
            found[key] = swept
    return found


def _shared_gammas(groups: dict, labels: list[str]) -> list[float]:
    """The gammas every one of ``labels`` was evaluated at."""
    return sorted(set.intersection(*(set(groups[label]["gammas"]) for label in labels)))


def _ablation_tables(groups: dict, metrics: list[str]) -> list[str]:
    """Markdown: per ablated key, each series' metrics at its shared gammas and its first and last layer's loss."""
    lines = []
    for key, swept in _ablations(groups).items():
        for labels in swept:
            gammas = _shared_gammas(groups, labels)
            rows = []
            for label in labels:
                grp = groups[label]
                stats = grp["gammas"][gammas[0]]
                cells = [_cell(grp["gammas"][g]["metrics"].get(m)) for m in metrics for g in gammas]
                first, last = _cell(stats["layer_loss"], 0), _cell(stats["layer_loss"], len(stats["layer_loss"]["mean"]) - 1)
                rows.append([f"{grp['config'][key]:g}", label, str(grp["n"]), *cells, first, last])
            header = [ABLATED[key], "label", "seeds", *(f"{m} γ={g:g}" for m in metrics for g in gammas), f"l_0 γ={gammas[0]:g}", f"l_L γ={gammas[0]:g}"]
            lines += [f"## Ablation: {ABLATED[key]} ({groups[labels[0]]['solver']})", ""] + _table(header, rows)
    return lines


def paired_cell(value: dict, label: str, ref: str, seeds: list[int], *key) -> str:
    """``label`` − ``ref`` over ``seeds`` as a table cell, from ``value[label, seed, *key]``; "–" where a seed lacks it."""
    if not seeds or not all((name, s, *key) in value for name in (label, ref) for s in seeds):
        return "–"
    return format_difference(paired_difference([value[(label, s, *key)] for s in seeds], [value[(ref, s, *key)] for s in seeds]))


def _paired_tables(results: list[dict], groups: dict, metrics: list[str], gammas: list[float], where: str = "") -> list[str]:
    """Markdown: per metric, label - reference at every gamma over the seeds both have."""
    value = {(r["label"], r["seed"], float(g["gamma"]), m): v for r in results for g in r["gammas"] for m, v in g["metrics"].items()}
    lines = []
    for metric in metrics:
        rows = []
        for label, ref in comparisons(groups):
            seeds = sorted(set(groups[label]["seeds"]) & set(groups[ref]["seeds"]))
            rows.append([f"{label} − {ref}", str(len(seeds))] + [paired_cell(value, label, ref, seeds, gamma, metric) for gamma in gammas])
        if rows:
            lines += [f"### {metric}", ""] + _table(["difference", "seeds"] + [f"γ={g:g}" for g in gammas], rows)
    if not lines:
        return []
    note = "Mean over paired seeds with its 95% t interval; **bold**: the interval excludes 0. One seed gives no interval."
    return [f"## Paired differences over seeds{where}", "", note, "", *lines]


def _summarize_group(runs: list[dict]) -> dict:
    """Aggregate the seeds of one label."""
    by_gamma: dict[float, list[dict]] = {}
    for run in runs:
        for g in run["gammas"]:
            by_gamma.setdefault(float(g["gamma"]), []).append(g)
    gammas = {}
    for gamma in sorted(by_gamma):
        rows = by_gamma[gamma]
        gammas[gamma] = {
            # a metric some seeds lack (a damaged or older run) is summarized over the seeds that have it
            "metrics": {m: _stats([r["metrics"][m] for r in rows if m in r["metrics"]]) for m in dict.fromkeys(m for r in rows for m in r["metrics"])},
            "layer_loss": _stats([r["layer_loss"] for r in rows]),
            "descent_rate": _stats([r["descent_rate"] for r in rows]),
            # each metric at every layer, where the task reads one per layer (and every seed has it)
            "layer_metrics": {m: _stats([r["layer_metrics"][m] for r in rows]) for m in rows[0].get("layer_metrics", {})
                              if all(m in r.get("layer_metrics", {}) for r in rows)},
        }
    times = [r["train"].get("step_time_median") for r in runs]
    times = [t for t in times if t is not None]
    lambdas = {}
    for name, c in runs[0].get("constraints", {}).items():
        per_seed = [r["constraints"][name]["lambda"] for r in runs if name in r.get("constraints", {})]
        # binding: entries whose multiplier ended positive, summed over seeds (of entries x seeds)
        lambdas[name] = {"labels": c.get("labels", []), "mean": np.mean(per_seed, axis=0).tolist(),
                         "binding": int((np.asarray(per_seed) > 0).sum()), "entries": int(np.asarray(per_seed).size)}
    return {
        "solver": runs[0]["solver"],
        "task": runs[0]["task"],
        "perturbation": runs[0].get("perturbation"),
        "split": runs[0].get("split", "test"),
        "n": len(runs),
        "seeds": [r["seed"] for r in runs],
        "run_dirs": [r["run_dir"] for r in runs if "run_dir" in r],
        "num_layers": runs[0]["num_layers"],
        "context": runs[0].get("context", {}),
        "context_key": json.dumps(runs[0].get("context", {}), sort_keys=True),
        "config": _flat(runs[0].get("config", {})),
        "gammas": gammas,
        "lambda": lambdas,
        "step_time": float(np.mean(times)) if times else None,
    }


def domain_results(results: list[dict]) -> dict[str, list[dict]]:
    """Per evaluation domain (``eval.domains``), each run's results with that domain's records as its ``gammas``."""
    views: dict[str, list[dict]] = {}
    for r in results:
        for name, records in r.get("domains", {}).items():
            views.setdefault(name, []).append({**r, "gammas": records})
    return views


def summarize(results: list[dict]) -> dict:
    """Group runs by label (first-seen order) and reduce each group over its seeds."""
    runs_by_label: dict[str, list[dict]] = {}
    for r in results:
        runs_by_label.setdefault(r["label"], []).append(r)
    groups = {label: _summarize_group(runs) for label, runs in runs_by_label.items()}
    for label, g in groups.items():
        base = _baseline(groups, label)
        base_time = groups[base]["step_time"] if base else None
        g["step_time_ratio"] = g["step_time"] / base_time if g["step_time"] is not None and base_time else None
    return groups


def _fmt(x) -> str:
    return "–" if x is None else f"{x:.4g}"


def _cell(stats: dict | None, i: int | None = None) -> str:
    """'mean ± std' of a scalar stat, or of entry i of a per-layer stat, to the precision the spread supports."""
    if stats is None:
        return "–"
    mean, std = (stats["mean"], stats["std"]) if i is None else (stats["mean"][i], stats["std"][i])
    return format_stat(mean, std, stats.get("n", 2))


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows] + [""]


def _all_gammas(groups: dict) -> list[float]:
    return sorted({g for grp in groups.values() for g in grp["gammas"]})


def _layer_table(groups: dict, key: str | tuple[str, str], gamma: float) -> list[str]:
    """Markdown: a per-layer stat (``key``, or ``("layer_metrics", metric)``) of every label at ``gamma``."""
    width = max(grp["num_layers"] for grp in groups.values()) + (key != "descent_rate")
    rows = []
    for label, grp in groups.items():
        record = grp["gammas"].get(gamma, {})
        stats = record.get(key[0], {}).get(key[1]) if isinstance(key, tuple) else record.get(key)
        rows.append([label] + [_cell(stats, i) if stats and i < len(stats["mean"]) else "–" for i in range(width)])
    names = [f"l{i + 1}<l{i}" if key == "descent_rate" else f"l{i}" for i in range(width)]
    return _table(["label"] + names, rows)


def _metric_tables(groups: dict, results: list[dict], metrics: list[str], gammas: list[float], where: str = "") -> list[str]:
    """Markdown: every label's metrics at every gamma, then the paired differences, on the test split or ``where``."""
    header = ["label"] + [f"{m} γ={g:g}" for m in metrics for g in gammas]
    rows = [[label] + [_cell(grp["gammas"].get(g, {}).get("metrics", {}).get(m)) for m in metrics for g in gammas]
            for label, grp in groups.items()]
    return [f"## Metric at each gamma{where}", "", *_table(header, rows), *_paired_tables(results, groups, metrics, gammas, where)]


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def metric_names(groups: dict) -> list[str]:
    """Every metric any group reports, in first-seen order; a task may report none."""
    return list(dict.fromkeys(m for grp in groups.values() for s in grp["gammas"].values() for m in s["metrics"]))


def _overview(groups: dict, results: list[dict]) -> list[str]:
    """What the summary covers: runs, variants, seeds, and tasks when there are several."""
    seeds = sorted({r["seed"] for r in results})
    seed_text = f"seed {seeds[0]}" if len(seeds) == 1 else f"seeds {', '.join(map(str, seeds))}"
    lines = [f"{_plural(len(results), 'run')} of {_plural(len(groups), 'variant')}; {seed_text}."]
    if all(g["n"] == 1 for g in groups.values()):
        lines[0] += " One seed per variant (n = 1): no spread is shown, and differences have no interval."
    # Tuning runs are evaluated on validation; every "test" table below holds their validation numbers.
    off_test = [_legend_name(label, g) for label, g in groups.items() if g["split"] != "test"]
    if off_test:
        named = ", ".join(off_test)
        lines.append(f"**Evaluated on another split than test** (their tables' numbers are on that split; they pair with no test run): {named}.")
    tasks = list(dict.fromkeys(r["task"] for r in results))
    if len(tasks) > 1:
        counts = ", ".join(f"{t} ({_plural(sum(r['task'] == t for r in results), 'run')})" for t in tasks)
        lines.append(f"**These runs come from {len(tasks)} tasks**: {counts}. Each label names its task, and runs are compared only within a task.")
    return [*lines, ""]


def _cost_note(workers: int | None) -> str:
    """How the runs shared the machine, which decides what the step times can be compared with."""
    if workers == 1:
        shared = "Runs went one after another, so machine load differs between rows;"
    elif workers:
        shared = f"Runs went {workers} at a time (`--workers {workers}`, one thread each), competing for the cores, so load differs between rows;"
    else:
        shared = "How the runs shared the machine is not recorded here, so load may differ between rows;"
    return shared + "\n`benchmarks/cost.py` interleaves the solvers in one process for a controlled ratio."


def _markdown(groups: dict, results: list[dict], title: str, images: list[str], note: str = "", workers: int | None = None,
              domains: dict[str, tuple[list[dict], dict]] | None = None) -> str:
    """The summary; ``domains`` maps each evaluation domain to its results view and their groups."""
    gammas = _all_gammas(groups)
    metrics = metric_names(groups)
    lines = [f"# {title}", "", *([note, ""] if note else []), *_overview(groups, results)]

    if metrics:
        lines += _metric_tables(groups, results, metrics, gammas)
    else:
        lines += ["This task reports no metrics (`Task.metrics`); the tables below give the loss at every layer.", ""]
    for gamma in dict.fromkeys([gammas[0], gammas[-1]]):
        lines += [f"## Test loss per layer at γ={gamma:g}", ""] + _layer_table(groups, "layer_loss", gamma)
    lines += [f"## Descent rate per layer at γ={gammas[0]:g}", ""] + _layer_table(groups, "descent_rate", gammas[0])
    for metric in dict.fromkeys(m for grp in groups.values() for st in grp["gammas"].values() for m in st["layer_metrics"]):
        lines += [f"## {metric} per layer at γ={gammas[0]:g}", ""] + _layer_table(groups, ("layer_metrics", metric), gammas[0])

    for name, (view, domain_groups) in (domains or {}).items():
        where = f" on domain {name}"
        if metrics:
            lines += _metric_tables(domain_groups, view, metrics, _all_gammas(domain_groups), where)
        lines += [f"## Loss per layer at γ={gammas[0]:g}{where}", ""] + _layer_table(domain_groups, "layer_loss", gammas[0])

    if metrics:
        lines += _ablation_tables(groups, metrics)

    constrained = {label: grp for label, grp in groups.items() if role(grp["solver"], "enforces_constraints")}
    if constrained:
        rows = [[label, name, ", ".join(_fmt(x) for x in lam["mean"]), f"{lam['binding']} of {lam['entries']}"]
                for label, grp in constrained.items() for name, lam in grp["lambda"].items()]
        lines += ["## Final multipliers (mean over seeds)", "", "Still binding: the multipliers (entries x seeds) that ended above 0.", ""]
        lines += _table(["label", "constraint", "λ", "still binding"], rows)

    rows = [[label, grp["solver"], _fmt(grp["step_time"] and grp["step_time"] * 1e3), _fmt(grp["step_time_ratio"])]
            for label, grp in groups.items()]
    lines += ["## Cost", "", "Each run's median step time. " + _cost_note(workers), ""]
    lines += _table(["label", "solver", "median step (ms)", f"× {_baseline_name()}"], rows)
    lines += ["## Plots", ""] + [f"![{Path(i).stem}]({i})" for i in images]
    return "\n".join(lines) + "\n"


def read_log(path: Path) -> list[dict]:
    """The records of one metrics.jsonl; LayerdescentError naming the file and line if one is damaged."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError:
        raise LayerdescentError(f"{path} is not text (a binary or damaged file)") from None
    except OSError as exc:
        raise LayerdescentError(f"cannot read {path}: {exc.strerror or exc}") from None
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise LayerdescentError(f"{path}:{number} is not valid JSON ({exc.msg}); the log is damaged") from None
        if not isinstance(record, dict):
            raise LayerdescentError(f"{path}:{number} holds a JSON {type(record).__name__}, not a log record; the log is damaged")
        records.append(record)
    return records


def _traces(groups: dict) -> dict[tuple[str, str], tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(steps, lambda, violation), each [step, entry], per (label, constraint) from the first seed of each constrained label."""
    traces = {}
    for label, grp in groups.items():
        log = Path(grp["run_dirs"][0]) / "metrics.jsonl" if grp["run_dirs"] else None
        if not role(grp["solver"], "enforces_constraints") or log is None or not os.path.lexists(log):
            continue
        records = [r for r in read_log(log) if r.get("event") == "train" and isinstance(r.get("lambda"), dict) and "step" in r]
        for name in records[0]["lambda"] if records else []:
            try:
                steps = np.array([r["step"] for r in records], dtype=float)
                lam = np.array([r["lambda"][name] for r in records], dtype=float).reshape(len(records), -1)
                violation = np.array([r.get("violation", {}).get(name, [np.nan] * lam.shape[1]) for r in records], dtype=float).reshape(lam.shape)
            except (KeyError, TypeError, ValueError):
                raise LayerdescentError(f"{log}: the multipliers of constraint {name!r} change shape or go missing between lines; the log is damaged") from None
            traces[label, name] = (steps, lam, violation)
    return traces


def describe_runs(groups: dict) -> tuple[str, str]:
    """A plot title naming the task(s) and dataset(s), and an axis label saying what gamma is.

    What gamma means comes from the task's ``perturbation_titles`` (registered plugins only), e.g.
    "γ: Gaussian embedding noise, std = γ × RMS of the word embeddings"; otherwise its name.
    """
    from layerdescent.registry import get_registry

    tasks = {}  # task -> datasets, perturbations
    for grp in groups.values():
        task = grp["config"].get("task.name") or grp.get("task", "")
        datasets, perturbations = tasks.setdefault(task, ({}, {}))
        if grp["config"].get("task.dataset") is not None:
            datasets[str(grp["config"]["task.dataset"])] = None
        perturbations[grp.get("perturbation") or grp["config"].get("task.perturbation") or ""] = None
    title = "; ".join(f"{task} on {', '.join(datasets)}" if datasets else task for task, (datasets, _) in tasks.items() if task)
    meanings = []
    for task, (_, perturbations) in tasks.items():
        cls = get_registry().tasks.get(task)
        for name in perturbations:
            meaning = getattr(cls, "perturbation_titles", {}).get(name) if cls else None
            meanings.append(meaning or (f"{name} perturbation level" if name else "perturbation level"))
    return title, "γ: " + "; ".join(dict.fromkeys(meanings))


def _readable_log_axis(ax) -> None:
    """A log y axis whose ticks read as plain numbers (0.2, 0.5, 1), minor ones labelled when few decades show."""
    from matplotlib.ticker import FuncFormatter, LogLocator

    ax.set_yscale("log", nonpositive="clip")
    low, high = ax.get_ylim()
    plain = FuncFormatter(lambda v, _: f"{v:.3g}")
    ax.yaxis.set_major_formatter(plain)
    if high / low < 1e3:  # few decades: label 2 and 5 within each, or the axis shows one number or none
        ax.yaxis.set_minor_locator(LogLocator(subs=(2.0, 5.0)))
        ax.yaxis.set_minor_formatter(plain)


def _series(ax, x, stats: dict, label: str, constrained: bool, color: str, band: bool = False) -> None:
    """One line of means in ``color``; error bars (or a band) of one std only when there is more than one seed."""
    mean, std = np.asarray(stats["mean"], dtype=float), np.asarray(stats["std"], dtype=float)
    style = "-" if constrained else "--"
    spread = stats.get("n", 2) > 1
    if band or not spread:
        ax.plot(x, mean, linestyle=style, marker="o", label=label, color=color)
        if band and spread:
            ax.fill_between(x, mean - std, mean + std, alpha=0.2, color=color)
    else:
        ax.errorbar(x, mean, yerr=std, linestyle=style, marker="o", capsize=3, label=label, color=color)


def _point_stats(points: list[dict]) -> dict:
    """The per-point stats of one series as one stats table."""
    return {"mean": [p["mean"] for p in points], "std": [p["std"] for p in points], "n": min((p.get("n", 2) for p in points), default=1)}


def _finish(fig, axes, path: Path, title: str = "", note: str = "") -> None:
    """One legend below the panels (never on the data), the title above, saved at ``path``."""
    handles = {}
    for ax in np.ravel(axes):
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    fig.tight_layout()
    if title or note:
        fig.suptitle("\n".join(t for t in (title, note) if t), y=1.0, va="bottom", fontsize="medium")
    if handles:
        fig.legend(list(handles.values()), list(handles), loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=min(len(handles), 4), fontsize="small", frameon=False)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)


def _legend_name(label: str, grp: dict) -> str:
    """A label as plots show it: runs evaluated on another split than test say which."""
    return label if grp["split"] == "test" else f"{label} ({grp['split']})"


def _metric_panel(ax, groups: dict, context_key: str, metric: str, colors: dict[str, str]) -> None:
    """``metric`` against gamma for every label of one context, solid constrained, dashed the rest."""
    for label, grp in groups.items():
        if grp["context_key"] != context_key:
            continue
        pts = [(g, st["metrics"][metric]) for g, st in grp["gammas"].items() if metric in st["metrics"]]
        if pts:
            _series(ax, [g for g, _ in pts], _point_stats([m for _, m in pts]), _legend_name(label, grp), role(grp["solver"], "enforces_constraints"), colors.get(label, "C0"))


def _plot(groups: dict, out: Path, domains: dict[str, dict] | None = None) -> list[str]:
    """Write the PNGs and return their file names; ``domains`` maps each evaluation domain to its groups."""
    import matplotlib

    matplotlib.use("Agg")  # here, not at import, so importing the module leaves a user's backend alone
    import matplotlib.pyplot as plt

    title, gamma_label = describe_runs(groups)
    colors = {label: f"C{i % 10}" for i, label in enumerate(groups)}  # one colour per label in every panel
    solid = "solid: constraints enforced; dashed: the rest"
    gammas = _all_gammas(groups)
    ends = list(dict.fromkeys([gammas[0], gammas[-1]]))
    # a run evaluated on validation (a tuning run) is named so in the legend, the axis says so
    loss_label = "test loss" if all(grp["split"] == "test" for grp in groups.values()) else "loss (test unless the legend names a split)"
    fig, axes = plt.subplots(1, len(ends), figsize=(5 * len(ends), 4), squeeze=False)
    for ax, gamma in zip(axes[0], ends):
        means = []
        for label, grp in groups.items():
            if gamma not in grp["gammas"]:
                continue
            s = grp["gammas"][gamma]["layer_loss"]
            _series(ax, np.arange(len(s["mean"])), s, _legend_name(label, grp), role(grp["solver"], "enforces_constraints"), colors[label], band=True)
            means.extend(s["mean"])
        if means and min(means) > 0:
            _readable_log_axis(ax)
        kind = "in distribution" if gamma == gammas[0] else "shifted"
        ax.set(title=f"{kind}, γ = {gamma:g}", xlabel="layer (0: the input representation)", ylabel=loss_label)
    _finish(fig, axes, out / "loss_vs_layer.png", title, f"{gamma_label}; {solid}")
    images = ["loss_vs_layer.png"]

    metrics = metric_names(groups)
    titles = context_titles(groups)
    contexts = list(titles)  # one row of panels per context, solid constrained, dashed the rest
    if metrics:
        fig, axes = plt.subplots(len(contexts), len(metrics), figsize=(5 * len(metrics), 4 * len(contexts)), squeeze=False)
        for row, key in enumerate(contexts):
            for ax, metric in zip(axes[row], metrics):
                _metric_panel(ax, groups, key, metric, colors)
                ax.set(title=f"{titles[key]}: {metric}" if titles[key] else metric, xlabel="γ", ylabel=metric)
        _finish(fig, axes, out / "metric_vs_gamma.png", title, f"{gamma_label}; {solid}")
        images.append("metric_vs_gamma.png")

    if domains and metrics:  # a column per evaluation set (the test split first), a row per context and metric
        panels = {"test": groups, **domains}
        rows = [(key, metric) for key in contexts for metric in metrics]
        fig, axes = plt.subplots(len(rows), len(panels), figsize=(4.5 * len(panels), 3.5 * len(rows)), squeeze=False)
        for row, (key, metric) in enumerate(rows):
            for ax, (where, panel) in zip(axes[row], panels.items()):
                _metric_panel(ax, panel, key, metric, colors)
                prefix = f"{titles[key]}, " if titles[key] else ""
                ax.set(title=f"{prefix}{where}: {metric}", xlabel="γ", ylabel=metric)
        _finish(fig, axes, out / "metric_vs_gamma_domains.png", title, f"{gamma_label}; {solid}")
        images.append("metric_vs_gamma_domains.png")

    # The share of test samples each layer improves, in distribution: 1 everywhere is strict descent.
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, grp in groups.items():
        s = grp["gammas"].get(gammas[0], {}).get("descent_rate")
        if s:
            _series(ax, np.arange(1, len(s["mean"]) + 1), s, _legend_name(label, grp), role(grp["solver"], "enforces_constraints"), colors.get(label, "C0"))
    ax.set(title=f"descent rate in distribution (γ = {gammas[0]:g})", xlabel="layer k", ylabel="share of samples with l_k < l_(k-1)", ylim=(0, 1.02))
    _finish(fig, np.array([ax]), out / "descent_rate.png", title, solid)
    images.append("descent_rate.png")

    traces = _traces(groups)
    if traces:  # one column per constrained label: its multipliers above, its constraint violations below
        fig, axes = plt.subplots(2, len(traces), figsize=(5 * len(traces), 7), squeeze=False)
        for col, ((label, constraint), (steps, lam, violation)) in enumerate(traces.items()):
            entries = groups[label]["lambda"].get(constraint, {}).get("labels") or range(lam.shape[1])
            for j, entry in enumerate(entries):
                axes[0, col].plot(steps, lam[:, j], label=str(entry))
                axes[1, col].plot(steps, violation[:, j], label=str(entry))
            axes[1, col].axhline(0.0, color="black", linewidth=0.8)
            axes[0, col].set(title=f"{label}: {constraint} (first seed)", xlabel="training step", ylabel="multiplier λ")
            axes[1, col].set(xlabel="training step", ylabel="violation (> 0: infeasible)")
        _finish(fig, axes, out / "traces.png", title, "one line per constrained transition")
        images.append("traces.png")

    for key, swept in (_ablations(groups).items() if metrics else ()):  # a row per metric, a column per end of the shared gamma grid
        shared = [_shared_gammas(groups, labels) for labels in swept]
        ends = list(dict.fromkeys(g for gammas in shared for g in (gammas[0], gammas[-1])))
        fig, axes = plt.subplots(len(metrics), len(ends), figsize=(5 * len(ends), 3.5 * len(metrics)), squeeze=False)
        for row, metric in enumerate(metrics):
            for ax, gamma in zip(axes[row], ends):
                for labels, gammas in zip(swept, shared):
                    if gamma not in gammas:
                        continue
                    grp = groups[labels[0]]
                    points = [(groups[label]["config"][key], groups[label]["gammas"][gamma]["metrics"].get(metric)) for label in labels]
                    points = [(x, m) for x, m in points if m is not None]
                    if points:
                        _series(ax, [x for x, _ in points], _point_stats([m for _, m in points]), grp["solver"], role(grp["solver"], "enforces_constraints"), colors[labels[0]])
                ax.set(title=f"{metric} at γ = {gamma:g}", xlabel=ABLATED[key], ylabel=metric)
        name = f"ablation_{ABLATED[key]}.png"
        _finish(fig, axes, out / name, title, gamma_label)
        images.append(name)
    return images


def write_report(root: Path, out: Path | None = None, title: str | None = None, note: str = "", workers: int | None = None) -> Path:
    """Summarize every run under root into out/summary.md plus plots; return the summary's path.

    ``workers`` says how many runs trained at once, which the Cost section reports (None: unknown).
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
        title, note, workers = pub.remembered(root, title, note, workers)  # `report` on a bench keeps its title and note
        images = _plot(groups, pub.stage, {name: domain_groups for name, (_, domain_groups) in domains.items()})
        pub.write("summary.md", _markdown(groups, results, title or f"layerdescent report: {root.name}", images, note, workers, domains))
    return out / "summary.md"
