"""A bench file's judging keys read and checked: ``[bench]`` baselines, primary, plan, tuning and choice as a BenchSpec.

    [bench]
    baselines = ["erm", "penalty"]          # solvers every constrained variant is paired with (default ["erm"])

    [bench.primary]                         # fixed before any run: the family of cells that decides the claim
    metric = "accuracy"
    higher_is_better = true
    gammas = [0.0, 1.6, 3.2]
    splits = ["test"]                       # "test", evaluation domains, or "mean(a, b)": each run's mean over domains a and b
    variants = ["primal-dual"]              # the pre-registered setting(s), judged against the baselines
    adopted = ["alpha=0.2"]                 # optional: a setting tuned afterwards, reported beside, never instead

    [bench.tuning]                          # runs spent choosing each variant's setting (default 0: untuned)
    "alpha=0.2" = 12

    [bench.plan.L1]                         # or: the endpoints one by one, by name, in families (not with [bench.primary])
    family = "primary"                      # Holm within each family; "primary" (or "primary NAME") decides the claim
    variant = "primal-dual"
    metric = "accuracy"
    higher_is_better = true
    gamma = 3.2
    on = "mean(amazon, tweets)"             # "test" (default), a domain, a mean over domains, or "validation (kept epoch)":
                                            # early stopping's kept epoch, metric "loss" at train.validation_gamma
    against = "strongest"                   # (default) the best-mean named baseline, better than each; or a variant label
                                            # variant or gamma may be a list: one endpoint each, "L1 VARIANT γ G"

    [bench.plan.parity]                     # in-distribution parity is non-inferiority within a margin fixed before the runs
    variant = "primal-dual"
    metric = "accuracy"
    higher_is_better = true
    gamma = 0.0
    test = "non-inferiority"                # or "equivalence" (two one-sided tests); default "superiority"
    margin = "1%"                           # of the baseline's mean, or a number in the metric's units
    claim = "parity"                        # the paper's claim it decides in the claim table (`layerdescent report --claims`)
                                            # after_runs = true: declared after the runs, exploratory, in a family of its own

    [bench.plan.degradation]                # graceful degradation is one test over a γ range
    variant = "primal-dual"
    metric = "accuracy"
    higher_is_better = true
    gamma = [0.8, 1.6, 3.2]
    aggregate = "area"                      # the trapezoid area under the curve from 0.8 to 3.2; or "mean" over the list

    [bench.plan.descent]                    # descent tested: each seed's count of rising transitions against the baseline's
    variant = "primal-dual"
    gamma = 0.0
    statistic = "rising"
    test = "superiority"                    # without it, a rising endpoint is described (the mean loss's rises), not tested

    [bench.choice.depth]                    # a setting chosen by the plan's endpoints, in order of preference:
    candidates = { "8" = "depth-rule-8", "12" = "depth-rule-12" }   # the first whose verdict is "better" wins
    otherwise = "12"                        # where none is

Each key's meaning is in ``endpoints``, beside what it declares; a bad key is a ConfigError, one line.
"""

from __future__ import annotations

import math
from pathlib import Path

from layerdescent.analysis.endpoints import (
    AGGREGATES,
    CLAIMS,
    ENDPOINT_KEYS,
    PRIMARY_KEYS,
    STATISTICS,
    TESTS,
    BenchSpec,
    Choice,
    Endpoint,
    Primary,
    decides_the_claim,
)
from layerdescent.analysis.groups import KEPT_EPOCH
from layerdescent.analysis.stats import ESTIMATES
from layerdescent.analysis.tuning_search import MAX_GAMMAS, parse_search
from layerdescent.errors import ConfigError
from layerdescent.options import refuse_unknown
from layerdescent.registry import get_registry
from layerdescent.run.config_file import read_toml


def _names(value, key: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f'{key} must be a non-empty list of names, e.g. {key} = ["primal-dual"]')
    return tuple(value)


def parse_spec(bench: dict, variants: list[str] | None = None) -> BenchSpec:
    """The judging keys of a ``[bench]`` table, checked; ``variants`` (the bench's run labels) are checked against when given."""

    solvers = get_registry().solvers
    baselines = _names(bench.get("baselines", ["erm"]), "bench.baselines")
    for name in baselines:
        if name not in solvers:
            raise ConfigError(f"bench.baselines: {name!r} is no registered solver (known: {', '.join(sorted(solvers))})")
        if getattr(solvers[name], "enforces_constraints", False):
            raise ConfigError(
                f"bench.baselines: {name!r} enforces the constraints; a baseline is a solver the constrained variants are judged against"
            )
    tuning = bench.get("tuning", {})
    if not isinstance(tuning, dict):
        raise ConfigError('bench.tuning must map variant labels to the number of runs spent choosing their setting, e.g. "primal-dual" = 6')
    searches = {label: parse_search(label, rule) for label, rule in tuning.items() if isinstance(rule, dict)}
    tuning = {label: searches[label].runs if label in searches else rule for label, rule in tuning.items()}  # runs: trials x seeds
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in tuning.values()):
        raise ConfigError(
            'bench.tuning must map variant labels to the number of runs spent choosing their setting, e.g. "primal-dual" = 6, '
            "or to a search the tool runs ([bench.tuning.VARIANT] trials, criterion, gamma)"
        )
    taken = [label for search in searches.values() for label in search.takes]
    twice = next((label for label in taken if taken.count(label) > 1 or label in searches), None)
    if twice is not None:
        raise ConfigError(f"bench.tuning: variant {twice!r} takes the settings of two searches; one search decides a variant's settings")
    primary = bench.get("primary")
    if primary is not None:
        primary = _primary(primary)
    plan = _plan(bench["plan"]) if "plan" in bench else ()
    if primary is not None and any(not e.after_runs for e in plan):
        raise ConfigError(
            "bench.primary and bench.plan both declare endpoints: [bench.primary] is the older form, keep [bench.plan] alone "
            "(beside it, only endpoints declared after the runs)"
        )
    choices = _choices(bench["choice"], plan) if "choice" in bench else ()
    spec = BenchSpec(baselines, primary, dict(tuning), plan, searches, choices)
    if variants is not None:
        named = {label: "bench.primary" for label in (primary.variants + primary.adopted if primary else ())}
        for e in plan:
            named.setdefault(e.variant, f"bench.plan.{e.name}.variant")
            if e.against != "strongest":
                named.setdefault(e.against, f"bench.plan.{e.name}.against")
        named.update({label: "bench.tuning" for label in tuning})
        named.update({label: f"bench.tuning.{search.variant}.takes" for search in searches.values() for label in search.takes})
        for label, where in named.items():
            if label not in variants:
                raise ConfigError(f"{where}: no variant is labelled {label!r} (the bench's are: {', '.join(dict.fromkeys(variants))})")
    return spec


def _plan(table) -> tuple[Endpoint, ...]:
    """``[bench.plan]``'s endpoints, each a table by its name; ConfigError, one line, for a missing, unknown or mistyped key."""
    if not isinstance(table, dict) or not table or not all(isinstance(v, dict) for v in table.values()):
        raise ConfigError(
            'bench.plan must hold one table per endpoint, e.g. [bench.plan.P1] variant = "levels", metric = "mse", gamma = 0.5'
        )
    endpoints = []
    for name, e in (item for named in table.items() for item in _expanded(*named)):
        where = f"bench.plan.{name}"
        nested = next((k for k, v in e.items() if isinstance(v, dict)), None)
        if nested is not None:  # [bench.plan.dose-0.13] is dose-0 holding 13
            raise ConfigError(
                f'{where}.{nested} is a table: a dot in an endpoint\'s name nests it; quote the name, [bench.plan."{name}.{nested}"]'
            )
        refuse_unknown(where, e, ENDPOINT_KEYS)
        statistic = e.get("statistic", "difference")
        if statistic not in STATISTICS:
            raise ConfigError(f"{where}.statistic must be one of {', '.join(STATISTICS)}, got {statistic!r}")
        needed = ("variant", "gamma") if statistic == "rising" else ("variant", "metric", "higher_is_better", "gamma")
        missing = [k for k in needed if k not in e]
        if missing:
            raise ConfigError(f"{where} lacks {missing[0]!r} (a {statistic} endpoint needs {', '.join(needed)})")
        for key in ("variant", "metric", "on", "against", "family", "test", "aggregate"):
            if key in e and (not isinstance(e[key], str) or not e[key]):
                raise ConfigError(f"{where}.{key} must be a non-empty string, got {e[key]!r}")
        if "higher_is_better" in e and not isinstance(e["higher_is_better"], bool):
            raise ConfigError(f"{where}.higher_is_better must be true or false")
        if e.get("against") == e["variant"]:
            raise ConfigError(f'{where}.against names the endpoint\'s own variant {e["variant"]!r}: name a baseline, or "strongest"')
        test = e.get("test", TESTS[statistic][0])
        if test not in TESTS[statistic]:
            raise ConfigError(f"{where}.test must be one of {', '.join(TESTS[statistic])} for a {statistic} endpoint, got {test!r}")
        _check_margin(where, test, e.get("margin"))
        also = e.get("also", [])
        if (
            not isinstance(also, list)
            or any(x not in ESTIMATES for x in also)
            or (not e.get("statistic", "difference") == "difference" and also)
        ):
            raise ConfigError(
                f"{where}.also must list estimates of a difference endpoint among {', '.join(map(repr, ESTIMATES))}, got {also!r}"
            )
        if "effect" in e and not _size(e["effect"]):
            raise ConfigError(
                f"{where}.effect must be > 0: a number in the metric's units, or \"2%\" of the baseline's mean, got {e['effect']!r}"
            )
        if "aggregate" in e and e.get("on") == KEPT_EPOCH:
            raise ConfigError(f"{where}.aggregate: {KEPT_EPOCH!r} is read at the one gamma its runs validate at; drop aggregate")
        gamma = _gamma(where, e["gamma"], e.get("aggregate"), statistic)
        _check_claim(where, e, statistic, test)
        endpoints.append(Endpoint(name=name, **{**e, "gamma": gamma, "also": tuple(also)}))
    return tuple(endpoints)


def _check_claim(where: str, e: dict, statistic: str, test: str) -> None:
    """A claim is decided by the test it is; an endpoint declared after the runs stays out of the claim's pre-registered family."""
    claim = e.get("claim")
    if claim is not None:
        if claim not in CLAIMS:
            raise ConfigError(f"{where}.claim must be one of {', '.join(CLAIMS)}, got {claim!r}")
        fits = {
            "descent": statistic == "rising",
            "degradation": statistic == "difference" and test == "superiority",
            "parity": test in ("non-inferiority", "equivalence"),
        }
        if not fits[claim]:
            raise ConfigError(
                f"{where}.claim = {claim!r} is decided by {CLAIMS[claim].split(': ')[1]}; this endpoint is a {statistic} {test}"
            )
    after = e.get("after_runs", False)
    if not isinstance(after, bool):
        raise ConfigError(f"{where}.after_runs must be true or false")
    if after and decides_the_claim(e.get("family", "primary")):
        raise ConfigError(
            f"{where}: an endpoint declared after the runs cannot join the pre-registered family {e.get('family', 'primary')!r}; "
            'give it one of its own, e.g. family = "claims (after the runs)"'
        )


def _level(value) -> bool:
    """Whether a TOML value is one perturbation level: a finite number >= 0."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


def _gamma(where: str, gamma, aggregate, statistic: str) -> float | tuple[float, ...]:
    """An endpoint's gamma: one level, or with ``aggregate`` the sorted distinct levels it aggregates over; ConfigError, one line."""
    if aggregate is None:
        if not _level(gamma):
            raise ConfigError(f"{where}.gamma must be one perturbation level >= 0, e.g. gamma = 0.5, got {gamma!r}")
        return float(gamma)
    if aggregate not in AGGREGATES:
        raise ConfigError(f"{where}.aggregate must be one of {', '.join(AGGREGATES)}, got {aggregate!r}")
    if statistic != "difference":
        raise ConfigError(f"{where}.aggregate: a {statistic} endpoint reads one gamma; aggregate a difference endpoint over a γ range")
    if not isinstance(gamma, list) or not 2 <= len(gamma) <= MAX_GAMMAS or not all(_level(g) for g in gamma):
        raise ConfigError(
            f"{where}.gamma: aggregate {aggregate!r} needs a list of 2 to {MAX_GAMMAS} perturbation levels >= 0, "
            "e.g. gamma = [0.5, 1.0, 2.0]"
        )
    levels = tuple(sorted({float(g) for g in gamma}))
    if len(levels) != len(gamma):
        raise ConfigError(f"{where}.gamma lists a level twice")
    return levels


def _check_margin(where: str, test: str, margin) -> None:
    """A margin is declared exactly where the test needs one: a number > 0 in the metric's units, or "N%" of the baseline's mean."""
    if test not in ("non-inferiority", "equivalence"):
        if margin is not None:
            raise ConfigError(f'{where}.margin belongs to a non-inferiority or equivalence test; add test = "non-inferiority"')
        return
    example = "margin = 0.005 (the metric's units) or margin = \"2%\" (of the baseline's mean)"
    if margin is None:
        raise ConfigError(f"{where}: a {test} test needs the margin it is judged within, declared before the runs: {example}")
    if not _size(margin):
        raise ConfigError(f"{where}.margin must be > 0: {example}, got {margin!r}")


def _size(value) -> bool:
    """Whether a margin or effect is well formed: a finite number > 0, or "N%" with 0 < N < 100."""
    if isinstance(value, str):
        try:
            return value.endswith("%") and 0 < float(value.removesuffix("%")) < 100
        except ValueError:
            return False
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def _expanded(name: str, e: dict) -> list[tuple[str, dict]]:
    """An endpoint table whose ``variant`` or ``gamma`` is a list, as one endpoint per (variant, gamma): "NAME VARIANT γ G".

    A list of gammas with ``aggregate`` stays one endpoint, over them.
    """
    variants, gammas = e.get("variant"), e.get("gamma")
    if "aggregate" in e:
        gammas = None
    if not isinstance(variants, list) and not isinstance(gammas, list):
        return [(name, e)]
    for key, values in (("variant", variants), ("gamma", gammas)):
        if isinstance(values, list) and not values:
            raise ConfigError(f"bench.plan.{name}.{key} is an empty list: name one or more")
        if isinstance(values, list) and len(values) > MAX_GAMMAS:
            raise ConfigError(f"bench.plan.{name}.{key} lists {len(values):,} values; at most {MAX_GAMMAS:,} (split the endpoint)")
    if isinstance(gammas, list) and not all(_level(g) for g in gammas):
        raise ConfigError(f"bench.plan.{name}.gamma must be perturbation levels >= 0, e.g. gamma = [0.5, 1.0], got {gammas!r}")
    variants = variants if isinstance(variants, list) else [variants]
    gammas = gammas if isinstance(gammas, list) else [e.get("gamma")]
    return [
        (
            " ".join([name, *([str(v)] if len(variants) > 1 else []), *([f"γ {g:g}"] if len(gammas) > 1 else [])]),
            {**e, "variant": v, "gamma": g},
        )
        for v in variants
        for g in gammas
    ]


def _choices(table, plan: tuple[Endpoint, ...]) -> tuple[Choice, ...]:
    """``[bench.choice]``'s choices, each naming the plan's endpoints it chooses by; ConfigError, one line, for a bad one."""
    example = '[bench.choice.depth] candidates = { "8" = "depth-rule-8", "12" = "depth-rule-12" }, otherwise = "12"'
    if not isinstance(table, dict) or not table or not all(isinstance(v, dict) for v in table.values()):
        raise ConfigError(f"bench.choice must hold one table per choice, e.g. {example}")
    names = {e.name for e in plan if e.kind == "superiority"}
    choices = []
    for name, c in table.items():
        where = f"bench.choice.{name}"
        refuse_unknown(where, c, ("candidates", "otherwise"))
        candidates, otherwise = c.get("candidates"), c.get("otherwise")
        if not isinstance(candidates, dict) or not candidates or not all(isinstance(v, str) for v in candidates.values()):
            raise ConfigError(f"{where}.candidates must map each value to the endpoint that chooses it, e.g. {example}")
        if not isinstance(otherwise, str):
            raise ConfigError(f"{where}.otherwise must be the value chosen where no candidate's endpoint is better, e.g. {example}")
        stray = next((e for e in candidates.values() if e not in names), None)
        if stray is not None:
            raise ConfigError(f"{where}.candidates: {stray!r} is no tested endpoint of [bench.plan]")
        choices.append(Choice(name, tuple(candidates.items()), otherwise))
    return tuple(choices)


def _primary(table) -> Primary:
    """A ``[bench.primary]`` table as a Primary; ConfigError, one line, for a missing, unknown or mistyped key."""
    if not isinstance(table, dict):
        raise ConfigError("bench.primary must be a table: metric, higher_is_better, gammas, variants (splits, adopted optional)")
    refuse_unknown("bench.primary", table, PRIMARY_KEYS)
    missing = [k for k in ("metric", "higher_is_better", "gammas", "variants") if k not in table]
    if missing:
        raise ConfigError(f"bench.primary lacks {missing[0]!r} (it needs metric, higher_is_better, gammas and variants)")
    if not isinstance(table["metric"], str) or not table["metric"]:
        raise ConfigError('bench.primary.metric must name a metric the task reports, e.g. metric = "accuracy"')
    if not isinstance(table["higher_is_better"], bool):
        raise ConfigError("bench.primary.higher_is_better must be true or false")
    gammas = table["gammas"]
    if (
        not isinstance(gammas, list)
        or not gammas
        or not all(isinstance(g, (int, float)) and not isinstance(g, bool) and g >= 0 for g in gammas)
    ):
        raise ConfigError("bench.primary.gammas must be a non-empty list of perturbation levels >= 0, e.g. gammas = [0.0, 3.2]")
    return Primary(
        metric=table["metric"],
        higher_is_better=table["higher_is_better"],
        gammas=tuple(float(g) for g in gammas),
        variants=_names(table["variants"], "bench.primary.variants"),
        splits=_names(table.get("splits", ["test"]), "bench.primary.splits"),
        adopted=_names(table["adopted"], "bench.primary.adopted") if "adopted" in table else (),
    )


def read_spec(path: str | Path) -> BenchSpec:
    """The judging keys of a bench file's ``[bench]`` table."""

    bench = read_toml(path).get("bench")
    if not isinstance(bench, dict):
        raise ConfigError(f"{path} has no [bench] table: --bench names the bench file the runs were made from")
    return parse_spec(bench)
