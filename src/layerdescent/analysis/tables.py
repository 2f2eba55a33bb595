"""summary.md: every table of a bench's summary page, one function a table (the numbers' format in ``formatting``, the paired differences in ``paired_differences``, endpoints.md in ``endpoints_page``)."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

from layerdescent.analysis.endpoints import BenchSpec, decides_the_claim
from layerdescent.analysis.endpoints_page import FAMILY_HEADER, PLAN_HEADER, exploratory_count, family_note, family_rows, plan_rows
from layerdescent.analysis.formatting import format_stat, markdown_table
from layerdescent.analysis.groups import (
    _all_gammas,
    _baseline_name,
    _shared_gammas,
    ablated_keys,
    ablations,
    legend_name,
    metric_names,
    role,
)
from layerdescent.analysis.judging import FAMILY_ALPHA, judge_cells, primary_cells
from layerdescent.analysis.paired_differences import paired_tables
from layerdescent.run.provenance import describe


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
        *paired_tables(results, groups, metrics, gammas, where, **paired_options),
    ]


def primary_section(results: list[dict], spec, views: dict, tally: list[dict], status=None) -> list[str]:
    """Markdown: the declared family "primary" judged with Holm's adjustment, the adopted settings beside it, and the exploratory count."""

    count = exploratory_count(tally)
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
                f"The plan's family `{family}` (every declared endpoint: [endpoints.md](endpoints.md)). {family_note(len(members))}",
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
