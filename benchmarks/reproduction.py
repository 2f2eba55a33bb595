"""The paper's claims checked against every committed bench: writes the reproduction report.

    python benchmarks/reproduction.py --out benchmarks/REPORT.md --since 235704a
    python benchmarks/reproduction.py --summaries     # every bench's summary.md and plots, by the same rules

Reads the run directories under ``benchmarks/results/`` (nothing is trained or evaluated here) and
each bench file's judging keys (``[bench] baselines``, ``[bench.primary]``, ``[bench.tuning]``;
see ``layerdescent.analysis.endpoints``). Every constrained variant is paired with the named baselines of
its own context, and at each gamma with the strongest of them (the one whose mean is best there),
so "holds" means "beats erm and deep supervision" where the bench names both. The four claims of
"A Constrained Optimization Perspective of Unrolled Transformers", by fixed rules:

- monotone layerwise descent: the mean test loss falls at every layer, in distribution (at the γ of
  the rising-transitions endpoint the bench's claim declares for the variant, where its plan has one);
- graceful degradation: at the larger gammas (the upper half of the nonzero grid) the paired
  difference from the strongest baseline is distinguishably better somewhere and never distinguishably worse;
- in-distribution parity: a non-inferiority (or equivalence) endpoint the bench's claim family declares with a margin
  registered before the runs, judged by that test; where none is declared, undecided: "not distinguishably worse" at the
  smallest gamma (the number shown) is absence of evidence, never parity;
- deeper constrained models gain more: where a bench pairs three or more depths, the gain over the
  strongest baseline at the largest gamma grows with depth and is distinguishable at the deepest.

A claim holds for a view when it holds for every pair, partly when for some, and does not when for
none. Where the bench file pre-registers a primary family, its view is judged on the family alone:
the pre-registered variant(s) at the family's gammas, "distinguishable" meaning a Holm-adjusted p at
most 0.05; a setting adopted afterwards by tuning is shown beside it, never instead. Every other
view is exploratory (95% t intervals, uncorrected). A bench over training regimes (labels carrying
``train_gamma=X``) is judged once per regime, and a bench with evaluation domains once more on
each domain. Superseded benches are judged by the same rules under "Earlier benches".
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import statistics
import subprocess
from pathlib import Path
from typing import NamedTuple

from layerdescent.analysis.endpoints import BenchSpec, decides_the_claim, parse_spec
from layerdescent.analysis.groups import baseline_group
from layerdescent.analysis.judging import primary_cells, split_views, versus_strongest
from layerdescent.analysis.report import (
    collect,
    comparisons,
    context_titles,
    domain_results,
    format_difference,
    role,
    summarize,
    write_report,
)
from layerdescent.analysis.stats import excluding_zero_by_chance
from layerdescent.run.config_file import read_toml

ROOT = Path(__file__).resolve().parent
SAME_NUMBERS = ("tests/test_same_numbers.py", "a579cd4")  # the test that pins each solver's numbers, and to which commit's


class Bench(NamedTuple):
    """A committed bench: where its runs are, the file that made them, and the metric judged."""

    results: str
    config: str
    metric: str
    higher_is_better: bool
    regime: str = ""  # a regex whose group in a label names its training regime; "" for none
    command: str = ""  # what made the runs, where it is not `layerdescent bench CONFIG` (a re-evaluation)
    superseded_by: str = ""  # the bench that replaced it; "" for a current one
    flags: str = ""  # what followed `layerdescent bench CONFIG --out RESULTS` for the main runs: the settings tuning adopted
    workers: int | None = None  # runs trained at once, where no report of the bench remembers it


BENCHES = {
    "lista (unrolled ISTA, synthetic sparse codes)": Bench("results/lista", "lista.toml", "mse", False),
    "lista on a training band, descent held per level and per sample": Bench("results/lista_shift", "lista_shift.toml", "mse", False),
    "text classification (MiniLM, movie reviews, Gaussian embedding noise)": Bench(
        "results/text",
        "text.toml",
        "accuracy",
        True,
        superseded_by="text classification in the paper's regimes (MiniLM, best validation epoch)",
    ),
    "video denoising (3 videos x 3 architectures, Gaussian noise)": Bench(
        "results/video", "video.toml", "rmse", False, superseded_by="video denoising at the chosen setting (3 videos x 3 architectures)"
    ),
    "video denoising by depth (DUST on vtest, trained clean)": Bench("results/video_depth", "video_depth.toml", "rmse", False),
    "video denoising by depth at the training noise (DUST on vtest, trained at 0.13)": Bench(
        "results/video_depth_noisy", "video_depth_noisy.toml", "rmse", False
    ),
    "LLM finetuning (SmolLM2-135M, LoRA, 64 steps, whole-vocabulary lens, Gaussian embedding noise)": Bench(
        "results/llm_vocab64",
        "llm_vocab64.toml",
        "accuracy",
        True,
        superseded_by="LLM finetuning (SmolLM2-135M, LoRA, 512 steps, label lens)",
    ),
    "text classification in the paper's regimes (MiniLM, best validation epoch)": Bench(
        "results/text_paper", "text_paper.toml", "accuracy", True, r"train_gamma=([0-9.]+)"
    ),
    "text classification with a deep encoder (SmolLM2-135M, 30 layers, LoRA)": Bench(
        "results/text_deep", "text_deep.toml", "accuracy", True
    ),
    "text classification on a training band, descent held per level and per sample (MiniLM)": Bench(
        "results/text_shift", "text_shift.toml", "accuracy", True
    ),
    "video denoising, constraints that bind (vtest, alpha x reference)": Bench("results/video_bind", "video_bind.toml", "rmse", False),
    "video denoising at the chosen setting (3 videos x 3 architectures)": Bench("results/video_paper", "video_paper.toml", "rmse", False),
    "video denoising at the chosen setting, salt-and-pepper noise (the same models)": Bench(
        "results/video_paper_saltpepper",
        "video_paper.toml",
        "rmse",
        False,
        command="layerdescent evaluate benchmarks/results/video_paper --out benchmarks/results/video_paper_saltpepper "
        "--set task.perturbation=salt-pepper --set 'eval.gammas=[0.0, 0.02, 0.05, 0.1, 0.2]'",
    ),
    "video denoising at depth 12 (3 videos x 3 architectures, trained at 0.13)": Bench(
        "results/video_deep", "video_deep.toml", "rmse", False
    ),
    "video denoising at depth 12, salt-and-pepper noise (the same models)": Bench(
        "results/video_deep_saltpepper",
        "video_deep.toml",
        "rmse",
        False,
        command="layerdescent evaluate benchmarks/results/video_deep --out benchmarks/results/video_deep_saltpepper "
        "--set task.perturbation=salt-pepper --set 'eval.gammas=[0.0, 0.02, 0.05, 0.1, 0.2]'",
    ),
    "LLM finetuning (SmolLM2-135M, LoRA, 512 steps, label lens)": Bench("results/llm", "llm.toml", "accuracy", True),
    "lista on a second training band, per level against tuned deep supervision": Bench(
        "results/lista_band2",
        "lista_band2.toml",
        "mse",
        False,
        flags="--set 'bench.variants.penalty-band.solver.weights=\"geometric\"' --set bench.variants.penalty-band.solver.rho=0.7 "
        "--set bench.variants.levels.solver.dual_lr=50.0 "
        '--set \'bench.variants.levels.constraints=[{kind = "descent", alpha = 0.05, levels = "band"}]\' '
        "--set bench.variants.primal-dual.solver.dual_lr=5.0 "
        "--set 'bench.variants.primal-dual.constraints=[{kind = \"descent\", alpha = 0.05}]' "
        "--only erm-band --only penalty-band --only levels --only primal-dual --workers 2",
    ),
    "video denoising on a training band, per level against tuned deep supervision (depth 12)": Bench(
        "results/video_levels",
        "video_levels.toml",
        "rmse",
        False,
        flags="--workers 2 --only 'vtest-*' "
        "--set 'bench.variants.vtest-dust-levels.solver.dual_lr=50.0' "
        '--set \'bench.variants.vtest-dust-levels.constraints=[{kind = "descent", alpha = 0.2, reference = "detached", levels = "band"}]\' '
        "--set 'bench.variants.vtest-transformer-levels.solver.dual_lr=50.0' "
        '--set \'bench.variants.vtest-transformer-levels.constraints=[{kind = "descent", alpha = 0.2, reference = "detached", levels = "band"}]\' '
        "--set 'bench.variants.vtest-dust-primal-dual.solver.dual_lr=50.0' "
        '--set \'bench.variants.vtest-dust-primal-dual.constraints=[{kind = "descent", alpha = 0.2, reference = "detached"}]\' '
        "--set 'bench.variants.vtest-transformer-primal-dual.solver.dual_lr=50.0' "
        '--set \'bench.variants.vtest-transformer-primal-dual.constraints=[{kind = "descent", alpha = 0.2, reference = "detached"}]\' '
        "--set 'bench.variants.vtest-dust-penalty-band.solver.weights=\"linear\"' "
        "--set 'bench.variants.vtest-transformer-penalty-band.solver.weights=\"uniform\"'",
    ),
}
CLAIMS = ("monotone layerwise descent", "graceful degradation", "in-distribution parity", "deeper constrained models gain more")


class Pair(NamedTuple):
    """One constrained variant against the named baselines of its context, on the judged metric."""

    label: str
    context: str
    depth: int | None
    descent: tuple[int, int]  # transitions where the mean test loss falls, of all, the constrained variant
    baseline_descent: dict[str, tuple[int, int]]  # the same for each baseline solver's group it is paired with
    cells: dict[float, dict]  # gamma -> endpoints.versus_strongest (its "difference" signed so > 0 is better)
    upper: list[float]  # the larger gammas
    role: str  # "primary" (in the family), "pre-registered" (outside it), "adopted" (tuned afterwards) or "exploratory"


def _falls(layer_loss: list[float]) -> tuple[int, int]:
    return sum(b < a for a, b in zip(layer_loss, layer_loss[1:])), len(layer_loss) - 1


# Benches summarized by --summaries but judged by no claim (benchmarks/solvers.py tables this one)
SUMMARIZED = {
    "every primal-dual formulation and scheme on lista": Bench("results/lista_solvers", "lista_solvers.toml", "mse", False, workers=1)
}


def spec_for(root: Path, bench: Bench) -> BenchSpec:
    """The bench file's judging keys, from the bench file beside ``results/`` under ``root`` (the defaults where there is none; a re-evaluation's all exploratory)."""
    path = root / bench.config
    spec = parse_spec(read_toml(path).get("bench", {})) if path.exists() else BenchSpec()
    # a re-evaluation (under another perturbation) is not what the bench file registered its endpoints for, nor tuned
    return dataclasses.replace(spec, primary=None, plan=(), searches={}, choices=()) if bench.command else spec


def views(results: list[dict], bench: Bench) -> dict[tuple[str, str], list[dict]]:
    """The results judged separately, keyed (regime, domain): per training regime (runs of none join every regime), then per domain."""

    def regime_of(result: dict) -> str:
        match = re.search(bench.regime, result["label"]) if bench.regime else None
        return match.group(1) if match else ""

    sets = {"": results, **domain_results(results)}
    out = {}
    for domain, subset in sets.items():
        regimes = {regime_of(r) for r in subset} - {""}
        for regime in sorted(regimes) or [""]:
            out[regime, domain] = [r for r in subset if regime_of(r) in ("", regime)]
    return out


def view_title(regime: str, domain: str) -> str:
    """How a view is named in the report: "trained at 0.8, domain amazon", or "" for the whole bench."""
    return ", ".join(filter(None, [f"trained at {regime}" if regime else "", f"domain {domain}" if domain else ""]))


def figures_for(folder: Path, regime: str, domain: str) -> list[str]:
    """The figures a view's section shows: the paper-layout ones of benchmarks/figures.py that fit it, else the report's plots.

    A figure named ``figureN_train_gamma=X`` or ``figureN_domain=Y`` belongs to that regime or
    domain only. Figure 4 (the paper's domain-shift figure) and the ``domain=`` figures go with the
    domain views, the others with the test split's, beside the trade-off plot; a domain view
    without a paper figure shows none.
    """
    wanted = {"train_gamma": regime, "domain": domain}

    def fits(name: str) -> bool:
        parts = dict(re.findall(r"(train_gamma|domain)=([^_]+)", Path(name).stem))
        on_domains = "domain" in parts or name.startswith("figure4")
        return on_domains == bool(domain) and all(wanted[key] == value for key, value in parts.items())

    paper = sorted(f.name for f in folder.glob("figure[0-9]*.png") if fits(f.name))
    if domain:
        rest = ()  # the per-domain grid of every variant is too large to read in a report: its summary has it
    else:
        rest = (
            ("loss_vs_layer.png", "tradeoff.png")
            if paper
            else ("metric_vs_gamma.png", "loss_vs_layer.png", "ablation_layers.png", "tradeoff.png")
        )
    return paper + [f for f in rest if (folder / f).exists()]


def _pairs(results: list[dict], bench: Bench, spec: BenchSpec, family: dict) -> list[Pair]:
    """Every constrained variant of a view against its baselines; ``family`` maps (variant, gamma) to its judged primary cell."""
    groups = summarize(results)
    titles = context_titles(groups)
    sign = 1.0 if bench.higher_is_better else -1.0
    primary = spec.claim()
    # the declared endpoints are on test: a domain's view (judged without the family) keeps descent in distribution
    # (the claim's: a secondary family that describes descent at other gammas does not move the claim's)
    declared = [e for e in spec.endpoints() if e.statistic == "rising" and e.on == "test" and decides_the_claim(e.family)]
    declared_descent = {e.variant: e.gamma for e in declared} if family else {}
    pairs = []
    for label, grp in groups.items():
        if not role(grp["solver"], "enforces_constraints") or grp["split"] != "test":
            continue
        refs = {solver: ref for solver in spec.baselines if (ref := baseline_group(groups, label, solver))}
        if not refs:
            continue
        gammas = sorted(set(grp["gammas"]).intersection(*(groups[ref]["gammas"] for ref in refs.values())))
        # the pre-registered variant is judged on its family where the view is one of the family's splits, else uncorrected
        kind = (
            ("primary" if any(key[0] == label for key in family) else "pre-registered")
            if primary and label in primary.variants
            else "adopted"
            if primary and label in primary.adopted
            else "exploratory"
        )
        cells = {}
        for gamma in gammas:
            # a primary variant's family cells are judged with Holm's adjustment over the family
            cells[gamma] = (
                family.get((label, gamma))
                if kind == "primary" and (label, gamma) in family
                else versus_strongest(results, groups, spec, label, gamma, bench.metric, sign)
            )
        if kind == "primary":
            # the family's gammas, and the smallest, where in-distribution parity is judged (uncorrected if the family leaves it out)
            gammas = sorted({g for g in gammas if (label, g) in family} | {min(gammas)})
            cells = {g: cells[g] for g in gammas}
        nonzero = [g for g in gammas if g > 0]
        upper = (
            [g for g in nonzero if g >= statistics.median(nonzero)]
            if nonzero and kind != "primary"
            else [g for g in nonzero if (label, g) in family]
        )
        # descent in distribution, or where the plan declares a rising-transitions endpoint for the variant, at its gamma
        at = declared_descent.get(label, min(grp["gammas"]))
        at = at if at in grp["gammas"] and all(at in groups[ref]["gammas"] for ref in refs.values()) else min(grp["gammas"])
        pairs.append(
            Pair(
                label,
                titles[grp["context_key"]] or "–",
                grp["config"].get("task.layers"),
                _falls(grp["gammas"][at]["layer_loss"]["mean"]),
                {solver: _falls(groups[ref]["gammas"][at]["layer_loss"]["mean"]) for solver, ref in refs.items()},
                cells,
                upper,
                kind,
            )
        )
    return pairs


def _better(cell: dict) -> bool:
    if "verdict" in cell:  # a primary cell: Holm decides
        return cell["verdict"] == "better"
    d = cell.get("difference")
    return bool(d and d["distinct"] and d["mean"] > 0)


def _worse(cell: dict) -> bool:
    if "verdict" in cell:
        return cell["verdict"] == "worse"
    d = cell.get("difference")
    return bool(d and d["distinct"] and d["mean"] < 0)


def _verdict(passed: list[bool]) -> str:
    if not passed:
        return "not measured"
    return "holds" if all(passed) else "partly holds" if any(passed) else "does not hold"


def _shown(cell: dict) -> str:
    """A cell's difference as the report prints it: the deciding comparison's, at Holm's level for a primary cell, else the 95% one."""
    d = cell.get("simultaneous") or cell.get("difference")
    if d is None:
        return "–"
    if "verdict" in cell:
        d = {**d, "distinct": cell["verdict"] in ("better", "worse")}
    flags = "".join(["‡" if cell.get("cross_code") else "", "§" if cell.get("untuned") else ""])
    return f"{format_difference(d)} vs {cell.get('decided_by', cell['baseline'])}{flags}"


def _judged(pairs: list[Pair]) -> list[Pair]:
    """The pairs a verdict rests on: the pre-registered variant's where the bench names one (never the adopted), else every pair."""
    return [p for p in pairs if p.role in ("primary", "pre-registered")] or [p for p in pairs if p.role == "exploratory"] or pairs


UNDECIDED = "undecided (no margin registered)"  # parity without a non-inferiority test declared before the runs


def _parity(margins: list[dict]) -> str:
    """Parity's verdict from the claim family's non-inferiority or equivalence cells; undecided where it declares none."""
    if not margins:
        return UNDECIDED
    return _verdict([c.get("verdict") in ("non-inferior", "equivalent") for c in margins])


def _judge(pairs: list[Pair], margins: list[dict] = ()) -> dict[str, tuple[str, str]]:
    """Claim -> (verdict, its number in one line), on the primary pairs where there are any, else on every pair.

    ``margins``: the claim family's non-inferiority and equivalence cells, which alone decide parity.
    """
    judged = _judged(pairs)
    n = len(judged)
    descends = [p.descent[0] == p.descent[1] for p in judged]
    graceful = [any(_better(p.cells[g]) for g in p.upper) and not any(_worse(p.cells[g]) for g in p.upper) for p in judged]
    parity = [not _worse(p.cells[min(p.cells)]) for p in judged if p.cells]

    def number(claim_gamma, passed: list[bool], of: str = "") -> str:
        if n == 1 and judged[0].cells:
            gamma = claim_gamma(judged[0])
            return f"{_shown(judged[0].cells[gamma])} at γ={gamma:g}" if gamma is not None else ""
        return f"{of}{sum(passed)} of {n} pairs"

    out = {
        CLAIMS[0]: (
            _verdict(descends),
            f"{sum(descends)} of {n} pairs" if n > 1 else (f"{judged[0].descent[0]}/{judged[0].descent[1]} layers" if n else ""),
        ),
        CLAIMS[1]: (_verdict(graceful), number(lambda p: max(p.upper) if p.upper else None, graceful)),
        CLAIMS[2]: (_parity(list(margins)), number(lambda p: min(p.cells), parity, "" if margins else "not distinguishably worse in ")),
    }
    by_depth = sorted((p for p in judged if p.depth is not None), key=lambda p: p.depth)
    if len({p.depth for p in by_depth}) >= 3:
        gains = [p.cells[max(p.cells)] for p in by_depth]
        means = [g["difference"]["mean"] if g.get("difference") else float("nan") for g in gains]
        rising = all(b > a for a, b in zip(means, means[1:]))
        deepest = _better(gains[-1])
        verdict = "holds" if rising and deepest else "partly holds" if rising or deepest else "does not hold"
        out[CLAIMS[3]] = (verdict, "gain at the largest γ by depth: " + ", ".join(f"{p.depth}: {m:+.3g}" for p, m in zip(by_depth, means)))
    else:
        out[CLAIMS[3]] = ("not measured", "")
    return out


def _evidence(pairs: list[Pair]) -> dict[str, str]:
    """Claim -> the longer evidence line of a section."""
    judged = _judged(pairs)
    n = len(judged)
    solvers = list(dict.fromkeys(solver for p in judged for solver in p.baseline_descent))
    ref_descends = ", ".join(
        f"{solver}'s in {sum(p.baseline_descent.get(solver, (0, 1))[0] == p.baseline_descent.get(solver, (0, 1))[1] for p in judged)}"
        for solver in solvers
    )
    better = sum(any(_better(p.cells[g]) for g in p.upper) for p in judged)
    worse = sum(any(_worse(p.cells[g]) for g in p.upper) for p in judged)
    parity = sum(not _worse(p.cells[min(p.cells)]) for p in judged if p.cells)
    return {
        CLAIMS[
            0
        ]: f"the mean test loss falls at every layer in {sum(p.descent[0] == p.descent[1] for p in judged)} of {n} pairs ({ref_descends})",
        CLAIMS[
            1
        ]: f"at the larger gammas, distinguishably better than the strongest baseline somewhere in {better} of {n} pairs, distinguishably worse somewhere in {worse}",
        CLAIMS[2]: f"no margin was registered before the runs, so no test decides it; not distinguishably worse than the strongest "
        f"baseline at the smallest γ in {parity} of {n} pairs, which is absence of evidence, not parity",
    }


def _cell_text(verdict: str, number: str) -> str:
    return f"{verdict}: {number}" if number else verdict


def tuning_line(spec: BenchSpec, pairs: list[Pair]) -> str:
    """The tuning budgets of a bench in one line, and whether a verdict is against a baseline tuned less."""
    if not spec.tuning:
        return "Tuning budgets: the bench file states none (`[bench.tuning]`): every variant ran at settings fixed in advance."
    budgets = ", ".join(f"{label} {runs} runs" for label, runs in spec.tuning.items())
    flagged = any(c.get("untuned") for p in pairs for c in p.cells.values())
    return f"Tuning budgets (runs spent choosing a setting): {budgets}; every other variant 0." + (
        " **§ marks a difference from a baseline with settings of its own (penalty's layer weights) that got no tuning runs: "
        "the comparison is not between equally tuned methods.**"
        if flagged
        else ""
    )


def provenance_line(pairs: list[Pair]) -> str:
    """Whether any pair was made by two code versions, and which test covers the change."""
    if not any(c.get("cross_code") for p in pairs for c in p.cells.values()):
        return ""
    test, commit = SAME_NUMBERS
    return (
        f"‡ the two sides of this difference were made by different code (their recorded commits, or the keys their files record, differ; "
        f"the summary's Provenance table names which). `{test}` pins every built-in solver's results to those of {commit}, the last "
        "commit before the solver redesign, on small lista and text configs: it covers the solvers' numbers across that change, not the tasks' or the evaluation's."
    )


def _section(name: str, bench: Bench, spec: BenchSpec, judged_views: list, chance_line: str) -> list[str]:
    command = bench.command or " ".join(
        filter(None, [f"layerdescent bench benchmarks/{bench.config} --out benchmarks/{bench.results}", bench.flags])
    )
    direction = "higher" if bench.higher_is_better else "lower"
    primary = spec.claim()
    cells = (
        f"{primary.metric} of {', '.join(primary.variants)} at γ {', '.join(f'{g:g}' for g in primary.gammas)} on {', '.join(primary.splits)}"
        if spec.primary
        else "; ".join(  # a declared plan: each endpoint of its family "primary" by name ([endpoints.md](...) has them all)
            f"{e.name} ({e.metric} of {e.variant} at γ {e.at} on {e.on}{'' if e.against == 'strongest' else ' against ' + e.against})"
            for e in spec.endpoints()
            if decides_the_claim(e.family) and e.statistic == "difference" and e.kind == "superiority"
        )
    )
    family = (
        f"**Primary (pre-registered)**: {cells}, Holm-adjusted over the family, each interval at the level Holm tested its cell at; adopted afterwards by tuning, shown beside: "
        f"{', '.join(primary.adopted) or 'none'}. Every other view and pair is exploratory."
        if primary
        else "**Exploratory**: the bench file pre-registers no primary endpoint (`[bench.primary]`); 95% t intervals, uncorrected."
    )
    all_pairs = [p for _, pairs, _, _ in judged_views for p in pairs]
    lines = [
        f"## {name}",
        "",
        f"Runs: `{command}` ([summary]({bench.results}/summary.md)). Judged on {bench.metric} ({direction} is better) against "
        f"{' and '.join(spec.baselines)}: differences are variant − the strongest baseline at that γ over paired seeds, signed so that > 0 "
        "favours the variant; **bold**: distinguishable.",
        "",
        family + " " + chance_line,
        "",
        tuning_line(spec, all_pairs),
        "",
        "| view | " + " | ".join(CLAIMS) + " |",
        "|---|" + "---|" * len(CLAIMS),
    ]
    for where, _, judged, _ in judged_views:
        lines.append(f"| {where or 'test'} | " + " | ".join(judged[c][0] for c in CLAIMS) + " |")
    lines.append("")
    shown: set[str] = set()
    for where, pairs, judged, figures in judged_views:
        lines += [f"### {where or 'test'}", ""]
        if "domain" not in where:  # a domain view's verdicts are in the table above; its pairs below say why
            lines += [*(f"- {claim}: {judged[claim][0]}; {text}" for claim, text in _evidence(pairs).items()), ""]
            if judged[CLAIMS[3]][1]:
                lines += [f"- {CLAIMS[3]}: {judged[CLAIMS[3]][0]}; {judged[CLAIMS[3]][1]}", ""]
        lines += [
            "| variant | role | context | descent | baselines' descent | Δ at the smallest γ | Δ at each larger γ |",
            "|---|---|---|---|---|---|---|",
        ]
        for p in pairs:
            smallest = min(p.cells) if p.cells else None
            upper = "; ".join(f"γ={g:g}: {_shown(p.cells[g])}" for g in p.upper)
            base = ", ".join(f"{ref} {k}/{m}" for ref, (k, m) in p.baseline_descent.items())
            lines.append(
                f"| {p.label} | {p.role} | {p.context} | {p.descent[0]}/{p.descent[1]} | {base} | "
                f"{_shown(p.cells[smallest]) if smallest is not None else '–'} | {upper} |"
            )
        lines += [""]
        note = provenance_line(pairs)
        lines += [note, ""] if note else []
        figures = [f for f in figures if f not in shown]  # a figure of every domain (Figure 4) is shown once
        shown.update(figures)
        lines += [f"![{Path(f).stem}]({bench.results}/{f})" for f in figures] + ([""] if figures else [])
    return lines


def chance_count(results: list[dict], bench: Bench, spec: BenchSpec, family: dict) -> str:
    """The exploratory cells of a bench (every pair, gamma and evaluation set on the judged metric) that exclude 0, against chance."""
    from layerdescent.analysis.stats import paired_difference

    cells = []
    for where, (view, groups) in split_views(results).items():
        value = {(r["label"], r["seed"], float(g["gamma"])): g["metrics"].get(bench.metric) for r in view for g in r["gammas"]}
        for label, ref in comparisons(groups, spec.baselines):
            seeds = sorted(set(groups[label]["seeds"]) & set(groups[ref]["seeds"]))
            for gamma in sorted(set(groups[label]["gammas"]) & set(groups[ref]["gammas"])):
                if where == "test" and (label, gamma) in family:
                    continue
                pairs = [(value.get((label, s, gamma)), value.get((ref, s, gamma))) for s in seeds]
                if len(pairs) > 1 and all(a is not None and b is not None for a, b in pairs):
                    d = paired_difference([a for a, _ in pairs], [b for _, b in pairs])
                    if d["low"] is not None:
                        cells.append(d)
    distinct = sum(d["distinct"] for d in cells)
    return (
        f"Exploratory cells on {bench.metric} (every pair of the summary, γ and evaluation set): {distinct} of {len(cells)} exclude 0, "
        f"about {excluding_zero_by_chance(len(cells)):.1f} by chance alone."
    )


def judge_bench(root: Path, name: str, bench: Bench) -> tuple[BenchSpec, list, str] | None:
    """A bench's judging keys, its judged views (title, pairs, claims, figures) and its exploratory count; None if it has not run."""
    folder = root / bench.results
    if not any(folder.rglob("results.json")):
        return None
    results = collect(folder)
    spec = spec_for(root, bench)
    claim = primary_cells(results, spec)
    family = {(c["variant"], c["gamma"]): c for c in claim if c["split"] == "test" and c["test"] == "superiority"}
    margins = [c for c in claim if c["test"] in ("non-inferiority", "equivalence")]
    judged_views = []
    for (regime, domain), subset in views(results, bench).items():
        pairs = _pairs(subset, bench, spec, family if not domain else {})
        if pairs:
            judged_views.append(
                (view_title(regime, domain), pairs, _judge(pairs, margins if not domain else ()), figures_for(folder, regime, domain))
            )
    return spec, judged_views, chance_count(results, bench, spec, family)


def _first_row(name: str, where: str, spec: BenchSpec, pairs: list[Pair], judged: dict) -> str:
    """A row of the first table: the claims' verdicts with their primary numbers."""
    primary = any(p.role == "primary" for p in pairs)
    adopted = [p for p in pairs if p.role == "adopted"]
    kind = "primary (Holm)" if primary else "exploratory"
    cells = []
    for claim in CLAIMS:
        verdict, number = judged[claim]
        text = _cell_text(verdict, number)
        if adopted and claim in CLAIMS[1:3] and adopted[0].cells:
            p = adopted[0]
            gamma = max(p.upper) if claim == CLAIMS[1] and p.upper else min(p.cells)
            text += f"; tuned {p.label}: {_shown(p.cells[gamma])}"
        cells.append(text)
    title = f"{name} [{where}]" if where else name
    return f"| {title} | {kind} | " + " | ".join(cells) + " |"


def previous_verdicts(revision: str, out: Path) -> dict[tuple[str, str], str]:
    """(row, claim) -> verdict in the first table of ``out`` as committed at ``revision`` (git); empty where there is none."""
    try:  # the report as committed, named relative to the bench folder's checkout
        text = subprocess.run(["git", "show", f"{revision}:./{out.name}"], capture_output=True, text=True, cwd=ROOT, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return {}
    table = text.split("\n\n## ")[0]
    verdicts = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 1 + len(CLAIMS) or not line.startswith("| ") or cells[0] in ("task", "bench"):
            continue
        words = [c.split(":")[0].split(";")[0].strip() for c in cells[-len(CLAIMS) :]]
        verdicts.update({(cells[0], claim): word for claim, word in zip(CLAIMS, words)})
    return verdicts


def changed_note(revision: str, out: Path, rows: dict[tuple[str, str], tuple[str, str]]) -> list[str]:
    """The closing note: every verdict that differs from the report at ``revision``, and the rule that changed it."""
    before = previous_verdicts(revision, out)
    if not before:
        return []
    lines = [
        f"## Verdicts changed since {revision}",
        "",
        f"Against the report as committed at {revision} (`git show {revision}:benchmarks/REPORT.md`), each with the rule that moved it.",
        "",
    ]
    changes = []
    for (row, claim), (verdict, why) in rows.items():
        old = before.get((row, claim))
        if old is not None and old != verdict:
            changes.append(f"- {row}, {claim}: {old} → {verdict} ({why})")
    return lines + (changes or ["None."]) + [""]


def _why(pairs: list[Pair], claim: str) -> str:
    """Which of the new rules decides a claim's verdict in a view, in a few words."""
    if claim == CLAIMS[2]:
        return "parity is a non-inferiority test against a margin registered before the runs; none was, and not distinguishably worse is no evidence of parity"
    if any(p.role == "primary" for p in pairs):
        return "decided by the pre-registered family alone, Holm-adjusted, against the strongest baseline"
    if any(p.role == "pre-registered" for p in pairs):
        return "judged on the pre-registered setting alone (not every constrained variant), against the strongest baseline"
    gammas = (lambda p: p.upper) if claim == CLAIMS[1] else (lambda p: [min(p.cells)] if p.cells else [])
    names = sorted({p.cells[g]["baseline_solver"] for p in _judged(pairs) for g in gammas(p) if p.cells[g].get("baseline_solver")})
    stronger = [n for n in names if n != "erm"]
    if stronger:
        return f"judged against the strongest baseline, {' or '.join(stronger)} at some γ, not erm alone"
    return "judged on the bench's constrained variants against the strongest baseline"


def kept_plots(root: Path) -> set[Path]:
    """The plots the committed record keeps (.gitignore): those the README, REPORT.md or a docs page links."""
    pages = [root.parent / "README.md", root / "REPORT.md", *sorted((root.parent / "docs").glob("*.md"))]
    return {
        (page.parent / png).resolve() for page in pages if page.exists() for png in re.findall(r"\]\(([^)\s]+\.png)\)", page.read_text())
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/REPORT.md"))
    parser.add_argument("--root", type=Path, default=ROOT, help="the folder holding results/ and the bench files (default: benchmarks/)")
    parser.add_argument("--since", metavar="REV", help="list the verdicts that differ from --out as committed at this git revision")
    parser.add_argument("--summaries", action="store_true", help="regenerate every bench's summary.md and plots instead")
    args = parser.parse_args()
    if args.summaries:
        kept = kept_plots(args.root)
        for bench in [*BENCHES.values(), *SUMMARIZED.values()]:
            folder = args.root / bench.results
            if any(folder.rglob("results.json")):
                command = bench.command or " ".join(
                    filter(None, [f"layerdescent bench benchmarks/{bench.config} --out benchmarks/{bench.results}", bench.flags])
                )
                note = f"Runs made by `{command}`; this summary by `python benchmarks/reproduction.py --summaries` (the judging keys of benchmarks/{bench.config})."
                # the page shows the plots the record keeps; it names the others, drawn beside it
                shown = {path.name for path in kept if path.parent == folder.resolve()}
                summary = write_report(
                    folder,
                    title=f"Bench {Path(bench.results).name}",
                    note=note,
                    spec=spec_for(args.root, bench),
                    workers=bench.workers,
                    shown=shown,
                )
                print(f"wrote {summary}")
        return
    current, earlier, sections, rows = [], [], [], {}
    for name, bench in BENCHES.items():
        judged = judge_bench(args.root, name, bench)
        if judged is None:
            if bench.superseded_by:
                earlier.append(f"| {name} | {bench.superseded_by} | " + " | ".join(["not run"] * len(CLAIMS)) + " | – |")
            else:
                current.append(f"| {name} | not run | " + " | ".join(["not run"] * len(CLAIMS)) + " |")
            continue
        spec, judged_views, chance_line = judged
        for where, pairs, verdicts, _ in judged_views:
            title = f"{name} [{where}]" if where else name
            rows.update({(title, claim): (verdicts[claim][0], _why(pairs, claim)) for claim in CLAIMS})
            if bench.superseded_by:
                if not where:
                    earlier.append(
                        f"| {name} | {bench.superseded_by} | "
                        + " | ".join(verdicts[c][0] for c in CLAIMS)
                        + f" | [summary]({bench.results}/summary.md) |"
                    )
            elif "domain" not in where:
                current.append(_first_row(name, where, spec, pairs, verdicts))
        if not bench.superseded_by:
            sections += _section(name, bench, spec, judged_views, chance_line)
    command = f"python benchmarks/reproduction.py --out {args.out}" + (f" --since {args.since}" if args.since else "")
    lines = [
        "# Reproduction report",
        "",
        'What this project measured for each claim of "A Constrained Optimization Perspective of Unrolled Transformers"',
        f"(arXiv 2601.17257), from the committed runs only, current benches on the test split; made by `{command}`, whose",
        "docstring states the rules. Each cell: the verdict, and for one pair its difference from the strongest named baseline",
        '(> 0 favours the constrained variant; **bold** distinguishable, and "better" only where better than every named baseline). Primary rows are decided by the pre-registered family',
        "(Holm-adjusted, each interval at the level Holm tested its cell at); exploratory rows by uncorrected 95% t intervals. Parity is undecided "
        "wherever no margin was registered before the runs: not distinguishably worse is not parity. ‡: sides made by different code; §: the baseline got no tuning runs, the variant did.",
        "",
        "| task | family | " + " | ".join(CLAIMS) + " |",
        "|---|---|" + "---|" * len(CLAIMS),
        *current,
        "",
        *sections,
        "## Earlier benches",
        "",
        "Superseded by a bench that measures the same claim better; judged by the same rules on the test split, not detailed here (their summaries stay).",
        "",
        "| bench | superseded by | " + " | ".join(CLAIMS) + " | runs |",
        "|---|---|" + "---|" * len(CLAIMS) + "---|",
        *earlier,
        "",
        *(changed_note(args.since, args.out, rows) if args.since else []),
    ]
    args.out.write_text("\n".join(lines))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
