"""The paper's claims checked against every committed bench: writes the reproduction report.

    python benchmarks/reproduction.py --out benchmarks/REPORT.md

Reads the run directories under ``benchmarks/results/`` (nothing is trained or evaluated here) and,
for every primal-dual variant paired with the erm variant of its own context, measures the four
claims of "A Constrained Optimization Perspective of Unrolled Transformers" by fixed rules:

- monotone layerwise descent: the mean test loss falls at every layer, in distribution;
- graceful degradation: at the larger gammas (the upper half of the nonzero grid) the paired
  difference from erm over seeds is distinguishably better somewhere and never distinguishably worse;
- in-distribution parity: at gamma 0 the paired difference is not distinguishably worse;
- deeper constrained models gain more: where a bench pairs three or more depths, the gain at the
  largest gamma grows with depth and is distinguishable at the deepest.

A claim holds for a task when it holds for every pair, partly when for some, and does not when for
none. A bench that has not been run is listed as such. A bench over training regimes (its labels
carry ``train_gamma=X``) is judged once per regime, and a bench with evaluation domains once more
on each domain (its records on that domain in place of the test split's), by the same rules.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import NamedTuple

import re

from layerdescent.report import collect, comparisons, context_titles, domain_results, format_difference, paired_difference, summarize

ROOT = Path(__file__).resolve().parent


class Bench(NamedTuple):
    """A committed bench: where its runs are, the file that made them, and the metric judged."""

    results: str
    config: str
    metric: str
    higher_is_better: bool
    regime: str = ""  # a regex whose group in a label names its training regime; "" for none
    command: str = ""  # what made the runs, where it is not `layerdescent bench CONFIG` (a re-evaluation)


BENCHES = {
    "lista (unrolled ISTA, synthetic sparse codes)": Bench("results/lista", "lista.toml", "mse", False),
    "text classification (MiniLM, movie reviews, Gaussian embedding noise)": Bench("results/text", "text.toml", "accuracy", True),
    "video denoising (3 videos x 3 architectures, Gaussian noise)": Bench("results/video", "video.toml", "rmse", False),
    "video denoising by depth (DUST on vtest, trained clean)": Bench("results/video_depth", "video_depth.toml", "rmse", False),
    "LLM finetuning (SmolLM2-135M, LoRA, 64 steps, whole-vocabulary lens, Gaussian embedding noise)": Bench("results/llm_vocab64", "llm_vocab64.toml", "accuracy", True),
    "text classification in the paper's regimes (MiniLM, best validation epoch)": Bench("results/text_paper", "text_paper.toml", "accuracy", True, r"train_gamma=([0-9.]+)"),
    "text classification with a deep encoder (SmolLM2-135M, 30 layers, LoRA)": Bench("results/text_deep", "text_deep.toml", "accuracy", True),
    "video denoising, constraints that bind (vtest, alpha x reference)": Bench("results/video_bind", "video_bind.toml", "rmse", False),
    "video denoising at the chosen setting (3 videos x 3 architectures)": Bench("results/video_paper", "video_paper.toml", "rmse", False),
    "video denoising at the chosen setting, salt-and-pepper noise (the same models)": Bench(
        "results/video_paper_saltpepper", "video_paper.toml", "rmse", False,
        command="layerdescent evaluate benchmarks/results/video_paper --out benchmarks/results/video_paper_saltpepper "
        "--set task.perturbation=salt-pepper --set 'eval.gammas=[0.0, 0.02, 0.05, 0.1, 0.2]'",
    ),
    "LLM finetuning (SmolLM2-135M, LoRA, 512 steps, label lens)": Bench("results/llm", "llm.toml", "accuracy", True),
}
CLAIMS = ("monotone layerwise descent", "graceful degradation", "in-distribution parity", "deeper constrained models gain more")


class Pair(NamedTuple):
    """One primal-dual variant against the erm variant of its context, on the judged metric."""

    label: str
    context: str
    depth: int | None
    descent: tuple[int, int]  # transitions where the mean test loss falls, of all, primal-dual
    erm_descent: tuple[int, int]
    differences: dict[float, dict]  # gamma -> paired difference, signed so that > 0 is better
    upper: list[float]  # the larger gammas


def _falls(layer_loss: list[float]) -> tuple[int, int]:
    return sum(b < a for a, b in zip(layer_loss, layer_loss[1:])), len(layer_loss) - 1


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
    domain views, the others with the test split's.
    """
    wanted = {"train_gamma": regime, "domain": domain}

    def fits(name: str) -> bool:
        parts = dict(re.findall(r"(train_gamma|domain)=([^_]+)", Path(name).stem))
        on_domains = "domain" in parts or name.startswith("figure4")
        return on_domains == bool(domain) and all(wanted[key] == value for key, value in parts.items())

    paper = sorted(f.name for f in folder.glob("figure[0-9]*.png") if fits(f.name))
    if domain:
        rest = () if paper else ("metric_vs_gamma_domains.png",)
    else:
        rest = ("loss_vs_layer.png",) if paper else ("metric_vs_gamma.png", "loss_vs_layer.png", "ablation_depth.png")
    return paper + [f for f in rest if (folder / f).exists()]


def _pairs(results: list[dict], bench: Bench) -> list[Pair]:
    groups = summarize(results)
    titles = context_titles(groups)
    value = {(r["label"], r["seed"], float(g["gamma"])): g["metrics"][bench.metric] for r in results for g in r["gammas"]}
    sign = 1.0 if bench.higher_is_better else -1.0
    pairs = []
    for label, ref in comparisons(groups):
        pd, erm = groups[label], groups[ref]
        if pd["solver"] != "primal-dual" or erm["solver"] != "erm":
            continue
        seeds = sorted(set(pd["seeds"]) & set(erm["seeds"]))
        gammas = sorted(set(pd["gammas"]) & set(erm["gammas"]))
        differences = {}
        for gamma in gammas:
            d = paired_difference([sign * value[label, s, gamma] for s in seeds], [sign * value[ref, s, gamma] for s in seeds])
            differences[gamma] = d
        nonzero = [g for g in gammas if g > 0]
        upper = [g for g in nonzero if g >= statistics.median(nonzero)] if nonzero else []
        first = gammas[0]
        pairs.append(
            Pair(
                label,
                titles[pd["context_key"]] or "–",
                pd["config"].get("task.layers"),
                _falls(pd["gammas"][first]["layer_loss"]["mean"]),
                _falls(erm["gammas"][first]["layer_loss"]["mean"]),
                differences,
                upper,
            )
        )
    return pairs


def _better(d: dict) -> bool:
    return d["distinct"] and d["mean"] > 0


def _worse(d: dict) -> bool:
    return d["distinct"] and d["mean"] < 0


def _verdict(passed: list[bool]) -> str:
    if not passed:
        return "not measured"
    return "holds" if all(passed) else "partly holds" if any(passed) else "does not hold"


def _judge(pairs: list[Pair]) -> dict[str, tuple[str, str]]:
    """Claim -> (verdict, the evidence in one line)."""
    descends = [p.descent[0] == p.descent[1] for p in pairs]
    erm_descends = sum(p.erm_descent[0] == p.erm_descent[1] for p in pairs)
    graceful = [any(_better(p.differences[g]) for g in p.upper) and not any(_worse(p.differences[g]) for g in p.upper) for p in pairs]
    some_better = sum(any(_better(p.differences[g]) for g in p.upper) for p in pairs)
    some_worse = sum(any(_worse(p.differences[g]) for g in p.upper) for p in pairs)
    parity = [not _worse(p.differences[min(p.differences)]) for p in pairs]
    n = len(pairs)
    judged = {
        CLAIMS[0]: (_verdict(descends), f"primal-dual's mean test loss falls at every layer in {sum(descends)} of {n} pairs (erm's in {erm_descends})"),
        CLAIMS[1]: (_verdict(graceful), f"at the larger gammas, distinguishably better than erm somewhere in {some_better} of {n} pairs, distinguishably worse somewhere in {some_worse}"),
        CLAIMS[2]: (_verdict(parity), f"not distinguishably worse than erm at γ=0 in {sum(parity)} of {n} pairs"),
    }
    by_depth = sorted((p for p in pairs if p.depth is not None), key=lambda p: p.depth)
    if len({p.depth for p in by_depth}) >= 3:
        gains = [p.differences[max(p.differences)] for p in by_depth]
        rising = all(b["mean"] > a["mean"] for a, b in zip(gains, gains[1:]))
        deepest = _better(gains[-1])
        verdict = "holds" if rising and deepest else "partly holds" if rising or deepest else "does not hold"
        evidence = ", ".join(f"depth {p.depth}: {g['mean']:+.3g}" for p, g in zip(by_depth, gains))
        judged[CLAIMS[3]] = (verdict, f"gain over erm at the largest γ by depth (> 0 better): {evidence}")
    else:
        judged[CLAIMS[3]] = ("not measured", "this bench does not vary depth")
    return judged


def _section(name: str, bench: Bench, pairs: list[Pair], judged: dict[str, tuple[str, str]], figures: list[str]) -> list[str]:
    command = bench.command or f"layerdescent bench benchmarks/{bench.config} --out benchmarks/{bench.results}"
    direction = "higher" if bench.higher_is_better else "lower"
    lines = [
        f"## {name}",
        "",
        f"Runs: `{command}` ([summary]({bench.results}/summary.md)). Judged on {bench.metric} ({direction} is better); "
        f"differences are primal-dual − erm over paired seeds, signed so that > 0 favours primal-dual, with 95% t intervals; **bold** excludes 0.",
        "",
        "| claim | verdict | evidence |",
        "|---|---|---|",
        *(f"| {claim} | {verdict} | {evidence} |" for claim, (verdict, evidence) in judged.items()),
        "",
        "| primal-dual variant | context | descent: primal-dual | descent: erm | Δ at γ=0 | Δ at each larger γ |",
        "|---|---|---|---|---|---|",
    ]
    for p in pairs:
        upper = "; ".join(f"γ={g:g}: {format_difference(p.differences[g])}" for g in p.upper)
        lines.append(
            f"| {p.label} | {p.context} | {p.descent[0]}/{p.descent[1]} | {p.erm_descent[0]}/{p.erm_descent[1]} | "
            f"{format_difference(p.differences[min(p.differences)])} | {upper} |"
        )
    return lines + [""] + [f"![{Path(f).stem}]({bench.results}/{f})" for f in figures] + [""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/REPORT.md"))
    parser.add_argument("--root", type=Path, default=ROOT, help="the folder holding results/ (default: benchmarks/)")
    args = parser.parse_args()
    summary_rows, sections = [], []
    for name, bench in BENCHES.items():
        root = args.root / bench.results
        judged_any = False
        for (regime, domain), results in (views(collect(root), bench) if any(root.rglob("results.json")) else {}).items():
            pairs = _pairs(results, bench)
            if not pairs:
                continue
            where = view_title(regime, domain)
            judged_any, title = True, f"{name} [{where}]" if where else name
            judged = _judge(pairs)
            summary_rows.append(f"| {title} | " + " | ".join(judged[c][0] for c in CLAIMS) + " |")
            sections += _section(title, bench, pairs, judged, figures_for(root, regime, domain))
        if not judged_any:
            summary_rows.append(f"| {name} | " + " | ".join(["not run"] * len(CLAIMS)) + " |")
    lines = [
        "# Reproduction report",
        "",
        "What this project measured for each claim of \"A Constrained Optimization Perspective of Unrolled Transformers\"",
        f"(arXiv 2601.17257), from the committed runs only. Made by `python benchmarks/reproduction.py --out {args.out}`;",
        "the rules behind each verdict are in that script's docstring. The runs themselves are made by the",
        "`layerdescent bench` command named in each section.",
        "",
        "| task | " + " | ".join(CLAIMS) + " |",
        "|---|" + "---|" * len(CLAIMS),
        *summary_rows,
        "",
        *sections,
    ]
    args.out.write_text("\n".join(lines))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
