"""summary.md's paired differences over seeds: each variant against its references at every gamma, flagged where different code made the two sides."""

from __future__ import annotations

from layerdescent.analysis.formatting import format_difference, markdown_table
from layerdescent.analysis.groups import comparisons
from layerdescent.analysis.judging import untuned
from layerdescent.analysis.stats import paired_difference
from layerdescent.run.provenance import differ


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


def paired_tables(
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
