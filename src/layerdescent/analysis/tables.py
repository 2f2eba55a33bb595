"""The summary's markdown: numbers to the precision their spread supports, and every table of summary.md.

Over 400 lines: one function a table of summary.md; issue 47 moves the judging tables into the declared plan.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from pathlib import Path

from layerdescent.analysis.endpoints import BenchSpec, decides_the_claim
from layerdescent.analysis.groups import (
    _all_gammas,
    _baseline_name,
    _shared_gammas,
    ablated_keys,
    ablations,
    comparisons,
    legend_name,
    metric_names,
    role,
)
from layerdescent.analysis.judging import FAMILY_ALPHA, judge, judge_cells, primary_cells, untuned
from layerdescent.analysis.stats import excluding_zero_by_chance, paired_difference
from layerdescent.run.provenance import describe, differ


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
        return f"{mean:#.4g}"  # '#' keeps trailing zeros, so one-seed columns show even digits (0.8250 beside 0.8325)
    if spread == 0:
        return f"{mean:.4g} ± 0"
    last = _last_digit(spread, mean)
    if spread < 0.5 * 10.0**last:  # below what the mean's own precision shows: rounding noise
        return f"{_at(mean, last)} ± <{_at(10.0**last, last)}"
    return f"{_at(mean, last)} ± {_at(spread, last)}"


def format_difference(d: dict) -> str:
    """A paired difference as markdown: 'mean [low, high]' to the interval's precision, bold when it excludes 0 (an unbounded side is ∞)."""
    bold = "**" if d["distinct"] else ""
    if d["low"] is None:
        return f"{d['mean']:+#.3g}" + (f" (alike in all {d['n']} pairs)" if d["n"] > 1 else "")
    finite = [v for v in (d["low"], d["high"]) if math.isfinite(v)]
    half = (d["high"] - d["low"]) / 2 if len(finite) == 2 else 0.0
    last = _last_digit(half, max(abs(v) for v in finite)) if half > 0 else _last_digit(abs(d["mean"]) or 1.0)
    mean, low, high = (
        _at(v, last, sign=True) if math.isfinite(v) else f"{'+' if v > 0 else '-'}∞" for v in (d["mean"], d["low"], d["high"])
    )
    return f"{bold}{mean} [{low}, {high}]{bold}"


def paired(value: dict, label: str, ref: str, seeds: list[int], *key) -> dict | None:
    """``label`` − ``ref`` over ``seeds`` from ``value[label, seed, *key]``; None where a seed lacks it."""
    if not seeds or not all((name, s, *key) in value for name in (label, ref) for s in seeds):
        return None
    return paired_difference([value[(label, s, *key)] for s in seeds], [value[(ref, s, *key)] for s in seeds])


def paired_cell(value: dict, label: str, ref: str, seeds: list[int], *key) -> str:
    """``label`` − ``ref`` over ``seeds`` as a table cell, from ``value[label, seed, *key]``; "–" where a seed lacks it."""
    d = paired(value, label, ref, seeds, *key)
    return "–" if d is None else format_difference(d)


def made_by_label(results: list[dict]) -> dict[tuple[str, int], dict]:
    """Each run's ``made_by`` record, keyed (label, seed)."""
    return {(r["label"], r["seed"]): r["made_by"] for r in results if "made_by" in r}


def cross_code(made: dict, label: str, ref: str, seeds: list[int]) -> bool:
    """Whether the runs of a pair, over ``seeds``, were made by different code."""

    records = [made[name, s] for name in (label, ref) for s in seeds if (name, s) in made]
    return differ(records)


def _paired_tables(
    results: list[dict],
    groups: dict,
    metrics: list[str],
    gammas: list[float],
    where: str = "",
    spec=None,
    tally: list | None = None,
    primary: set | None = None,
) -> list[str]:
    """Markdown: per metric, label - reference at every gamma over the seeds both have.

    Each difference with an interval lands in ``tally`` unless its (label, ref, split, gamma, metric)
    is in ``primary``, the pre-registered family that the summary judges on its own.
    """
    value = {(r["label"], r["seed"], float(g["gamma"]), m): v for r in results for g in r["gammas"] for m, v in g["metrics"].items()}
    made = made_by_label(results)
    split = where.removeprefix(" on domain ") or "test"

    lines, flagged, short = [], False, False
    for metric in metrics:
        rows = []
        for label, ref in comparisons(groups, spec.baselines if spec else ()):
            seeds = sorted(set(groups[label]["seeds"]) & set(groups[ref]["seeds"]))
            cells = [paired(value, label, ref, seeds, gamma, metric) for gamma in gammas]
            if tally is not None:
                tally += [
                    d
                    for d, g in zip(cells, gammas)
                    if d and d["low"] is not None and (label, ref, split, g, metric) not in (primary or set())
                ]
            mark = " ‡" if cross_code(made, label, ref, seeds) else ""
            mark += " §" if spec and untuned(spec, label, ref, groups[ref]["solver"]) else ""
            flagged, short = flagged or "‡" in mark, short or "§" in mark
            rows.append([f"{label} − {ref}{mark}", str(len(seeds))] + ["–" if d is None else format_difference(d) for d in cells])
        if rows:
            lines += [f"### {metric}", ""] + markdown_table(["difference", "seeds"] + [f"γ={g:g}" for g in gammas], rows)
    if not lines:
        return []
    note = "Mean over paired seeds with its 95% t interval; **bold**: the interval excludes 0. One seed gives no interval."
    if flagged:
        note += " ‡: the two sides were made by different code (see Provenance)."
    if short:
        note += " §: the variant had tuning runs its baseline, which has settings of its own, did not (see Tuning budgets)."
    return [f"## Paired differences over seeds{where}", "", note, "", *lines]


def _fmt(x) -> str:
    return "–" if x is None else f"{x:.4g}"


def _cell(stats: dict | None, i: int | None = None) -> str:
    """'mean ± std' of a scalar stat, or of entry i of a per-layer stat, to the precision the spread supports."""
    if stats is None:
        return "–"
    mean, std = (stats["mean"], stats["std"]) if i is None else (stats["mean"][i], stats["std"][i])
    return format_stat(mean, std, stats.get("n", 2))


def _multipliers(lam: dict) -> str:
    """A constraint's final lambdas, grouped by level where it is held per level (labels ``l3<=l2@0.8``)."""
    labels, values = lam["labels"], lam["mean"]
    if not labels or len(labels) != len(values) or not all("@" in label for label in labels):
        return ", ".join(_fmt(x) for x in values)
    levels: dict[str, list[str]] = {}
    for label, value in zip(labels, values):
        levels.setdefault(label.rsplit("@", 1)[1], []).append(_fmt(value))
    return "; ".join(f"γ {level}: {', '.join(v)}" for level, v in levels.items())


def _binding(lam: dict) -> str:
    """How much of a constraint still binds: entries x seeds, or for one held per sample the shares of rows binding and met."""
    rows = lam.get("per_sample")
    if rows is None:
        return f"{lam['binding']} of {lam['entries']}"
    met = f"; {rows['satisfied_rows']:.1%} of rows met" if "satisfied_rows" in rows else ""
    return f"{rows.get('binding_rows', float('nan')):.1%} of rows{met}"


def markdown_table(header: list[str], rows: list[list[str]]) -> list[str]:
    """A markdown table's lines, a blank line after it."""
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
    return markdown_table(["label"] + names, rows)


def _metric_tables(
    groups: dict, results: list[dict], metrics: list[str], gammas: list[float], where: str = "", **paired_options
) -> list[str]:
    """Markdown: every label's metrics at every gamma, then the paired differences, on the test split or ``where``."""
    header = ["label"] + [f"{m} γ={g:g}" for m in metrics for g in gammas]
    rows = [
        [label] + [_cell(grp["gammas"].get(g, {}).get("metrics", {}).get(m)) for m in metrics for g in gammas]
        for label, grp in groups.items()
    ]
    return [
        f"## Metric at each gamma{where}",
        "",
        *markdown_table(header, rows),
        *_paired_tables(results, groups, metrics, gammas, where, **paired_options),
    ]


def format_p(p: float | None) -> str:
    """A p-value in two significant digits; "–" where the pairs gave none."""
    return "–" if p is None else f"{p:.2g}"


def family_rows(cells: list[dict], adjusted: bool = True) -> list[list[str]]:
    """Table rows of judged cells: the deciding comparison's difference, its interval at Holm's level, p (and Holm's p), the verdict, flags."""
    rows = []
    for c in cells:
        d = c.get("simultaneous") if adjusted else c.get("difference")
        where = c.get("at") or f"{c['gamma']:g}"
        if d is None:
            rows.append([c["variant"], c["split"], where, "–", "not run", "–", "–", "missing", ""])
            continue
        decided = c.get("decided_by", c["baseline"])
        shown = format_difference({**d, "distinct": c["verdict"] in DECIDED} if adjusted else d)
        if c.get("test", "superiority") != "superiority":
            shown += f", margin {c['margin']:.3g}"
        flags = ", ".join(filter(None, ["different code" if c.get("cross_code") else "", f"{decided} untuned" if c.get("untuned") else ""]))
        verdict = c["verdict"] if adjusted else "exploratory"
        rows.append(
            [
                c["variant"],
                c["split"],
                where,
                decided if decided == c["baseline"] else f"{decided} (strongest: {c['baseline']})",
                shown,
                format_p(c["difference"]["p"]),
                format_p(c.get("p_holm")) if adjusted else "–",
                verdict,
                flags,
            ]
        )
    return rows


DECIDED = ("better", "worse", "non-inferior", "equivalent")  # the verdicts Holm's test rejects its null for: shown in bold
FAMILY_HEADER = ["variant", "evaluated on", "γ", "compared with", "Δ (> 0 favours the variant)", "p", "Holm p", "verdict", "flags"]


def primary_section(results: list[dict], spec, views: dict, tally: list[dict], status=None) -> list[str]:
    """Markdown: the declared family "primary" judged with Holm's adjustment, the adopted settings beside it, and the exploratory count."""

    count = _exploratory_count(tally)
    p = spec.primary
    if p is None and not spec.plan:
        return [
            "## Primary endpoints",
            "",
            "None pre-registered (no `[bench.primary]` in the bench file, or none given: `layerdescent report RUNS --bench FILE` reads it): "
            "every verdict on these runs is exploratory. " + count,
            "",
        ]
    if p is None and spec.claim() is None:
        return [
            "## Primary endpoints",
            "",
            "The plan declares no family `primary`: none of its endpoints decides a claim (its secondary families: "
            "[endpoints.md](endpoints.md)). " + count,
            "",
        ]
    cells = primary_cells(results, spec, views)
    changed = status is not None and status.changed
    heading = (
        "## Primary endpoints (plan changed after the runs began: exploratory)" if changed else "## Primary endpoints (pre-registered)"
    )
    lines = [heading, ""] + ([status.line(), ""] if changed else [])
    if p is None:  # the declared plan: every family is in endpoints.md, the claim's here
        endpoints = [e for e in spec.endpoints() if decides_the_claim(e.family) and e.tested]
        for family in dict.fromkeys(e.family for e in endpoints):
            members = [(c, e) for c, e in zip(cells, endpoints) if e.family == family]
            lines += [
                f"The plan's family `{family}` (every declared endpoint: [endpoints.md](endpoints.md)). {_family_note(len(members))}",
                "",
            ]
            lines += markdown_table(PLAN_HEADER, plan_rows([c for c, _ in members], [e for _, e in members]))
        return lines + [count, ""]
    lines += [
        f"{p.metric} ({'higher' if p.higher_is_better else 'lower'} is better) of {', '.join(p.variants)} against the strongest of "
        f"{', '.join(spec.baselines)} at each cell (the baseline with the best mean there; better only where better than each), at γ {', '.join(f'{g:g}' for g in p.gammas)} "
        f"on {', '.join(p.splits)}: a family of {len(cells)}. p is the paired t test's over seeds; Holm p is adjusted over the family, "
        f"and a cell is better or worse only where it is at most {FAMILY_ALPHA:g}; the interval is the deciding comparison's at the "
        "level Holm's step-down tested the cell at, so it excludes 0 exactly where Holm decides (**bold**).",
        "",
    ]
    lines += markdown_table(FAMILY_HEADER, family_rows(cells))
    if any(c.get("verdict", "").endswith("one seed") for c in cells):
        lines += ["One seed gives no test: such a cell names the comparison but cannot decide it; more seeds (`bench.seeds`) can.", ""]
    if p.adopted:
        tuned = judge_cells(results, spec, p.adopted, p.metric, p.higher_is_better, p.gammas, p.splits, views)
        lines += [
            f"Adopted afterwards (tuned), beside the pre-registered setting, never instead: {', '.join(p.adopted)}; "
            "95% t intervals, not corrected, exploratory.",
            "",
        ]
        lines += markdown_table(FAMILY_HEADER, family_rows(tuned, adjusted=False))
    return lines + [count, ""]


def tuning_section(groups: dict, spec) -> list[str]:
    """Markdown: the runs spent choosing each variant's setting, as the bench file states them."""
    if spec is None or not spec.tuning:
        return [
            "## Tuning budgets",
            "",
            "The bench file states no tuning budget (`[bench.tuning]`): read every variant as run at settings "
            "fixed in advance, and a verdict against a baseline as one between settings nobody tuned here.",
            "",
        ]
    rows = [[label, str(spec.tuning.get(label, 0))] for label in groups]
    return [
        "## Tuning budgets",
        "",
        "Runs spent choosing each variant's setting (`[bench.tuning]`; 0: none). A verdict of a tuned "
        'variant against a baseline with settings of its own and a smaller budget is flagged "untuned".',
        "",
        *markdown_table(["variant", "tuning runs"], rows),
    ]


def provenance_section(results: list[dict]) -> list[str]:
    """Markdown: which code made which variants; inferred where a run predates the record."""

    versions: dict[str, list[str]] = {}
    for r in results:
        if "made_by" in r:
            labels = versions.setdefault(describe(r["made_by"]), [])
            if r["label"] not in labels:
                labels.append(r["label"])
    if len(versions) < 2:
        return []
    inferred = any(r.get("made_by", {}).get("inferred") for r in results)
    note = (
        "The runs were made by different code. Runs recorded before results.json named its commit are told apart by "
        "their version and the keys their files record (a change of options or results): different keys mean different code, "
        "equal keys do not prove the same code."
        if inferred
        else "The runs were made by different code (commits as recorded)."
    )
    return [
        "## Provenance",
        "",
        note,
        "",
        *markdown_table(["code", "variants"], [[v, ", ".join(labels)] for v, labels in versions.items()]),
    ]


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
        lines.append(
            f"**Evaluated on another split than test** (their tables' numbers are on that split; they pair with no test run): {named}."
        )
    tasks = list(dict.fromkeys(r["task"] for r in results))
    if len(tasks) > 1:
        counts = ", ".join(f"{t} ({_plural(sum(r['task'] == t for r in results), 'run')})" for t in tasks)
        lines.append(
            f"**These runs come from {len(tasks)} tasks**: {counts}. Each label names its task, and runs are compared only within a task."
        )
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
            header = [
                names[key],
                "label",
                "seeds",
                *(f"{m} γ={g:g}" for m in metrics for g in gammas),
                f"l_0 γ={gammas[0]:g}",
                f"l_L γ={gammas[0]:g}",
            ]
            lines += [f"## Ablation: {names[key]} ({groups[labels[0]]['solver']})", ""] + markdown_table(header, rows)
    return lines


def markdown(
    groups: dict,
    results: list[dict],
    title: str,
    images: list[str],
    note: str = "",
    workers: int | None = None,
    domains: dict[str, tuple[list[dict], dict]] | None = None,
    spec=None,
    tally: list[dict] | None = None,
    status=None,
    shown: Collection[str] | None = None,
) -> str:
    """The summary; ``domains`` maps each evaluation domain to its results view and their groups, ``spec`` the bench's judging keys.

    ``tally``, where given, receives every exploratory paired difference the tables show (for :func:`endpoints_page`);
    ``status`` (``registration.PlanStatus``) says whether the runs were made under the plan they are judged by;
    ``shown`` names the plots the page shows (None: all), the others it names only.
    """

    spec = spec or BenchSpec()
    gammas = _all_gammas(groups)
    metrics = metric_names(groups)
    # declared before the runs: not exploratory (one declared after them was chosen with the data in view, and stays counted)
    declared = [e for e in spec.endpoints() if e.statistic == "difference" and not e.after_runs]
    primary = {(e.variant, ref, e.on, e.gamma, e.metric) for e in declared for ref in groups}
    tally = [] if tally is None else tally
    options = {"spec": spec, "tally": tally, "primary": primary}
    body = []
    if metrics:
        body += _metric_tables(groups, results, metrics, gammas, **options)
    else:
        body += ["This task reports no metrics (`Task.metrics`); the tables below give the loss at every layer.", ""]
    for gamma in dict.fromkeys([gammas[0], gammas[-1]]):
        body += [f"## Test loss per layer at γ={gamma:g}", ""] + _layer_table(groups, "layer_loss", gamma)
    body += [f"## Descent rate per layer at γ={gammas[0]:g}", ""] + _layer_table(groups, "descent_rate", gammas[0])
    for metric in dict.fromkeys(m for grp in groups.values() for st in grp["gammas"].values() for m in st["layer_metrics"]):
        body += [f"## {metric} per layer at γ={gammas[0]:g}", ""] + _layer_table(groups, ("layer_metrics", metric), gammas[0])

    for name, (view, domain_groups) in (domains or {}).items():
        where = f" on domain {name}"
        if metrics:
            body += _metric_tables(domain_groups, view, metrics, _all_gammas(domain_groups), where, **options)
        body += [f"## Loss per layer at γ={gammas[0]:g}{where}", ""] + _layer_table(domain_groups, "layer_loss", gammas[0])

    if metrics:
        body += _ablation_tables(groups, metrics)

    constrained = {label: grp for label, grp in groups.items() if role(grp["solver"], "enforces_constraints")}
    if constrained:
        rows = [
            [label, name, _multipliers(lam), _binding(lam)] for label, grp in constrained.items() for name, lam in grp["lambda"].items()
        ]
        grouped = any(
            "per_sample" in lam or any("@" in label for label in lam["labels"])
            for grp in constrained.values()
            for lam in grp["lambda"].values()
        )
        body += [
            "## Final multipliers (mean over seeds)",
            "",
            "Still binding: the multipliers (entries x seeds) that ended above 0."
            + (
                " A constraint held per level shows each level's;\none held per sample shows each entry's mean over the training rows, the share of rows"
                " whose multiplier ended above 0,\nand the share of rows that meet the constraint at the end."
                if grouped
                else ""
            ),
            "",
        ]
        body += markdown_table(["label", "constraint", "λ", "still binding"], rows)

    rows = [
        [label, grp["solver"], _fmt(grp["step_time"] and grp["step_time"] * 1e3), _fmt(grp["step_time_ratio"])]
        for label, grp in groups.items()
    ]
    body += ["## Cost", "", "Each run's median step time. " + _cost_note(workers), ""]
    body += markdown_table(["label", "solver", "median step (ms)", f"× {_baseline_name()}"], rows)
    body += tuning_section(groups, spec) + provenance_section(results)
    body += ["## Plots", ""] + [f"![{Path(i).stem}]({i})" for i in images if shown is None or i in shown]
    if unshown := [f"`{i}`" for i in images if shown is not None and i not in shown]:
        body += [""] * (body[-1] != "") + [f"Also drawn beside this page, not shown here: {', '.join(unshown)}."]
    views = {"test": (results, groups), **(domains or {})}
    head = [f"# {title}", "", *([note, ""] if note else []), *_overview(groups, results)]
    if metrics:
        head += primary_section(results, spec, views, tally, status)
    return "\n".join(head + body) + "\n"


PLAN_HEADER = ["endpoint", *(h if h != "compared with" else "against" for h in FAMILY_HEADER)]


def plan_rows(cells: list[dict], endpoints) -> list[list[str]]:
    """Table rows of judged endpoints: the name, what it reads and its test, then the family row."""
    rows = []
    for e, row in zip(endpoints, family_rows(cells)):
        reads = (
            "rising transitions, fewer is better"
            if e.statistic == "rising"
            else f"{e.metric}, {'higher' if e.higher_is_better else 'lower'} is better"
        )
        test = "" if e.kind == "superiority" else f"; {e.kind}"
        rows.append([f"{e.name} ({reads}{test})", *row])
    return rows


def _exploratory_count(tally: list[dict]) -> str:
    """How many exploratory paired differences exclude 0, beside how many chance alone would."""
    if not tally:
        return "No paired difference has an interval (that takes two seeds of each side)."
    return (
        f"Exploratory cells: {sum(d['distinct'] for d in tally)} of the {len(tally)} paired differences with an interval below exclude 0, "
        f"where chance alone predicts about {excluding_zero_by_chance(len(tally)):.1f} (5% of them); none of them is corrected for the others."
    )


def _family_note(m: int) -> str:
    return (
        f"Holm-adjusted over the family's {m}; each interval is at the level Holm's step-down tested its cell at "
        f"(1 − {FAMILY_ALPHA:g}/(m − i) for the i-th rejection, the last step's level for the rest; 1 − 2 × that for a margin's "
        "one-sided test), so a verdict and its interval never disagree. Against the strongest, the verdict must hold against each named "
        "baseline; *against* names the comparison whose difference, interval and p the row shows."
    )


def _status_line(status) -> str:
    if status is None:
        return (
            "No plan is recorded with these runs (they were made before `layerdescent bench` recorded one): "
            "the bench file's history is the only record of when its plan was written."
        )
    return status.line()


def endpoints_page(results: list[dict], spec, views: dict, tally: list[dict], title: str, status=None, decisions=None) -> str:
    """endpoints.md: every endpoint the bench declares, judged family by family, the described ones, and the exploratory count."""
    endpoints = spec.endpoints()
    cells = judge(results, spec, endpoints, views)
    lines = [
        f"# Endpoints: {title}",
        "",
        "Every endpoint the bench file declares (`[bench.plan]`, or its older form `[bench.primary]`), judged by `layerdescent report`; "
        "the family `primary` decides the bench's claim, every other family is secondary and adjusted within itself.",
        "",
        _status_line(status),
        "",
    ]
    tested = [(c, e) for c, e in zip(cells, endpoints) if e.tested]
    changed = status is not None and status.changed
    for family in dict.fromkeys(e.family for _, e in tested):
        members = [(c, e) for c, e in tested if e.family == family]
        role = "the claim" if decides_the_claim(family) else "secondary"
        lines += [f"## Family {family}: {role}{' (exploratory: the plan changed)' if changed else ''}", "", _family_note(len(members)), ""]
        lines += markdown_table(PLAN_HEADER, plan_rows([c for c, _ in members], [e for _, e in members]))
    lines += _estimates(tested)
    described = [(c, e) for c, e in zip(cells, endpoints) if not e.tested]
    if described:
        lines += [
            "## Described, not tested: transitions where the mean per-layer test loss rises",
            "",
            "The mean over seeds of each layer's test loss; a transition l(k-1) -> l(k) rises where it is larger at l(k).",
            "",
        ]
        rows = []
        for c, e in described:
            if "rises" not in c:
                rows.append([e.name, e.variant, e.on, f"{e.gamma:g}", "–", "not run", "–"])
                continue
            loss = c["layer_loss"]
            rises = f"{len(c['rises'])}" + (
                f": {', '.join(f'l{k}' for k in c['rises'])} ({_largest_rise(loss, c['rises'])})" if c["rises"] else ""
            )
            rows.append([e.name, e.variant, e.on, f"{e.gamma:g}", str(len(c["seeds"])), rises, " ".join(f"{x:.4g}" for x in loss)])
        lines += markdown_table(["endpoint", "variant", "evaluated on", "γ", "seeds", "rising transitions", "per-layer test loss"], rows)
    by_name = {c["name"]: c for c in cells}
    for choice in spec.choices:
        value, why = choice.decide(by_name)
        chosen = f"**{choice.name} = {value}**" if value is not None else f"{choice.name}: not yet chosen"
        lines += [f"## Chosen by the plan: {choice.name}", "", f"{chosen} ({why}).", ""]
    lines += _decisions(decisions or {})
    lines += ["## Everything else: exploratory", "", _exploratory_count(tally), ""]
    return "\n".join(lines)


def _estimates(tested: list[tuple[dict, object]]) -> list[str]:
    """Markdown: the estimates endpoints report beside their tests (``also``), on the deciding comparison's seeds."""
    rows = [
        [e.name, c.get("decided_by", "–"), name, f"{d['value']:+.3g} [{d['low']:+.3g}, {d['high']:+.3g}]"]
        for c, e in tested
        for name, d in c.get("also", {}).items()
    ]
    if not rows:
        return []
    return [
        "## Also reported beside the tests: estimates, not tests",
        "",
        "rliable's estimates on each endpoint's deciding comparison (signed so > 0, or a probability above 0.5, favours the variant), "
        "with 95% percentile intervals over 2000 stratified bootstrap resamples (each side's seeds resampled on their own, seeded: the "
        "same on every run). `iqm`: the difference of interquartile means; `probability of improvement`: P(variant > baseline).",
        "",
        *markdown_table(["endpoint", "against", "estimate", "value [95% interval]"], rows),
    ]


def _largest_rise(loss: list[float], rises: list[int]) -> str:
    """The largest of the rises, relative to the loss it rose from: a plateau's 1e-5 wobble is not a 5% climb."""
    largest = 100 * max((loss[k] - loss[k - 1]) / loss[k - 1] for k in rises)
    return f"at most +{largest:.2g}%" if largest < 10 else f"at most +{largest:.0f}%"  # two digits, never 2.4e+02


def _decisions(decisions: dict) -> list[str]:
    """Markdown: each search the tool ran (decided from its trials, as ``tuning.json`` records): its rule, every trial's criterion, what it adopted."""
    lines = []
    for variant, d in sorted(decisions.items()):
        if not isinstance(d, dict) or not isinstance(d.get("rule"), dict):
            continue
        rule = d["rule"]
        adopted = ", ".join(f"{k} = {v!r}" for k, v in (d.get("adopted") or {}).items()) or "nothing (no trial qualified)"
        search = d.get("search", {})
        seeds = len(search.get("seeds", [search.get("seed")]))  # one seed: trials are runs, and committed pages say so as they did
        trials = len(d.get("trials", []))
        lines += [
            f"### {variant}: {trials} trials{f' × {seeds} seeds = {trials * seeds} runs' if seeds > 1 else ''} on validation, adopted {adopted}",
            "",
            f"Criterion {rule.get('criterion')} at γ {rule.get('gamma'):g} ({'higher' if rule.get('higher_is_better') else 'lower'} is better); "
            f"qualifies: {rule.get('qualify')}; ties {rule.get('tie')}. Recorded in tuning.json, the settings the main runs are planned from.",
            "",
        ]
        rows = [
            [
                t["run"],
                "failed" if t.get("failed") else "–" if t.get("value") is None else f"{t['value']:.6g}",  # a mean over its seeds
                "yes" if t.get("qualifies") else "no",
            ]
            for t in d.get("trials", [])
        ]
        lines += markdown_table(["trial", "criterion", "qualifies"], rows)
    return ["## Tuning the tool ran", "", *lines] if lines else []
