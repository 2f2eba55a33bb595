"""`layerdescent evaluate`: test finished runs again, e.g. under another perturbation, without retraining them."""

from __future__ import annotations

import argparse
from pathlib import Path

from layerdescent.cli.run import overrides
from layerdescent.commands import Command
from layerdescent.errors import ConfigError


def run(args: argparse.Namespace) -> int:
    from layerdescent.bench.evaluation import evaluate_bench

    if Path(args.out).exists() and not Path(args.out).is_dir():
        raise ConfigError(f"--out {args.out} is a file, not a directory: name a directory for the new results")
    summary = evaluate_bench(
        args.runs, args.out, args.set, on_run=lambda target, status: print(f"{target}: {status}", flush=True), workers=args.workers
    )
    print(f"summary: {summary}")
    return 0


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", help="a run directory, or a directory of them (a bench)")
    parser.add_argument("--out", required=True, help="where the new results go, in the same layout")
    overrides(parser, "task.perturbation or eval.*, e.g. eval.gammas=[0,0.2]")
    parser.add_argument(
        "--workers", type=int, default=1, help="runs evaluated at once, each in its own process on one torch thread (default 1)"
    )


COMMAND = Command("evaluate", "test finished runs again, e.g. under another perturbation", run, arguments, resumable=True)
