"""What a bench file's plan declares, as `layerdescent plan` prints it: families, tests, margins, tuning budgets, and power from a pilot.

    print(plan_text(spec, seeds={"primal-dual": 5, "erm": 5}, pilot=collect("benchmarks/results/video_levels")))

Power is the paired t test's (noncentral t) at the family's first Holm step, α/m, the least any of
its cells is tested at: for superiority, to find the endpoint's declared smallest effect of interest
(``effect``); for non-inferiority, to show it within its margin when the true difference is 0. The
spread of the pairs' differences comes from the pilot's runs of the same variant and baseline
labels (for "strongest", the largest spread over the named baselines). For a rising count the t
test's power approximates the sign-flip test's, which also needs at least 6 seeds to decide at all.
"""

from __future__ import annotations

import numpy as np

from layerdescent.analysis.endpoints import BenchSpec, Endpoint, decides_the_claim, margin_for
from layerdescent.analysis.groups import baseline_group
from layerdescent.analysis.judging import FAMILY_ALPHA, endpoint_views, paired_runs, run_value
from layerdescent.analysis.stats import paired_power, seeds_for_power


def plan_text(spec: BenchSpec, seeds: dict[str, int], pilot: list[dict] | None = None) -> str:
    """The plan, family by family: each endpoint's test and what it reads, the seeds it has, and with a pilot its power."""
    endpoints = spec.endpoints()
    lines = [f"Baselines: {', '.join(spec.baselines)}."]
    budgets = ", ".join(f"{label} {runs} runs" for label, runs in spec.tuning.items())
    lines.append(f"Tuning budgets: {budgets}; every other variant 0." if budgets else "Tuning budgets: none declared; no variant is tuned.")
    views = endpoint_views(pilot, endpoints) if pilot else {}
    for family in dict.fromkeys(e.family for e in endpoints if e.tested):
        members = [e for e in endpoints if e.family == family and e.tested]
        role = "decides the claim" if decides_the_claim(family) else "secondary"
        lines += [
            "",
            f"Family {family} ({role}): {len(members)} tests, Holm at {FAMILY_ALPHA:g}; the first step tests at {FAMILY_ALPHA / len(members):.3g}.",
        ]
        for e in members:
            n = seeds.get(e.variant, 0)
            line = f"  {e.name}: {e.variant} against {e.against} on {e.on} at γ {e.at}, {_test(e)}; {n} seeds"
            if pilot is not None:
                line += "; " + _power(e, views, spec, n, FAMILY_ALPHA / len(members))
            lines.append(line)
    described = [e for e in endpoints if not e.tested]
    if described:
        lines += [
            "",
            "Described, not tested: " + ", ".join(f"{e.name} (rising transitions of {e.variant} at γ {e.at})" for e in described) + ".",
        ]
    if not endpoints:
        lines += ["", "No endpoint is declared ([bench.plan]): every verdict on this bench's runs is exploratory."]
    return "\n".join(lines) + "\n"


def _test(e: Endpoint) -> str:
    """The endpoint's test in words."""
    reads = (
        "rising transitions (fewer is better)"
        if e.statistic == "rising"
        else f"{e.metric} ({'higher' if e.higher_is_better else 'lower'} is better)"
    )
    if e.kind in ("non-inferiority", "equivalence"):
        return f"{e.kind} within {e.margin} of {reads}"
    return f"superiority of {reads}" + (f", smallest effect of interest {e.effect}" if e.effect is not None else "")


def _power(e: Endpoint, views: dict, spec: BenchSpec, n: int, alpha: float) -> str:
    """The endpoint's power with ``n`` seeds, and the seeds 80% needs, from the spread of the pilot's pairs on what it reads."""
    if e.kind == "superiority" and e.effect is None:
        return "no smallest effect of interest declared (effect), so no power"
    results, groups = views.get(e.on, ([], {}))
    if e.variant not in groups:
        return f"the pilot has no runs of {e.variant!r} on {e.on}"
    labels = [e.against] if e.against != "strongest" else [baseline_group(groups, e.variant, solver) for solver in spec.baselines]
    value = {(r["label"], r["seed"]): v for r in results if (v := run_value(e, r)) is not None}
    sign = -1.0 if e.statistic == "rising" or not e.higher_is_better else 1.0
    spreads, means = [], []
    for label in labels:
        pairs = paired_runs(e, groups, value, e.variant, label, sign) if label in groups else {"seeds": []}
        if len(pairs["seeds"]) < 2:
            return f"the pilot has fewer than 2 seeds of {e.variant!r} paired with {label!r}"
        spreads.append(float(np.std(np.subtract(pairs["a"], pairs["b"]), ddof=1)))
        means.append(float(np.mean(pairs["b"])))
    sd, one_sided = max(spreads), e.kind == "non-inferiority"
    size = margin_for(e, means[spreads.index(sd)], e.margin if e.kind != "superiority" else e.effect)
    power = paired_power(size, sd, n, alpha, one_sided)
    needed = seeds_for_power(size, sd, alpha, one_sided)
    return f"power {100 * power:.0f}% (pilot spread {sd:.3g}, size {size:.3g}); 80% needs " + (
        f"{needed} seeds" if needed else "more than 1000 seeds"
    )
