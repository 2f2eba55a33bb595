"""`layerdescent bench`: train variants x seeds from one file on an executor, then summarize them."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from layerdescent.cli.run import overrides
from layerdescent.commands import Command
from layerdescent.errors import ConfigError
from layerdescent.registry import get_registry


def run(args: argparse.Namespace) -> int:
    from layerdescent.bench.runner import STATES, bench_status, executor_options, run_bench, time_left
    from layerdescent.run.progress import clock

    out = Path(args.out) if args.out else Path("runs") / f"bench-{Path(args.config).stem}"
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
    workers = 1 if args.workers is None and args.executor == "local" else args.workers
    given = {
        "workers": workers,
        "ray_address": args.ray_address,
        "cpus_per_run": args.cpus_per_run,
        "gpus_per_run": args.gpus_per_run,
        "partition": args.partition,
        "time": args.time,
        "mem_gb": args.mem_gb,
        **({"wait": False} if args.no_wait else {}),
    }
    remote = {
        "--ray-address": args.ray_address,
        "--cpus-per-run": args.cpus_per_run,
        "--gpus-per-run": args.gpus_per_run,
        "--partition": args.partition,
        "--time": args.time,
        "--mem-gb": args.mem_gb,
    }
    for flag, value in remote.items():
        # the per-run resources mean something to every executor but local, whose runs take one thread each
        wanted = (
            ["ray"]
            if flag == "--ray-address"
            else ["slurm"]
            if flag in ("--partition", "--time", "--mem-gb")
            else sorted(set(get_registry().executors) - {"local"})
        )
        if value is not None and args.executor not in wanted:
            raise ConfigError(f"{flag} needs --executor {' or '.join(wanted)}")
    executor = executor_options(args.config, args.set, args.executor, **given)
    flags = [
        *(["--workers", str(workers)] if workers not in (1, None) else []),
        *(["--executor", args.executor] if args.executor != "local" else []),
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
        on_run=status,
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


def status(run: Any, status: str) -> None:
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
        help="runs trained at once (local: processes of one torch thread each, default 1; ray, slurm: default as many as fit)",
    )
    parser.add_argument(
        "--executor",
        default="local",
        metavar="NAME",
        help="where runs train: local (a process pool, the default), ray (Ray tasks), slurm (SLURM jobs via submitit), or one a plugin registers (`layerdescent list`)",
    )
    parser.add_argument("--ray-address", help="join this Ray cluster (default: start a local Ray instance)")
    parser.add_argument("--cpus-per-run", type=int, help="CPUs (and torch threads) per run on ray or slurm (default 1)")
    parser.add_argument("--gpus-per-run", type=float, help="GPUs per run on ray or slurm (default 0)")
    parser.add_argument("--partition", help="SLURM partition (default: [bench.slurm] partition, else the cluster's)")
    parser.add_argument("--time", type=int, help="minutes a SLURM job may run (default: [bench.slurm] time, else 60)")
    parser.add_argument("--mem-gb", type=float, help="memory per SLURM job in GB")
    parser.add_argument("--no-wait", action="store_true", help="slurm: submit the jobs and return; the same command again collects them")


COMMAND = Command("bench", "train variants x seeds and summarize", run, arguments, resumable=True)
