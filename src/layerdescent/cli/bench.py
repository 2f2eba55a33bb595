"""`layerdescent bench`: train variants x seeds from one file on an executor, then summarize them."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from layerdescent.cli.run import overrides
from layerdescent.commands import Command


def default_out(config: str) -> Path:
    """Where a bench file's runs go without --out: runs/bench-NAME."""
    return Path("runs") / f"bench-{Path(config).stem}"


def run(args: argparse.Namespace) -> int:
    from layerdescent.bench.runner import executor_choice, run_bench
    from layerdescent.bench.status import STATES, bench_status, time_left
    from layerdescent.run.progress import clock

    out = Path(args.out) if args.out else default_out(args.config)
    if args.status:
        runs = bench_status(args.config, out, args.set, args.only)
        for run, state, details in runs:
            print(f"{run.variant} seed {run.seed}: {state}" + (f" ({details})" if details else ""))
        counts = [state for _, state, _ in runs]
        print(
            f"{len(runs)} run{'s' * (len(runs) != 1)} in {out}: "
            + ", ".join(f"{counts.count(state)} {state}" for state in STATES if state != "conflict" or state in counts)
        )
        left = time_left(runs)
        if left and left[0] >= 1:  # under a second (a tiny model) is no estimate worth a line
            seconds, at_once, read = left
            print(
                f"about {clock(seconds)} of training left at {at_once} run{'s' * (at_once != 1)} at a time "
                f"(from the step times of {read} finished run{'s' * (read != 1)}; evaluations not counted)"
            )
        return 0
    workers = args.workers
    executor = executor_choice(args.config, args.set, args.executor, workers=workers, wait=False if args.no_wait else None)
    if executor.name == "local" and workers is None:
        workers = 1
    flags = [
        *(["--workers", str(workers)] if workers not in (1, None) else []),
        *(["--executor", args.executor] if args.executor else []),
    ]
    command = " ".join(
        [
            "layerdescent bench",
            str(args.config),
            "--out",
            str(out),
            *(f"--set {o}" for o in args.set),
            *(f"--only '{o}'" for o in args.only),
            *flags,
        ]
    )
    summary = run_bench(
        args.config,
        out,
        args.set,
        on_run=tell,
        workers=workers or 1,
        command=command,
        executor=executor,
        only=args.only,
        skip_failed=args.skip_failed,
    )
    if summary is None:
        print(
            f"submitted; `{command}` again waits for the jobs and writes the summary (`layerdescent report {out}` summarizes what finished)"
        )
    else:
        print(f"summary: {summary}")
    return 0


def tell(run: Any, status: str) -> None:
    """A bench or demo run's status line, naming its variant and seed."""
    print(f"{run.variant} seed {run.seed}: {status}", flush=True)


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="TOML file")
    overrides(parser)
    parser.add_argument("--out", help="output directory")
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="PATTERN",
        help="train only the variants whose label matches, e.g. 'tune-*' (repeatable)",
    )
    parser.add_argument(
        "--status",
        action="store_true",
        help="print where each run stands (done, training, failed, stopped, pending) and train nothing",
    )
    parser.add_argument(
        "--skip-failed",
        action="store_true",
        help="leave the runs that failed before (failure.json) as they are instead of retrying them; they still count as failed",
    )
    parser.add_argument(
        "--workers",
        type=int,
        help="runs trained at once (local: processes of one torch thread each, default 1; ray, slurm: default as many as fit); bench.executor.workers",
    )
    parser.add_argument(
        "--executor",
        metavar="NAME",
        help="where runs train: local (a process pool, the default), ray (Ray tasks), slurm (SLURM jobs via submitit), or one a plugin registers "
        "(`layerdescent list`); default: [bench.executor] name. Its options: [bench.executor] or --set bench.executor.KEY=VALUE",
    )
    parser.add_argument("--no-wait", action="store_true", help="slurm: submit the jobs and return; the same command again collects them")


COMMAND = Command("bench", "train variants x seeds and summarize", run, arguments, resumable=True)
