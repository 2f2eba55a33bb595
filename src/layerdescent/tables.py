"""The summary's markdown: numbers to the precision their spread supports, and every table of summary.md."""

from __future__ import annotations

import math
from pathlib import Path

from layerdescent.groups import _all_gammas, _baseline_name, _shared_gammas, ablated_keys, ablations, comparisons, legend_name, metric_names, role
from layerdescent.stats import paired_difference

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


def _overview(groups: dict, results: list[dict]) -> list[str]:
    """What the summary covers: runs, variants, seeds, and tasks when there are several."""
    seeds = sorted({r["seed"] for r in results})
    seed_text = f"seed {seeds[0]}" if len(seeds) == 1 else f"seeds {', '.join(map(str, seeds))}"
    lines = [f"{_plural(len(results), 'run')} of {_plural(len(groups), 'variant')}; {seed_text}."]
    if all(g["n"] == 1 for g in groups.values()):
        lines[0] += " One seed per variant (n = 1): no spread is shown, and differences have no interval."
    # Tuning runs are evaluated on validation; every "test" table below holds their validation numbers.
    off_test = [legend_name(label, g) for label, g in groups.items() if g["split"] != "test"]
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


def _ablation_tables(groups: dict, metrics: list[str]) -> list[str]:
    """Markdown: per ablated key, each series' metrics at its shared gammas and its first and last layer's loss."""
    lines = []
    names = ablated_keys(groups)
    for key, swept in ablations(groups).items():
        for labels in swept:
            gammas = _shared_gammas(groups, labels)
            rows = []
            for label in labels:
                grp = groups[label]
                stats = grp["gammas"][gammas[0]]
                cells = [_cell(grp["gammas"][g]["metrics"].get(m)) for m in metrics for g in gammas]
                first, last = _cell(stats["layer_loss"], 0), _cell(stats["layer_loss"], len(stats["layer_loss"]["mean"]) - 1)
                rows.append([f"{grp['config'][key]:g}", label, str(grp["n"]), *cells, first, last])
            header = [names[key], "label", "seeds", *(f"{m} γ={g:g}" for m in metrics for g in gammas), f"l_0 γ={gammas[0]:g}", f"l_L γ={gammas[0]:g}"]
            lines += [f"## Ablation: {names[key]} ({groups[labels[0]]['solver']})", ""] + _table(header, rows)
    return lines


def markdown(groups: dict, results: list[dict], title: str, images: list[str], note: str = "", workers: int | None = None,
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
