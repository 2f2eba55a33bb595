"""What a bench is judged by: its named baselines, its pre-registered primary endpoints, its tuning budgets.

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

    [bench.choice.depth]                    # a setting chosen by the plan's endpoints, in order of preference:
    candidates = { "8" = "depth-rule-8", "12" = "depth-rule-12" }   # the first whose verdict is "better" wins
    otherwise = "12"                        # where none is

Each primary cell (variant x split x gamma) pairs the variant with the strongest baseline there, the
one whose mean is best at that cell, over the seeds both have; the family's p-values are
Holm-adjusted and its intervals are Bonferroni's (1 − 0.05/m), so a cell is "better" or "worse"
only when its adjusted p is at most 0.05. A plan's other families are secondary, each adjusted
within itself; an endpoint with ``statistic = "rising"`` is described (where the mean per-layer test
loss rises), not tested. Every other paired difference is exploratory.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from layerdescent.analysis.groups import (
    KEPT_EPOCH,
    baseline_group,
    domain_mean_results,
    domain_results,
    kept_epoch_results,
    mean_domains,
    summarize,
)
from layerdescent.analysis.stats import holm, paired_difference
from layerdescent.analysis.tuning import Search, parse_search, search_table
from layerdescent.errors import ConfigError
from layerdescent.registry import get_registry
from layerdescent.run.config_file import read_toml
from layerdescent.run.provenance import differ

FAMILY_ALPHA = 0.05  # the family-wise error rate Holm's adjustment controls


@dataclass(frozen=True)
class Primary:
    """The pre-registered family: a metric and its direction, at these gammas and splits, for these variants."""

    metric: str
    higher_is_better: bool
    gammas: tuple[float, ...]
    variants: tuple[str, ...]
    splits: tuple[str, ...] = ("test",)
    adopted: tuple[str, ...] = ()


@dataclass(frozen=True)
class Endpoint:
    """One endpoint a plan declares by name: a variant's metric at one gamma on one split, against a baseline, in a family.

    ``against`` is "strongest" (the named baselines' best mean there; better only where better than
    each) or one variant's label. ``statistic`` "rising" describes instead of testing: the
    transitions at which the mean (over seeds) per-layer test loss rises.
    """

    name: str
    variant: str
    metric: str = ""
    higher_is_better: bool = False
    gamma: float = 0.0
    on: str = "test"
    against: str = "strongest"
    family: str = "primary"
    statistic: str = "difference"


STATISTICS = ("difference", "rising")


@dataclass(frozen=True)
class Choice:
    """A setting the plan's endpoints choose: the first candidate whose endpoint is judged better, else ``otherwise``."""

    name: str
    candidates: tuple[tuple[str, str], ...]  # (value, endpoint name), the preferred first
    otherwise: str

    def decide(self, cells: dict[str, dict]) -> tuple[str | None, str]:
        """The chosen value (None while a candidate before the first better one is unjudged) and why, from the cells by endpoint name."""
        said = []
        for value, name in self.candidates:
            verdict = cells.get(name, {}).get("verdict", "missing")
            if verdict == "better":
                return value, f"{name} is better" + (f", after {'; '.join(said)}" if said else "")
            if verdict == "missing":
                return None, f"{name} has not run" + (f", after {'; '.join(said)}" if said else "")
            said.append(f"{name} {verdict}")
        return self.otherwise, f"otherwise, as no candidate is better: {'; '.join(said)}"


def decides_the_claim(family: str) -> bool:
    """Whether a family is one of the claim's: "primary", or "primary" and a name ("primary V2"), each Holm-adjusted within itself."""
    return family.split(maxsplit=1)[:1] == ["primary"]


@dataclass(frozen=True)
class BenchSpec:
    """A bench file's judging keys; the default judges against erm, with every verdict exploratory."""

    baselines: tuple[str, ...] = ("erm",)
    primary: Primary | None = None
    tuning: dict[str, int] = field(default_factory=dict)
    plan: tuple[Endpoint, ...] = ()
    searches: dict[str, Search] = field(default_factory=dict)  # the variants the tool tunes, by their declared rule
    choices: tuple[Choice, ...] = ()

    def search_for(self, variant: str) -> Search | None:
        """The search whose adopted settings ``variant``'s main runs train at: its own, or one that takes it; None where untuned."""
        return self.searches.get(variant) or next((s for s in self.searches.values() if variant in s.takes), None)

    def claim(self) -> Primary | None:
        """The family "primary" as one Primary (its metric, gammas, splits and variants, as plots and REPORT.md read it); None where none is declared."""
        if self.primary is not None:
            return self.primary
        tested = [e for e in self.plan if e.family == "primary" and e.statistic == "difference"]
        if not tested:
            return None
        return Primary(
            tested[0].metric,
            tested[0].higher_is_better,
            tuple(dict.fromkeys(e.gamma for e in tested)),
            tuple(dict.fromkeys(e.variant for e in tested)),
            tuple(dict.fromkeys(e.on for e in tested)),
        )

    def endpoints(self) -> tuple[Endpoint, ...]:
        """The declared endpoints: the plan's, or ``[bench.primary]``'s cells as the family "primary" (its older form)."""
        p = self.primary
        if self.plan or p is None:
            return self.plan
        return tuple(
            Endpoint(f"{v} on {s} at γ {g:g}", v, p.metric, p.higher_is_better, g, s)
            for v in p.variants
            for s in p.splits
            for g in p.gammas
        )


PRIMARY_KEYS = {f.name for f in dataclasses.fields(Primary)}
ENDPOINT_KEYS = {f.name for f in dataclasses.fields(Endpoint)} - {"name"}


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
    if primary is not None and plan:
        raise ConfigError("bench.primary and bench.plan both declare endpoints: [bench.primary] is the older form, keep [bench.plan] alone")
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
        unknown = set(e) - ENDPOINT_KEYS
        if unknown:
            raise ConfigError(f"unknown key {where}.{sorted(unknown)[0]} (allowed: {', '.join(sorted(ENDPOINT_KEYS))})")
        statistic = e.get("statistic", "difference")
        if statistic not in STATISTICS:
            raise ConfigError(f"{where}.statistic must be one of {', '.join(STATISTICS)}, got {statistic!r}")
        needed = ("variant", "gamma") if statistic == "rising" else ("variant", "metric", "higher_is_better", "gamma")
        missing = [k for k in needed if k not in e]
        if missing:
            raise ConfigError(f"{where} lacks {missing[0]!r} (a {statistic} endpoint needs {', '.join(needed)})")
        for key in ("variant", "metric", "on", "against", "family"):
            if key in e and (not isinstance(e[key], str) or not e[key]):
                raise ConfigError(f"{where}.{key} must be a non-empty string, got {e[key]!r}")
        if "higher_is_better" in e and not isinstance(e["higher_is_better"], bool):
            raise ConfigError(f"{where}.higher_is_better must be true or false")
        gamma = e["gamma"]
        if not isinstance(gamma, (int, float)) or isinstance(gamma, bool) or not gamma >= 0:
            raise ConfigError(f"{where}.gamma must be one perturbation level >= 0, e.g. gamma = 0.5, got {gamma!r}")
        endpoints.append(Endpoint(name=name, **{**e, "gamma": float(gamma)}))
    return tuple(endpoints)


def _expanded(name: str, e: dict) -> list[tuple[str, dict]]:
    """An endpoint table whose ``variant`` or ``gamma`` is a list, as one endpoint per (variant, gamma): "NAME VARIANT γ G"."""
    variants, gammas = e.get("variant"), e.get("gamma")
    if not isinstance(variants, list) and not isinstance(gammas, list):
        return [(name, e)]
    for key, values in (("variant", variants), ("gamma", gammas)):
        if isinstance(values, list) and not values:
            raise ConfigError(f"bench.plan.{name}.{key} is an empty list: name one or more")
    variants = variants if isinstance(variants, list) else [variants]
    gammas = gammas if isinstance(gammas, list) else [gammas]
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
    names = {e.name for e in plan if e.statistic == "difference"}
    choices = []
    for name, c in table.items():
        where = f"bench.choice.{name}"
        unknown = set(c) - {"candidates", "otherwise"}
        if unknown:
            raise ConfigError(f"unknown key {where}.{sorted(unknown)[0]} (allowed: candidates, otherwise)")
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
    unknown = set(table) - PRIMARY_KEYS
    if unknown:
        raise ConfigError(f"unknown key bench.primary.{sorted(unknown)[0]} (allowed: {', '.join(sorted(PRIMARY_KEYS))})")
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


def spec_table(spec: BenchSpec) -> dict:
    """``spec`` as the ``[bench]`` keys :func:`parse_spec` reads back, for a report to remember a bench's judging keys by."""
    table: dict = {"baselines": list(spec.baselines), "tuning": {**spec.tuning, **{v: search_table(s) for v, s in spec.searches.items()}}}
    if spec.primary is not None:
        primary = {name: list(v) if isinstance(v, tuple) else v for name, v in dataclasses.asdict(spec.primary).items()}
        table["primary"] = {name: v for name, v in primary.items() if v != []}
    if spec.plan:
        table["plan"] = {e.name: _endpoint_table(e) for e in spec.plan}
    if spec.choices:
        table["choice"] = {c.name: {"candidates": dict(c.candidates), "otherwise": c.otherwise} for c in spec.choices}
    return table


def _endpoint_table(e: Endpoint) -> dict:
    """An endpoint as its plan table: the optional keys left out at their defaults, so a plan that spells one out hashes alike."""
    required = ("variant", "gamma") if e.statistic == "rising" else ("variant", "metric", "higher_is_better", "gamma")
    defaults = {f.name: f.default for f in dataclasses.fields(Endpoint)}
    return {k: v for k, v in dataclasses.asdict(e).items() if k != "name" and (k in required or v != defaults[k])}


def read_spec(path: str | Path) -> BenchSpec:
    """The judging keys of a bench file's ``[bench]`` table."""

    bench = read_toml(path).get("bench")
    if not isinstance(bench, dict):
        raise ConfigError(f"{path} has no [bench] table: --bench names the bench file the runs were made from")
    return parse_spec(bench)


def split_views(results: list[dict]) -> dict[str, tuple[list[dict], dict]]:
    """Per evaluation set (``test`` first, then each domain), its results and their groups."""
    views = {"test": results, **domain_results(results)}
    return {name: (view, summarize(view)) for name, view in views.items()}


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
    """Every endpoint judged, in order: Holm within each family, Bonferroni intervals (1 − α/m) over it; "rising" ones described.

    An endpoint whose variant, split or gamma the runs lack is still counted in its family (m) and
    marked missing, so an unfinished bench never looks like a smaller family.
    """
    views = dict(views if views is not None else split_views(results))
    for e in endpoints:  # a mean over domains ("mean(carphone, bikes)"), or the kept epoch's validation, is a view of its own
        if e.on not in views and (domains := mean_domains(e.on)):
            view = domain_mean_results(results, domains)
            views[e.on] = (view, summarize(view))
        elif e.on == KEPT_EPOCH and e.on not in views:
            view = kept_epoch_results(results)
            views[e.on] = (view, summarize(view))
    cells = [_cell(views.get(e.on), spec, e) for e in endpoints]
    for family in dict.fromkeys(e.family for e in endpoints if e.statistic == "difference"):
        members = [c for c, e in zip(cells, endpoints) if e.family == family and e.statistic == "difference"]
        m = len(members)
        adjusted = holm([c["difference"]["p"] if c.get("difference") else None for c in members])
        for cell, p in zip(members, adjusted):
            cell["p_holm"], cell["m"] = p, m
            if not cell.get("difference"):
                cell["verdict"] = "missing"
                continue
            d = cell["difference"]
            better = p is not None and p <= FAMILY_ALPHA
            if d["n"] < 2:  # one pair has no spread to judge by: no test, so no verdict either way
                cell["verdict"] = "undecided: one seed"
            else:
                cell["verdict"] = ("better" if d["mean"] > 0 else "worse") if better else "no difference"
            cell["simultaneous"] = paired_difference(cell["a"], cell["b"], level=1 - FAMILY_ALPHA / m)
    return cells


def _cell(view, spec: BenchSpec, e: Endpoint) -> dict:
    """One endpoint's cell, signed so a difference > 0 favours the variant; without its runs, the bare cell (missing)."""
    cell = {"name": e.name, "family": e.family, "statistic": e.statistic, "variant": e.variant, "split": e.on, "gamma": e.gamma}
    if view is None or e.variant not in view[1] or not view[0]:
        return {**cell, "metric": e.metric}
    if e.statistic == "rising":
        return {**cell, **rising(view[1], e.variant, e.gamma)}
    against = None if e.against == "strongest" else (e.against,)
    return {**cell, **versus_strongest(*view, spec, e.variant, e.gamma, e.metric, 1.0 if e.higher_is_better else -1.0, e.on, against)}


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
) -> dict:
    """``variant`` against the named baseline with the best mean at ``gamma`` in its context, over the seeds both have.

    The baselines are the groups of ``spec.baselines``' solvers nearest the variant, or the labels
    ``against``. The values are signed by ``sign`` (-1 where lower is better) so that a difference
    > 0 favours the variant. "Better" must hold against every baseline, not the strongest alone (an
    intersection-union test: the difference's p is the largest of the baselines' p, and it is
    distinct only when every baseline's interval is above 0), so that "holds" means "beats erm and
    deep supervision"; ``decided_by`` names the baseline whose comparison gave the p.
    ``cross_code`` says whether the two sides were made by different code, ``untuned`` whether the
    variant had tuning runs the strongest baseline did not.
    """

    cell = {"variant": variant, "split": split, "gamma": gamma, "metric": metric}
    value = {(r["label"], r["seed"], float(g["gamma"])): g["metrics"].get(metric) for r in results for g in r["gammas"]}
    candidates = {}
    labels = against if against is not None else [baseline_group(groups, variant, solver) for solver in spec.baselines]
    for label in labels:
        stats = groups[label]["gammas"].get(gamma, {}).get("metrics", {}).get(metric) if label in groups else None
        if stats is not None:
            candidates[label] = sign * stats["mean"]
    own = groups[variant]["gammas"].get(gamma, {}).get("metrics", {}).get(metric)
    if not candidates or own is None:
        return cell
    versus = {}
    for label in candidates:
        seeds = [
            s
            for s in sorted(set(groups[variant]["seeds"]) & set(groups[label]["seeds"]))
            if value.get((variant, s, gamma)) is not None and value.get((label, s, gamma)) is not None
        ]
        a, b = [sign * value[variant, s, gamma] for s in seeds], [sign * value[label, s, gamma] for s in seeds]
        versus[label] = (seeds, a, b, paired_difference(a, b) if seeds else None)
    strongest = decided_by = max(candidates, key=candidates.get)
    seeds, a, b, difference = versus[strongest]
    if difference is not None and difference["mean"] > 0:
        others = [d for _, _, _, d in versus.values()]
        better_than_all = all(d is not None and d["distinct"] and d["mean"] > 0 for d in others)
        worst_p = None if any(d is None or d["p"] is None or d["mean"] <= 0 for d in others) else max(d["p"] for d in others)
        if worst_p is not None:
            decided_by = max(versus, key=lambda label: versus[label][3]["p"])
        difference = {**difference, "distinct": better_than_all, "p": worst_p}
    made = {label: [] for label in (variant, strongest)}
    for r in results:
        if r["label"] in made and r["seed"] in seeds and "made_by" in r:
            made[r["label"]].append(r["made_by"])
    return {
        **cell,
        "baseline": strongest,
        "baseline_solver": groups[strongest]["solver"],
        "baselines": list(candidates),
        "decided_by": decided_by,
        "seeds": seeds,
        "a": a,
        "b": b,
        "difference": difference,
        "versus": {label: d for label, (_, _, _, d) in versus.items()},
        "cross_code": differ(made[variant] + made[strongest]),
        "untuned": untuned(spec, variant, strongest, groups[strongest]["solver"]),
    }


def primary_cells(results: list[dict], spec: BenchSpec, views: dict | None = None) -> list[dict]:
    """The claim's families of the declared endpoints ("primary", "primary V2", ...), judged (empty for a bench that declares none)."""
    cells = judge(results, spec, spec.endpoints(), views)
    return [c for c in cells if decides_the_claim(c["family"]) and c["statistic"] == "difference"]
