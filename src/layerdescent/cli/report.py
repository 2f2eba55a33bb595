"""`layerdescent report`: summary.md and plots for run directories, or the cross-bench claim table of a list of benches."""

from __future__ import annotations

import argparse
from pathlib import Path

from layerdescent.commands import Command
from layerdescent.errors import ConfigError


def run(args: argparse.Namespace) -> int:
    from layerdescent.analysis.endpoints_file import read_spec
    from layerdescent.analysis.report import write_report
    from layerdescent.bench.plan import plan
    from layerdescent.run.config_file import read_toml

    if args.claims:
        from layerdescent.analysis.claims import write_claims

        if args.run_dir or args.bench or args.print:
            raise ConfigError("--claims reads each bench's runs and bench file from the list: drop RUN_DIR, --bench and --print")
        for path in write_claims(Path(args.claims), Path(args.out) if args.out else None, summaries=args.summaries):
            print(f"wrote {path}")
        return 0
    if args.summaries or not args.run_dir:
        raise ConfigError("name a run directory (layerdescent report RUN_DIR), or a list of benches (layerdescent report --claims LIST)")
    if args.bench and "variants" in (read_toml(args.bench).get("bench") or {}):
        plan(args.bench, args.run_dir, build_tasks=False)  # the bench file is checked as `bench` checks it, before anything is written
    summary = write_report(Path(args.run_dir), Path(args.out) if args.out else None, spec=read_spec(args.bench) if args.bench else None)
    print(summary.read_text() if args.print else f"summary: {summary}")
    return 0


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "run_dir", metavar="RUN_DIR", nargs="?", help="a run directory, or any directory above runs (a bench): every results.json under it"
    )
    parser.add_argument("--out", help="where to write (default: RUN_DIR; with --claims, REPORT.md beside the list)")
    parser.add_argument("--print", action="store_true", help="print summary.md")
    parser.add_argument(
        "--bench",
        metavar="FILE",
        help="the bench file the runs were made from: its [bench] baselines, primary endpoints and tuning budgets",
    )
    parser.add_argument(
        "--claims",
        metavar="LIST",
        help="a list of benches ([[bench]] title, file, runs): write the claim table, each claim decided by the endpoints its plan declares",
    )
    parser.add_argument("--summaries", action="store_true", help="with --claims: rewrite every listed bench's summary.md and plots first")


COMMAND = Command("report", "summary.md and plots for run directories, or the claim table of several benches", run, arguments)
