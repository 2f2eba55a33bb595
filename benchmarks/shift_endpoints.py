"""The pre-registered endpoints of the shift benches (lista_shift.toml, text_shift.toml), with Holm's step-down intervals.

    python benchmarks/shift_endpoints.py benchmarks/results/lista_shift --shifted 0.5 --out benchmarks/results/lista_shift/endpoints.md
    python benchmarks/shift_endpoints.py benchmarks/results/text_shift --shifted 3.2 --metric accuracy --higher-is-better \\
        --primary levels --domain-mean --out benchmarks/results/text_shift/endpoints.md

- Primary family: each primary variant minus the reference baseline (penalty-band) at the shifted
  gamma on test, and with ``--domain-mean`` the mean of the metric over the bench's domains at
  gamma 0; paired by seed, Holm-adjusted p over the family, and for the k-th smallest p the
  interval at level 1 - 0.05 / (m - k + 1) (Holm's step-down intervals).
- Descent under the shift: for every variant, the transitions at which the mean (over seeds)
  per-layer test loss rises at the shifted gamma.
- In-distribution cost: every constrained variant minus each baseline variant at gamma 0, Holm over that family.

Runs evaluated on another split (a bench's tuning runs) are left out; the statistics are
``layerdescent.analysis.stats``', as in every summary.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from scipy import stats as scipy_stats

from layerdescent.analysis.report import collect
from layerdescent.analysis.stats import holm, paired_difference


def _value(run: dict, gamma: float, metric: str, domain: str | None = None) -> float:
    records = run["gammas"] if domain is None else run["domains"][domain]
    record = next(r for r in records if r["gamma"] == gamma)
    return record["metrics"][metric]


def _family(rows: list[tuple[str, list[float], list[float]]]) -> list[dict]:
    """Paired differences of (name, a, b) rows with Holm-adjusted p and step-down intervals."""
    cells = [{"name": name, **paired_difference(a, b)} for name, a, b in rows]
    adjusted = holm([c["p"] for c in cells])
    order = sorted(range(len(cells)), key=lambda i: (cells[i]["p"] is None, cells[i]["p"] or 0))
    for rank, i in enumerate(order):
        cell, n = cells[i], cells[i]["n"]
        cell["p_holm"] = adjusted[i]
        if cell["p"] is None:
            cell["holm_low"] = cell["holm_high"] = None
            continue
        half = (
            (cell["high"] - cell["low"])
            / 2
            / scipy_stats.t.ppf(0.975, n - 1)
            * scipy_stats.t.ppf(1 - 0.05 / (len(cells) - rank) / 2, n - 1)
        )
        cell["holm_low"], cell["holm_high"] = cell["mean"] - half, cell["mean"] + half
    return cells


def _table(cells: list[dict]) -> list[str]:
    def number(x):
        return "—" if x is None else f"{x:+.5f}"

    lines = ["| difference | seeds | mean | 95% t interval | Holm interval | p | Holm p |", "|---|---|---|---|---|---|---|"]
    for c in cells:
        p = "—" if c["p"] is None else f"{c['p']:.4f}"
        ph = "—" if c["p_holm"] is None else f"{c['p_holm']:.4f}"
        lines.append(
            f"| {c['name']} | {c['n']} | {c['mean']:+.5f} | [{number(c['low'])}, {number(c['high'])}] | [{number(c['holm_low'])}, {number(c['holm_high'])}] | {p} | {ph} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path)
    parser.add_argument("--shifted", type=float, required=True, help="the shifted gamma of the primary endpoint")
    parser.add_argument("--metric", default="mse")
    parser.add_argument("--higher-is-better", action="store_true")
    parser.add_argument("--primary", nargs="*", help="the primary variants (default: every constrained variant)")
    parser.add_argument("--reference", default="penalty-band", help="the baseline variant the primary family is judged against")
    parser.add_argument("--baselines", nargs="*", default=["penalty-band", "erm-band"])
    parser.add_argument("--domain-mean", action="store_true", help="add the mean over the domains at gamma 0 to the primary family")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    runs: dict[str, dict[int, dict]] = {}
    for run in collect(args.root):
        if run.get("split", "test") == "test":
            runs.setdefault(run["label"], {})[run["seed"]] = run
    constrained = [label for label in runs if label not in args.baselines]
    primary = args.primary or constrained

    def pair(a: str, b: str, value) -> tuple[str, list[float], list[float]]:
        seeds = sorted(set(runs[a]) & set(runs[b]))
        return f"{a} − {b}", [value(runs[a][s]) for s in seeds], [value(runs[b][s]) for s in seeds]

    def domain_mean(run: dict) -> float:
        return float(np.mean([_value(run, 0.0, args.metric, d) for d in run["domains"]]))

    rows = [pair(v, args.reference, lambda r: _value(r, args.shifted, args.metric)) for v in primary]
    if args.domain_mean:
        rows += [(f"{name} (mean over domains, γ=0)", a, b) for name, a, b in (pair(v, args.reference, domain_mean) for v in primary)]
    better = "higher" if args.higher_is_better else "lower"
    command = f"python benchmarks/shift_endpoints.py {args.root} --shifted {args.shifted:g} --out {args.out}"
    command += (f" --metric {args.metric}" if args.metric != "mse" else "") + (" --higher-is-better" if args.higher_is_better else "")
    command += (f" --primary {' '.join(args.primary)}" if args.primary else "") + (" --domain-mean" if args.domain_mean else "")
    lines = [
        f"# Pre-registered endpoints: {args.root.name}",
        "",
        f"Made by `{command}`.",
        "",
        f"## Primary: {args.metric} ({better} is better) at γ={args.shifted:g} on test{' and the domains’ mean at γ=0' if args.domain_mean else ''}, against {args.reference}",
        "",
        "Paired by seed; Holm-adjusted p over the family, and Holm's step-down intervals (the k-th smallest p at level 1 − 0.05/(m − k + 1)).",
        "",
        *_table(_family(rows)),
        "",
        f"## Descent under the shift: transitions where the mean test loss rises at γ={args.shifted:g}",
        "",
        "| variant | seeds | rising transitions | per-layer test loss (mean over seeds) |",
        "|---|---|---|---|",
    ]
    for label in [*args.baselines, *constrained]:
        if label not in runs:
            continue
        loss = np.mean([next(r for r in run["gammas"] if r["gamma"] == args.shifted)["layer_loss"] for run in runs[label].values()], axis=0)
        rises = [f"l{k}" for k in range(1, len(loss)) if loss[k] > loss[k - 1]]
        lines.append(
            f"| {label} | {len(runs[label])} | {len(rises)}{': ' + ', '.join(rises) if rises else ''} | {' '.join(f'{x:.4g}' for x in loss)} |"
        )
    cost = [pair(v, b, lambda r: _value(r, 0.0, args.metric)) for v in constrained for b in args.baselines if b in runs]
    lines += [
        "",
        f"## In-distribution cost: {args.metric} at γ=0, each constrained variant against each baseline",
        "",
        *_table(_family(cost)),
        "",
    ]
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
