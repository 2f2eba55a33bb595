"""endpoints.md: every endpoint a bench declares, judged family by family, the described ones, the estimates beside, the tuning decisions and the exploratory count."""

from __future__ import annotations

from layerdescent.analysis.endpoints import decides_the_claim
from layerdescent.analysis.formatting import format_difference, format_p, markdown_table
from layerdescent.analysis.judging import FAMILY_ALPHA, judge
from layerdescent.analysis.stats import excluding_zero_by_chance


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


def exploratory_count(tally: list[dict]) -> str:
    """How many exploratory paired differences exclude 0, beside how many chance alone would."""
    if not tally:
        return "No paired difference has an interval (that takes two seeds of each side)."
    return (
        f"Exploratory cells: {sum(d['distinct'] for d in tally)} of the {len(tally)} paired differences with an interval below exclude 0, "
        f"where chance alone predicts about {excluding_zero_by_chance(len(tally)):.1f} (5% of them); none of them is corrected for the others."
    )


def family_note(m: int) -> str:
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
        lines += [f"## Family {family}: {role}{' (exploratory: the plan changed)' if changed else ''}", "", family_note(len(members)), ""]
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
    lines += ["## Everything else: exploratory", "", exploratory_count(tally), ""]
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
