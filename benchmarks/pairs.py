"""Paired differences between any two variants of a bench, at every gamma, on the test split and on each domain.

    python benchmarks/pairs.py benchmarks/results/llm primal-dual "primal-dual,lens_vocab=all" \
        --out benchmarks/results/llm/readouts.md

``layerdescent report`` pairs each variant with the erm run of its own context; variants whose task
settings differ (two readouts of one solver, say) share no context, and this pairs them directly:
A − B over the seeds both have, with the report's 95% t interval (**bold** excludes 0).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from layerdescent.errors import LayerdescentError
from layerdescent.report import collect, domain_results, paired_cell


def pair_tables(results: list[dict], a: str, b: str) -> list[str]:
    """Markdown: per metric, a row per evaluation set and a column per gamma, each cell A − B over paired seeds."""
    labels = list(dict.fromkeys(r["label"] for r in results))
    for label in (a, b):
        if label not in labels:
            raise LayerdescentError(f"no runs labelled {label!r}; the bench's labels are: {', '.join(labels)}")
    seeds = sorted({r["seed"] for r in results if r["label"] == a} & {r["seed"] for r in results if r["label"] == b})
    if not seeds:
        raise LayerdescentError(f"{a!r} and {b!r} share no seed, so nothing can be paired")
    sets = {"test": results, **domain_results(results)}
    value = {
        (r["label"], r["seed"], where, float(g["gamma"]), metric): v
        for where, subset in sets.items() for r in subset for g in r["gammas"] for metric, v in g["metrics"].items()
    }
    gammas = sorted({k[3] for k in value if k[0] in (a, b)})
    metrics = list(dict.fromkeys(k[4] for k in value if k[0] in (a, b)))
    lines = [f"{len(seeds)} paired seeds ({', '.join(map(str, seeds))}).", ""]
    for metric in metrics:
        lines += [f"## {metric}: {a} − {b}", "", "| evaluated on | " + " | ".join(f"γ={g:g}" for g in gammas) + " |", "|---|" + "---|" * len(gammas)]
        for where in sets:
            lines.append(f"| {where} | " + " | ".join(paired_cell(value, a, b, seeds, where, gamma, metric) for gamma in gammas) + " |")
        lines.append("")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bench", type=Path, help="a bench directory (every results.json under it)")
    parser.add_argument("a", help="the variant label compared")
    parser.add_argument("b", help="the variant label it is compared with")
    parser.add_argument("--out", type=Path, help="where to write the markdown (default: print it)")
    args = parser.parse_args(argv)
    try:
        tables = pair_tables(collect(args.bench), args.a, args.b)
    except LayerdescentError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    command = " ".join(shlex.quote(part) for part in ["python", "benchmarks/pairs.py", *map(str, [args.bench, args.a, args.b]), *(["--out", str(args.out)] if args.out else [])])
    text = "\n".join([f"# {args.a} − {args.b}", "", f"Made by `{command}`; 95% t intervals over paired seeds, **bold** excludes 0.", "", *tables])
    if args.out:
        args.out.write_text(text)
        print(f"wrote {args.out}")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
