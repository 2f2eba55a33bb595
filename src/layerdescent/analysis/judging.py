"""How a bench's declared endpoints are judged: one test per endpoint against its baseline, Holm's step-down within each family.

    cells = judge(results, spec, spec.endpoints())   # per endpoint: Δ, p, Holm p, the interval at Holm's level, the verdict

Each endpoint pairs the variant's runs with its baseline's over the seeds both have, signed so that
a difference > 0 favours the variant. Against "strongest" (the named baselines' best mean there),
the verdict must hold against each (an intersection-union test): its p is the largest of the
baselines' p, and ``decided_by`` names the comparison that gave it. The difference, p and interval a
cell shows are all that comparison's, and the interval is at the level Holm's step-down tested the
cell at (:func:`~layerdescent.analysis.stats.holm_levels`), so a verdict never disagrees with it.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from layerdescent.analysis.endpoints import BenchSpec, Endpoint, decides_the_claim, margin_for
from layerdescent.analysis.groups import (
    KEPT_EPOCH,
    baseline_group,
    domain_mean_results,
    domain_results,
    kept_epoch_results,
    mean_domains,
    summarize,
)
from layerdescent.analysis.stats import (
    ESTIMATES,
    bootstrap_interval,
    equivalence_p,
    holm,
    holm_levels,
    one_sided_p,
    paired_difference,
    sign_flip,
)
from layerdescent.registry import get_registry
from layerdescent.run.provenance import differ

FAMILY_ALPHA = 0.05  # the family-wise error rate Holm's adjustment controls


def split_views(results: list[dict]) -> dict[str, tuple[list[dict], dict]]:
    """Per evaluation set (``test`` first, then each domain), its results and their groups."""
    views = {"test": results, **domain_results(results)}
    return {name: (view, summarize(view)) for name, view in views.items()}


def endpoint_views(results: list[dict], endpoints, views: dict | None = None) -> dict[str, tuple[list[dict], dict]]:
    """``split_views`` (or ``views``) with what else the endpoints read: a mean over domains ("mean(carphone, bikes)"), the kept epoch's validation."""
    views = dict(views if views is not None else split_views(results))
    for e in endpoints:
        if e.on not in views and (domains := mean_domains(e.on)):
            view = domain_mean_results(results, domains)
            views[e.on] = (view, summarize(view))
        elif e.on == KEPT_EPOCH and e.on not in views:
            view = kept_epoch_results(results)
            views[e.on] = (view, summarize(view))
    return views


def untuned(spec: BenchSpec, variant: str, baseline_label: str, baseline_solver: str) -> bool:
    """Whether ``variant`` had tuning runs its baseline did not (erm, with no settings of its own, is never short of them)."""

    options = getattr(get_registry().solvers.get(baseline_solver), "Options", None)
    tunable = bool(options and dataclasses.is_dataclass(options) and dataclasses.fields(options))
    return tunable and spec.tuning.get(variant, 0) > spec.tuning.get(baseline_label, 0)


def judge_cells(
    results: list[dict],
    spec: BenchSpec,
    variants: tuple[str, ...],
    metric: str,
    higher_is_better: bool,
    gammas: tuple[float, ...],
    splits: tuple[str, ...],
    views: dict | None = None,
) -> list[dict]:
    """Each (variant, split, gamma) against the strongest named baseline there, as one family (see :func:`judge`)."""
    endpoints = [
        Endpoint(f"{v} on {s} at γ {g:g}", v, metric, higher_is_better, float(g), s) for v in variants for s in splits for g in gammas
    ]
    return judge(results, spec, endpoints, views)


def judge(results: list[dict], spec: BenchSpec, endpoints, views: dict | None = None) -> list[dict]:
    """Every endpoint judged, in order: Holm within each family, each interval at the level Holm tested its cell at; described ones described.

    An endpoint whose variant, split or gamma the runs lack is still counted in its family (m) and
    marked missing, so an unfinished bench never looks like a smaller family.
    """
    views = endpoint_views(results, endpoints, views)
    cells = [_cell(views.get(e.on), spec, e) for e in endpoints]
    for family in dict.fromkeys(e.family for e in endpoints if e.tested):
        members = [(c, e) for c, e in zip(cells, endpoints) if e.family == family and e.tested]
        pvalues = [c["difference"]["p"] if c.get("difference") else None for c, _ in members]
        for (cell, e), p, level in zip(members, holm(pvalues), holm_levels(pvalues, FAMILY_ALPHA)):
            cell["p_holm"], cell["m"], cell["level"] = p, len(members), level
            if not cell.get("difference"):
                cell["verdict"] = "missing"
                continue
            cell["simultaneous"] = _interval(e, cell["a"], cell["b"], level)
            cell["verdict"] = _verdict(e, cell, p)
            cell["also"] = {name: bootstrap_interval(ESTIMATES[name], cell["a"], cell["b"]) for name in e.also}
    return cells


def _interval(e: Endpoint, a: list[float], b: list[float], level: float) -> dict:
    """The deciding comparison's interval at Holm's ``level``: two-sided at 1 − level, at 1 − 2 · level for a margin's one-sided tests."""
    if e.statistic == "rising":
        return sign_flip(a, b, 1 - level)
    return paired_difference(a, b, 1 - (2 * level if e.kind != "superiority" else level))


def _verdict(e: Endpoint, cell: dict, p_holm: float | None) -> str:
    """What the family's test says of one cell: rejected where Holm's p is at most the family's alpha, the interval's side otherwise."""
    d, shown = cell["difference"], cell["simultaneous"]
    if d["n"] < 2:  # one pair has no spread to judge by: no test, so no verdict either way
        return "undecided: one seed"
    rejected = p_holm is not None and p_holm <= FAMILY_ALPHA
    if e.kind == "superiority":
        return ("better" if d["mean"] > 0 else "worse") if rejected else "no difference"
    margin, high, low = cell["margin"], shown["high"], shown["low"]
    if e.kind == "non-inferiority":
        return "non-inferior" if rejected else "inferior" if high is not None and high < -margin else "not shown non-inferior"
    outside = low is not None and (low > margin or high < -margin)
    return "equivalent" if rejected else "not equivalent" if outside else "not shown equivalent"


def _cell(view, spec: BenchSpec, e: Endpoint) -> dict:
    """One endpoint's cell, signed so a difference > 0 favours the variant; without its runs, the bare cell (missing)."""
    cell = {
        "name": e.name,
        "family": e.family,
        "statistic": e.statistic,
        "test": e.kind,
        "variant": e.variant,
        "split": e.on,
        "gamma": e.gamma,
        "at": e.at,
    }
    if view is None or e.variant not in view[1] or not view[0]:
        return {**cell, "metric": e.metric}
    if not e.tested:
        return {**cell, **rising(view[1], e.variant, e.gamma)}
    sign = -1.0 if e.statistic == "rising" else 1.0 if e.higher_is_better else -1.0  # fewer rising transitions is better
    against = None if e.against == "strongest" else (e.against,)
    return {**cell, **versus_strongest(*view, spec, e.variant, e.gamma, e.metric, sign, e.on, against, endpoint=e)}


def rising_transitions(layer_loss: list[float]) -> list[int]:
    """The layers k at which the loss rises from layer k - 1 (layer 0 the input's); equal is no rise."""
    return [k for k in range(1, len(layer_loss)) if layer_loss[k] > layer_loss[k - 1]]


def rising(groups: dict, label: str, gamma: float) -> dict:
    """The transitions l_{k-1} -> l_k at which ``label``'s mean (over seeds) per-layer test loss at ``gamma`` rises."""
    record = groups[label]["gammas"].get(gamma)
    if record is None:
        return {}
    loss = record["layer_loss"]["mean"]
    return {"rises": rising_transitions(loss), "layer_loss": loss, "seeds": groups[label]["seeds"]}


def run_value(e: Endpoint, run: dict) -> float | None:
    """What ``e`` reads of one run: its metric at the gamma, the mean or trapezoid area over the gammas, or its count of rising transitions."""
    records = {float(g["gamma"]): g for g in run["gammas"]}
    if e.statistic == "rising":
        record = records.get(e.gamma)
        return None if record is None else float(len(rising_transitions(record["layer_loss"])))
    gammas = e.gamma if e.aggregate else (e.gamma,)
    values = [records[g]["metrics"].get(e.metric) if g in records else None for g in gammas]
    if any(v is None for v in values):
        return None
    if not e.aggregate:
        return values[0]
    if e.aggregate == "mean":
        return float(np.mean(values))
    return float(sum((g1 - g0) * (v0 + v1) / 2 for g0, g1, v0, v1 in zip(gammas, gammas[1:], values, values[1:])))


def versus_strongest(
    results: list[dict],
    groups: dict,
    spec: BenchSpec,
    variant: str,
    gamma: float,
    metric: str,
    sign: float,
    split: str = "test",
    against: tuple[str, ...] | None = None,
    endpoint: Endpoint | None = None,
) -> dict:
    """``variant`` against the named baseline with the best mean in its context, over the seeds both have, by ``endpoint``'s test.

    The baselines are the groups of ``spec.baselines``' solvers nearest the variant, or the labels
    ``against``; the endpoint (default: ``metric`` at ``gamma``, superiority) says what each run is
    read at and how a pair is tested. Values are signed by ``sign`` (-1 where lower is better) so
    that a difference > 0 favours the variant. Against several baselines the verdict must hold
    against each (an intersection-union test): the p is the largest of theirs and ``decided_by``
    names the comparison that gave it, whose difference and pairs the cell carries; a difference
    that does not favour the variant is the strongest's. ``cross_code`` says whether the two sides
    were made by different code, ``untuned`` whether the variant had tuning runs the deciding
    baseline did not.
    """
    e = endpoint or Endpoint("", variant, metric, sign > 0, gamma, split)
    cell = {"variant": variant, "split": split, "gamma": gamma, "metric": metric}
    value = {(r["label"], r["seed"]): v for r in results if (v := run_value(e, r)) is not None}
    labels = against if against is not None else [baseline_group(groups, variant, solver) for solver in spec.baselines]
    candidates = {label: sign * mean for label in labels if label in groups and (mean := _mean(groups, label, value, e)) is not None}
    if not candidates or _mean(groups, variant, value, e) is None:
        return cell
    versus = {label: paired_runs(e, groups, value, variant, label, sign) for label in candidates}
    strongest = decided_by = max(candidates, key=candidates.get)
    p = versus[strongest]["difference"]["p"] if versus[strongest]["difference"] else None
    favours = versus[strongest]["difference"] is not None and versus[strongest]["difference"]["mean"] > 0
    if favours or e.kind != "superiority":  # a claim for the variant must hold against each baseline: the largest p decides
        ps = [c["difference"]["p"] if c["difference"] else None for c in versus.values()]
        fails = e.kind == "superiority" and any(c["difference"] is None or c["difference"]["mean"] <= 0 for c in versus.values())
        p = None if fails or None in ps else max(ps)
        if p is not None:
            decided_by = max(versus, key=lambda label: versus[label]["difference"]["p"])
    shown = versus[decided_by]
    difference = shown["difference"] and {**shown["difference"], "p": p}
    if difference and e.kind == "superiority" and favours:
        difference["distinct"] = all(c["difference"] is not None and c["difference"]["distinct"] for c in versus.values())
    made = {label: [] for label in (variant, decided_by)}
    for r in results:
        if r["label"] in made and r["seed"] in shown["seeds"] and "made_by" in r:
            made[r["label"]].append(r["made_by"])
    return {
        **cell,
        "baseline": strongest,
        "baseline_solver": groups[strongest]["solver"],
        "baselines": list(candidates),
        "decided_by": decided_by,
        "seeds": shown["seeds"],
        "a": shown["a"],
        "b": shown["b"],
        "margin": shown["margin"],
        "difference": difference,
        "versus": {label: c["difference"] for label, c in versus.items()},
        "cross_code": differ(made[variant] + made[decided_by]),
        "untuned": untuned(spec, variant, decided_by, groups[decided_by]["solver"]),
    }


def _mean(groups: dict, label: str, value: dict, e: Endpoint) -> float | None:
    """``label``'s mean over its seeds of what ``e`` reads (a point metric's from the summary, as every table shows it)."""
    if e.statistic == "difference" and not e.aggregate:
        stats = groups[label]["gammas"].get(e.gamma, {}).get("metrics", {}).get(e.metric)
        return None if stats is None else stats["mean"]
    values = [value[label, s] for s in groups[label]["seeds"] if (label, s) in value]
    return float(np.mean(values)) if values else None


def paired_runs(e: Endpoint, groups: dict, value: dict, variant: str, label: str, sign: float) -> dict:
    """One comparison: the paired seeds, the signed values of each side, the margin in the metric's units, and the test's difference and p."""
    seeds = [
        s for s in sorted(set(groups[variant]["seeds"]) & set(groups[label]["seeds"])) if (variant, s) in value and (label, s) in value
    ]
    a, b = [sign * value[variant, s] for s in seeds], [sign * value[label, s] for s in seeds]
    margin = margin_for(e, float(np.mean(b))) if seeds else 0.0
    if not seeds:
        return {"seeds": seeds, "a": a, "b": b, "margin": margin, "difference": None}
    difference = sign_flip(a, b) if e.statistic == "rising" else paired_difference(a, b)
    if e.kind == "non-inferiority":
        difference = {**difference, "p": one_sided_p(a, b, margin)}
    elif e.kind == "equivalence":
        difference = {**difference, "p": equivalence_p(a, b, margin)}
    return {"seeds": seeds, "a": a, "b": b, "margin": margin, "difference": difference}


def primary_cells(results: list[dict], spec: BenchSpec, views: dict | None = None) -> list[dict]:
    """The claim's families of the declared endpoints ("primary", "primary V2", ...), judged (empty for a bench that declares none)."""
    cells = judge(results, spec, spec.endpoints(), views)
    return [c for c, e in zip(cells, spec.endpoints()) if decides_the_claim(c["family"]) and e.tested]
