"""The nine panels of a Figure 2 bench (video_paper, video_deep), answered: descent per layer, cost, the pre-registered families, multipliers.

    python benchmarks/figure2_panels.py benchmarks/results/video_deep --bench benchmarks/video_deep.toml --out benchmarks/results/video_deep/panels.md

A panel is one of the bench's ``[bench.primary]`` variants (``<video>-<arch>-primal-dual``; without
one, every primal-dual variant, with V1 at gamma 0.5 in RMSE), judged
against the strongest of its named baselines as ``layerdescent report`` judges a cell. Two families,
Holm within each, Bonferroni intervals: V1, the bench's ``[bench.primary]`` (test, at its gammas), and
V2, the metric's mean over the videos a model never saw (its ``eval.domains``) at the training noise.
Everything else is exploratory, with 95% t intervals, uncorrected:

- (a) the transitions at which the mean (over seeds) per-layer test loss rises, at each gamma asked,
  and the largest of those rises relative to the loss it rose from;
- (b) the in-distribution cost: the variant minus each baseline at gamma 0 and at the training noise;
- (c) the variant against the strongest baseline at every gamma above the training noise;
- (d) the multipliers (entries x seeds) that ended above 0.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from layerdescent.analysis.endpoints import Primary, judge_cells, read_spec, rising_transitions, split_views, versus_strongest
from layerdescent.analysis.groups import baseline_group, domain_mean_results, summarize
from layerdescent.analysis.report import collect
from layerdescent.analysis.tables import FAMILY_HEADER, family_rows, format_difference, markdown_table, paired

UNSEEN = "unseen videos (mean)"


def unseen_mean(results: list[dict]) -> list[dict]:
    """Each run with domains, its ``gammas`` replaced by the mean over its own domains of each metric and per-layer loss."""
    return [view for r in results if r.get("domains") for view in domain_mean_results([r], tuple(r["domains"]))]


def rises_cell(groups: dict, label: str | None, gamma: float) -> str:
    """One cell of (a): how many transitions rise, at which layers, and the largest rise in percent."""
    stats = groups.get(label, {}).get("gammas", {}).get(gamma) if label else None
    if stats is None:
        return "–"
    loss = stats["layer_loss"]["mean"]
    up = rising_transitions(loss)
    if not up:
        return f"0 of {len(loss) - 1}"
    # the largest rise, relative to the loss it rose from: a plateau's 1e-5 wobble is not a 5% climb
    largest = 100 * max((loss[k] - loss[k - 1]) / loss[k - 1] for k in up)
    percent = f"{largest:.2g}" if largest < 10 else f"{largest:.0f}"  # two digits, never 2.4e+02
    return f"{len(up)} of {len(loss) - 1} (l{', l'.join(map(str, up))}; at most +{percent}%)"


def markdown(root: Path, bench: Path, train_gamma: float, descent_gammas: list[float], command: str) -> str:
    spec = read_spec(bench)
    results = [r for r in collect(root) if r.get("split", "test") == "test"]
    registered = spec.claim() is not None
    # a bench without [bench.primary] (video_paper) is read the same way, each family named exploratory
    p = spec.claim() or Primary("rmse", False, (0.5,), tuple(dict.fromkeys(r["label"] for r in results if r["solver"] == "primal-dual")))
    kind = "pre-registered" if registered else f"not pre-registered in {bench.name}, exploratory"
    views = split_views(results)
    unseen = unseen_mean(results)
    groups = views["test"][1]
    sign = 1.0 if p.higher_is_better else -1.0
    v1 = judge_cells(results, spec, p.variants, p.metric, p.higher_is_better, p.gammas, ("test",), views)
    v2 = judge_cells(
        unseen, spec, p.variants, p.metric, p.higher_is_better, (train_gamma,), (UNSEEN,), {UNSEEN: (unseen, summarize(unseen))}
    )
    better = "higher" if p.higher_is_better else "lower"
    lines = [
        f"# {root.name}: the panels of Figure 2",
        "",
        f"    {command}",
        "",
        f"{p.metric} ({better} is better); Δ is signed so that > 0 favours the panel's variant. **Bold**: the interval excludes 0.",
        "",
        f"## V1 ({kind}): test {p.metric} at γ {', '.join(f'{g:g}' for g in p.gammas)}, against the strongest baseline",
        "",
        "Holm over the family's cells; Bonferroni intervals (simultaneous).",
        "",
        *markdown_table(FAMILY_HEADER, family_rows(v1)),
        f"## V2 ({kind}): mean {p.metric} over the videos each model never saw, at γ {train_gamma:g}, against the strongest baseline",
        "",
        *markdown_table(FAMILY_HEADER, family_rows(v2)),
        f"## (a) Descent: transitions where the mean per-layer test loss rises, at γ {', '.join(f'{g:g}' for g in descent_gammas)}",
        "",
    ]
    baselines = {v: {s: baseline_group(groups, v, s) for s in spec.baselines} if v in groups else {} for v in p.variants}
    header = ["panel", *(f"{who}, γ {g:g}" for g in descent_gammas for who in ("variant", *spec.baselines))]
    rows = [
        [v, *(rises_cell(groups, label, g) for g in descent_gammas for label in (v, *(baselines[v].get(s) for s in spec.baselines)))]
        for v in p.variants
    ]
    lines += markdown_table(header, rows)
    # signed, so that every difference > 0 favours the variant
    value = {
        (r["label"], r["seed"], float(g["gamma"])): sign * g["metrics"][p.metric]
        for r in results
        for g in r["gammas"]
        if p.metric in g["metrics"]
    }

    def versus(v: str, label: str | None, gamma: float) -> str:
        seeds = sorted(set(groups[v]["seeds"]) & set(groups[label]["seeds"])) if v in groups and label else []
        d = paired(value, v, label, seeds, gamma)
        return "–" if d is None else format_difference(d)

    cost_gammas = sorted({0.0, train_gamma})
    lines += [
        f"## (b) In-distribution cost: Δ against each baseline at γ {', '.join(f'{g:g}' for g in cost_gammas)} (95% t, exploratory)",
        "",
    ]
    header = ["panel", *(f"vs {s}, γ {g:g}" for g in cost_gammas for s in spec.baselines)]
    rows = [[v, *(versus(v, baselines[v].get(s), g) for g in cost_gammas for s in spec.baselines)] for v in p.variants]
    lines += markdown_table(header, rows)
    larger = sorted({float(g) for r in results for g in (x["gamma"] for x in r["gammas"]) if float(g) > train_gamma})
    lines += [f"## (c) Against the strongest baseline at each γ above {train_gamma:g} (95% t, exploratory)", ""]
    rows = []
    for v in p.variants:
        row = [v]
        for g in larger:
            cell = versus_strongest(*views["test"], spec, v, g, p.metric, sign) if v in groups else {}
            row.append(f"{format_difference(cell['difference'])} ({cell['baseline']})" if cell.get("difference") else "–")
        rows.append(row)
    lines += markdown_table(["panel", *(f"γ {g:g}" for g in larger)], rows)
    lines += ["## (d) Multipliers that ended above 0 (entries x seeds)", ""]
    rows = []
    for v in p.variants:
        lambdas = groups.get(v, {}).get("lambda", {})
        rows.append([v, ", ".join(f"{name}: {c['binding']} of {c['entries']}" for name, c in lambdas.items()) or "–"])
    lines += markdown_table(["panel", "binding"], rows)
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path)
    parser.add_argument("--bench", type=Path, required=True, help="the bench file: its [bench.primary] variants are the panels")
    parser.add_argument("--train-gamma", type=float, default=0.13, help="the training noise: V2's gamma, and the cost's")
    parser.add_argument("--descent-gammas", type=float, nargs="+", default=[0.13, 0.5], help="the gammas at which (a) reads descent")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    command = f"python benchmarks/figure2_panels.py {args.root} --bench {args.bench} --out {args.out}"
    if args.train_gamma != 0.13:
        command += f" --train-gamma {args.train_gamma:g}"
    if args.descent_gammas != [0.13, 0.5]:
        command += " --descent-gammas " + " ".join(f"{g:g}" for g in args.descent_gammas)
    text = markdown(args.root, args.bench, args.train_gamma, args.descent_gammas, command)
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
