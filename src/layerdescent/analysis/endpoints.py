"""What a bench is judged by: its named baselines, its declared endpoints, the choices they make, its tuning budgets; the meaning of every judging key.

Each endpoint pairs the variant with its baseline over the seeds both have and is one test in its
family; Holm's step-down controls each family's error rate at 0.05 (analysis/judging.py). The family
"primary" (or "primary NAME") decides the bench's claim; every other family is secondary. Every
other paired difference a report shows is exploratory. `layerdescent plan --reference` prints every
key of the bench file, generated from the meanings below. A bench file's keys are read and checked
into these in ``endpoints_file``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from layerdescent.analysis.tuning_search import Search, search_table


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
    """One endpoint a plan declares by name: a variant's metric at one gamma (or over a γ range) on one split, against a baseline, in a family.

    ``against`` is "strongest" (the named baselines' best mean there; the verdict must hold against
    each) or one variant's label. ``test`` is "superiority" (two-sided: better, worse or no
    difference), "non-inferiority" or "equivalence" within ``margin`` (a number in the metric's
    units, or "2%" of the baseline's mean). ``aggregate`` "mean" or "area" makes a list of gammas one
    endpoint: the mean over them, or the area under the curve by the trapezoid rule between the
    first and the last. ``statistic`` "rising" counts each seed's rising transitions of the
    per-layer loss: described (the mean loss's rises) unless ``test = "superiority"`` tests the
    counts against the baseline's (the exact sign-flip test).
    """

    name: str
    variant: str
    metric: str = ""
    higher_is_better: bool = False
    gamma: float | tuple[float, ...] = 0.0
    on: str = "test"
    against: str = "strongest"
    family: str = "primary"
    statistic: str = "difference"
    test: str = ""  # "" is the statistic's default: superiority for a difference, described for rising
    margin: float | str | None = None
    aggregate: str = ""  # "mean" or "area" over the gammas of a list; "" for one gamma
    effect: float | str | None = None  # the smallest effect of interest a superiority test is powered for (the plan command)
    also: tuple[str, ...] = ()  # estimates reported beside the test (stats.ESTIMATES): rliable's IQM, probability of improvement
    claim: str = ""  # the paper's claim it decides in the cross-bench table (CLAIMS); "" for none
    after_runs: bool = False  # declared after the runs were made: judged and shown, never confirmatory

    @property
    def kind(self) -> str:
        """The test the endpoint declares, its statistic's default where it names none."""
        return self.test or ("described" if self.statistic == "rising" else "superiority")

    @property
    def tested(self) -> bool:
        """Whether the endpoint is a test in its family (every difference, and a rising count that declares a test)."""
        return self.kind != "described"

    @property
    def at(self) -> str:
        """Where on the γ axis it reads, as a page says it: "0.5", "mean over γ 0.5, 1, 2", "area over γ 0.5–2"."""
        if not self.aggregate:
            return f"{self.gamma:g}"
        if self.aggregate == "mean":
            return "mean over γ " + ", ".join(f"{g:g}" for g in self.gamma)
        return f"area over γ {self.gamma[0]:g}–{self.gamma[-1]:g}"


STATISTICS = ("difference", "rising")
TESTS = {"difference": ("superiority", "non-inferiority", "equivalence"), "rising": ("described", "superiority")}
AGGREGATES = ("mean", "area")
# The paper's claims an endpoint may decide in `layerdescent report --claims`, each by the test it is.
CLAIMS = {
    "descent": "monotone layerwise descent: a rising-transitions endpoint",
    "degradation": "graceful degradation: a difference endpoint's superiority test (a curve endpoint over a γ range)",
    "parity": "in-distribution parity: a non-inferiority or equivalence test within a margin",
}


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
        tested = [e for e in self.plan if e.family == "primary" and e.statistic == "difference" and not e.aggregate]
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
        """The declared endpoints: ``[bench.primary]``'s cells as the family "primary" (its older form), then the plan's."""
        p = self.primary
        cells = (
            ()
            if p is None
            else tuple(
                Endpoint(f"{v} on {s} at γ {g:g}", v, p.metric, p.higher_is_better, g, s)
                for v in p.variants
                for s in p.splits
                for g in p.gammas
            )
        )
        return cells + self.plan


# The schema's words: each key a reader accepts, with its meaning (the plan reference is generated from these; a test
# checks they name exactly the keys each table accepts).
JUDGING_HELP = {
    "baselines": 'solvers every constrained variant is paired with (default ["erm"]); none may enforce the constraints',
    "primary": "the older form of the claim's family: metric, higher_is_better, gammas, variants, splits, adopted",
    "plan": "the endpoints, one table each by name, in families (not with `primary`)",
    "tuning": "per variant, the runs spent choosing its setting, or the search the tool runs ([bench.tuning.VARIANT])",
    "choice": "settings chosen by the plan's own verdicts ([bench.choice.NAME])",
}
JUDGING_KEYS = set(JUDGING_HELP)
ENDPOINT_HELP = {
    "variant": "the variant judged (a list: one endpoint per variant)",
    "metric": 'the metric the task reports, read at the gamma (not for `statistic = "rising"`)',
    "higher_is_better": 'the metric\'s direction (not for `statistic = "rising"`: fewer rises is better)',
    "gamma": "the perturbation level read (a list: one endpoint per gamma, or one over them with `aggregate`)",
    "on": '"test" (default), an evaluation domain, "mean(a, b)" over domains, or "validation (kept epoch)"',
    "against": '"strongest" (default: the named baselines, the verdict holding against each) or one variant\'s label',
    "family": '"primary" (default) or "primary NAME" decide the claim; any other name is a secondary family; Holm within each',
    "statistic": '"difference" (default) or "rising": each seed\'s count of rising transitions of the per-layer test loss',
    "test": '"superiority" (default), "non-inferiority" or "equivalence" within `margin`; for "rising", "described" (default) or "superiority"',
    "margin": "for non-inferiority and equivalence, fixed before the runs: a number in the metric's units, or \"2%\" of the baseline's mean",
    "aggregate": '"mean" over the gammas listed, or "area": the trapezoid area under the curve from the first to the last',
    "also": 'estimates shown beside the test, not tests: "iqm" (difference of interquartile means) and "probability of improvement", each with a seeded stratified-bootstrap 95% interval',
    "effect": "the smallest effect of interest of a superiority test, written as `margin` is: `layerdescent plan FILE --pilot DIR` gives its power",
    "claim": '"descent", "degradation" or "parity": the paper\'s claim it decides in `layerdescent report --claims`, by the test that claim is',
    "after_runs": "true for an endpoint declared after its runs were made: judged and shown, always exploratory, in a family of its own; the plan record leaves it out",
}
PRIMARY_HELP = {
    "metric": "the metric judged",
    "higher_is_better": "its direction",
    "gammas": "the perturbation levels, one cell each",
    "splits": '"test" (default), evaluation domains, or "mean(a, b)"',
    "variants": "the pre-registered variants, judged against the strongest baseline at each cell",
    "adopted": "settings tuned afterwards, shown beside, never instead",
}
CHOICE_HELP = {
    "candidates": "each value mapped to the tested endpoint that chooses it, the preferred first: the first judged better wins",
    "otherwise": "the value chosen where no candidate's endpoint is better",
}
PRIMARY_KEYS = {f.name for f in dataclasses.fields(Primary)}
ENDPOINT_KEYS = {f.name for f in dataclasses.fields(Endpoint)} - {"name"}


def margin_for(e: Endpoint, baseline_mean: float, size: float | str | None = None) -> float:
    """The endpoint's margin (or another ``size`` written as one) in the metric's units, a relative one taken of the baseline's mean."""
    size = e.margin if size is None else size
    if isinstance(size, str):
        return float(size.removesuffix("%")) / 100 * abs(baseline_mean)
    return float(size or 0.0)


def spec_table(spec: BenchSpec) -> dict:
    """``spec`` as the ``[bench]`` keys :func:`~layerdescent.analysis.endpoints_file.parse_spec` reads back, for a report to remember a bench's judging keys by."""
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
    table = {k: v for k, v in dataclasses.asdict(e).items() if k != "name" and (k in required or v != defaults[k])}
    table = {**table, "also": list(e.also)} if e.also else table
    return {**table, "gamma": list(e.gamma)} if e.aggregate else table
