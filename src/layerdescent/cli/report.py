"""`layerdescent report`: summary.md and plots for run directories."""

from __future__ import annotations

import argparse
from pathlib import Path

from layerdescent.commands import Command


def run(args: argparse.Namespace) -> int:
    from layerdescent.analysis.endpoints import read_spec
    from layerdescent.analysis.report import write_report
    from layerdescent.bench.plan import plan
    from layerdescent.run.config_file import read_toml

    if args.bench and "variants" in (read_toml(args.bench).get("bench") or {}):
        plan(args.bench, args.run_dir, build_tasks=False)  # the bench file is checked as `bench` checks it, before anything is written
    summary = write_report(Path(args.run_dir), Path(args.out) if args.out else None, spec=read_spec(args.bench) if args.bench else None)
    print(summary.read_text() if args.print else f"summary: {summary}")
    return 0


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "run_dir", metavar="RUN_DIR", help="a run directory, or any directory above runs (a bench): every results.json under it"
    )
    parser.add_argument("--out", help="where to write (default: RUN_DIR)")
    parser.add_argument("--print", action="store_true", help="print summary.md")
    parser.add_argument(
        "--bench",
        metavar="FILE",
        help="the bench file the runs were made from: its [bench] baselines, primary endpoints and tuning budgets",
    )


COMMAND = Command("report", "summary.md and plots for run directories", run, arguments)
