"""Every primal-dual formulation x scheme on lista beside erm and penalty: the table of benchmarks/results/lista/solvers.md.

    python benchmarks/solvers.py --out benchmarks/results/lista_solvers           # bench, cost, table

Trains ``benchmarks/lista_solvers.toml`` (3 seeds; finished runs are kept), measures each
variant's step time against erm with ``benchmarks/cost.py``'s interleaved rounds (setup
``lista-solvers``), and writes per variant: the last layer's test loss at the smallest and the
largest gamma (mean ± sd over seeds), whether every layer lowered the test loss at gamma 0 in
every seed, the final multipliers (mean over seeds, smallest and largest entry), the last epoch's
last-layer validation loss, whether it beats the default's in every seed (the bench file's rule
for changing the default) and the step-time ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import cost  # noqa: E402  (benchmarks/cost.py, beside this file)

from layerdescent.analysis.plots import read_log, run_log  # noqa: E402

BENCH = HERE / "lista_solvers.toml"
DEFAULT = "lagrangian,simultaneous"  # primal-dual's default formulation and scheme


def _stat(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.4f}"
    return f"{statistics.mean(values):.4f} ± {statistics.stdev(values):.4f}"


def _last_val_loss(run_dir: Path) -> float:
    """The last-layer validation loss of the run's last epoch, from its log (plain or, as committed, gzipped)."""
    epochs = [r for r in read_log(run_log(run_dir)) if r.get("event") == "epoch"]
    return epochs[-1]["val_loss"][-1]


def table(out: Path, ratios: dict[str, float]) -> list[str]:
    """Markdown rows, one per variant of the bench, in its order."""
    import tomllib

    variants = list(tomllib.loads(BENCH.read_text())["bench"]["variants"])
    rows = [
        "| variant | last-layer test loss, gamma 0 | last-layer test loss, gamma 1 | every layer descends (gamma 0, all seeds) | final lambda, mean over seeds (min to max entry) | last-epoch validation loss | beats the default's, every seed | step time × erm |",
        "|---|---|---|---|---|---|---|---|",
    ]
    default_val = [_last_val_loss(p.parent) for p in sorted((out / DEFAULT).glob("seed-*/results.json"))]
    for variant in variants:
        runs = sorted((out / variant).glob("seed-*/results.json"))
        results = [json.loads(p.read_text()) for p in runs]
        first = [r["gammas"][0]["layer_loss"] for r in results]
        last = [r["gammas"][-1]["layer_loss"][-1] for r in results]
        descends = all(all(b < a for a, b in zip(losses, losses[1:])) for losses in first)
        lam = [statistics.mean(v) for v in zip(*(r["constraints"]["descent"]["lambda"] for r in results))]
        val = [_last_val_loss(p.parent) for p in runs]
        beats = "-" if variant == DEFAULT else "yes" if all(v < d for v, d in zip(val, default_val)) else "no"
        ratio = ratios.get(variant.replace(",", ", "), float("nan"))
        rows.append(
            f"| {variant} | {_stat([f[-1] for f in first])} | {_stat(last)} | {'yes' if descends else 'no'} | "
            f"{min(lam):.3g} to {max(lam):.3g} | {_stat(val)} | {beats} | {ratio:.2f} |"
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--table", type=Path, default=HERE / "results" / "lista" / "solvers.md")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args()
    from layerdescent.bench.runner import run_bench

    run_bench(BENCH, args.out, workers=args.workers)
    setup = cost.SETUPS["lista-solvers"]
    ((label, chosen),) = setup.items()
    measured = cost.measure(chosen, args.rounds, 3)
    ratios = {name: values[1] for name, values in measured.items()}
    lines = [
        "# Every primal-dual formulation and scheme on lista",
        "",
        f"Made by `python benchmarks/solvers.py --out {args.out}` on 2 CPUs: `{BENCH.relative_to(HERE.parent)}`, 3 seeds each;",
        f"step times from `benchmarks/cost.py` setup `lista-solvers` ({label}), {args.rounds} interleaved rounds of 3 steps, median per-round ratio to erm.",
        "",
        *table(args.out, ratios),
        "",
    ]
    args.table.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
