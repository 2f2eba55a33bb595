"""`layerdescent plan`: a bench file's analysis plan checked and printed, or the bench file reference."""

from __future__ import annotations

import argparse

from layerdescent.commands import Command
from layerdescent.errors import ConfigError


def run(args: argparse.Namespace) -> int:
    from layerdescent.analysis.plan_summary import plan_text
    from layerdescent.analysis.report import collect
    from layerdescent.bench.plan import bench_spec, plan
    from layerdescent.bench.reference import plan_reference
    from layerdescent.cli.bench import default_out

    if args.reference:
        if args.file is not None:
            raise ConfigError("--reference prints the keys of every bench file; give it no FILE")
        print(plan_reference(), end="")
        return 0
    if args.file is None:
        raise ConfigError("name the bench file whose plan to print: layerdescent plan FILE (or --reference for every key)")
    runs = plan(args.file, args.out or default_out(args.file), args.set, build_tasks=False)
    seeds = {}
    for run in runs:
        if run.trial_of is None:
            seeds.setdefault(run.variant, set()).add(run.seed)
    pilot = collect(args.pilot) if args.pilot else None
    print(plan_text(bench_spec(args.file, args.set), {v: len(s) for v, s in seeds.items()}, pilot), end="")
    return 0


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", metavar="FILE", nargs="?", help="the bench file")
    parser.add_argument("--reference", action="store_true", help="print the bench file reference (markdown): every key and its meaning")
    parser.add_argument(
        "--pilot", metavar="DIR", help="runs of an earlier bench: the spread of each endpoint's pairs there gives the power of its seeds"
    )
    parser.add_argument("--out", help="the bench's folder, where its tuning decisions are (default: bench's, runs/bench-NAME)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key, as bench --set does")


COMMAND = Command("plan", "a bench file's analysis plan: families, tests, margins, budgets", run, arguments)
