"""How long a first contact takes: the CLI's start time per command, and the demo's wall time.

    python benchmarks/demo_time.py --out benchmarks/results/demo_time.md            # both
    python benchmarks/demo_time.py --cli-only --out /tmp/cli.md                      # start times only
    python benchmarks/demo_time.py --task lista --out /tmp/demo_lista.md             # the lista demo
    # a short proxy of the text demo: real MiniLM, 800 synthetic sentences (25 steps a run)
    python benchmarks/demo_time.py --compare-workers --set task.dataset=synthetic --set task.synthetic_size=1000

Each CLI command runs ``--repeat`` times in a fresh process (the console script, as a user types
it); the table gives the median wall time and peak memory. The demo runs once, into a fresh
folder, with its assets already fetched (fetching is excluded), first with the demo's own
settings or, with ``--compare-workers``, with ``--workers 2`` (the solvers at once, one thread
each) and then ``--workers 1`` (one after the other), so the two can be compared under the same load. Write down the load the numbers were taken under: they are only
comparable with numbers taken under the same load.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

COMMANDS = (["--help"], ["--version"], ["list"], ["plugins"], ["assets", "list"])


def _timed(argv: list[str], env: dict[str, str] | None = None, quiet: bool = True) -> tuple[float, float, int]:
    """Wall seconds, peak resident MB and exit status of one command in a fresh process."""
    sink = subprocess.DEVNULL if quiet else None
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=sink, stderr=sink, env=env)
    _, status, usage = os.wait4(proc.pid, 0)  # this child's own peak memory, not the largest child's so far
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    return wall, usage.ru_maxrss / 1024, proc.returncode


def cli_start(repeat: int) -> list[str]:
    """Markdown rows: the median wall time and peak memory of each quick command."""
    exe = shutil.which("layerdescent") or sys.executable
    prefix = [exe] if exe != sys.executable else [sys.executable, "-m", "layerdescent.cli"]
    rows = []
    for args in COMMANDS:
        runs = [_timed(prefix + args) for _ in range(repeat)]
        if any(rc for _, _, rc in runs):
            raise SystemExit(f"`layerdescent {' '.join(args)}` failed")
        walls = [w for w, _, _ in runs]
        rows.append(
            f"| `layerdescent {' '.join(args)}` | {statistics.median(walls):.2f} | {min(walls):.2f} | {max(walls):.2f} | {max(p for _, p, _ in runs):.0f} |"
        )
    # the floor: an interpreter that imports nothing
    walls = [_timed([sys.executable, "-c", "pass"])[0] for _ in range(repeat)]
    rows.append(f"| `python -c pass` (the floor) | {statistics.median(walls):.2f} | {min(walls):.2f} | {max(walls):.2f} | |")
    return ["| command | median s | min s | max s | peak MB |", "|---|---|---|---|---|", *rows]


def demo_time(task: str, workers: list[int], overrides: list[str]) -> list[str]:
    """Markdown rows: the demo's wall time from start to printed table, per --set demo.workers value."""
    rows = []
    for n in workers:
        out = Path(tempfile.mkdtemp(prefix=f"demo-{task}-"))
        argv = [
            sys.executable,
            "-m",
            "layerdescent.cli",
            "demo",
            "--task",
            task,
            "--out",
            str(out / "demo"),
            *(a for o in overrides for a in ("--set", o)),
        ]
        if n:
            argv += ["--workers", str(n)]
        wall, peak, rc = _timed(argv, quiet=False)
        if rc:
            raise SystemExit(f"the demo failed with exit status {rc}")
        what = f"{task} ({', '.join(overrides)})" if overrides else task
        rows.append(f"| {what} | {n or 'default'} | {wall / 60:.2f} | {peak:.0f} |")
        shutil.rmtree(out, ignore_errors=True)
    return ["| demo | workers | wall minutes | peak MB (largest process) |", "|---|---|---|---|", *rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="markdown file to write (default: print)")
    parser.add_argument("--task", default="text", help="which demo to time: text (default) or lista")
    parser.add_argument("--cli-only", action="store_true", help="time the quick commands only")
    parser.add_argument("--repeat", type=int, default=5, help="runs of each quick command")
    parser.add_argument("--compare-workers", action="store_true", help="also time the demo with --workers 1")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="passed to the demo, e.g. task.dataset=synthetic for a short proxy"
    )
    args = parser.parse_args()

    load = os.getloadavg()
    lines = [
        "# First contact: CLI start and demo wall time",
        "",
        f"Made by `python benchmarks/demo_time.py {' '.join(sys.argv[1:])}` on {os.cpu_count()} CPUs "
        f"({platform.processor() or platform.machine()}), load average {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} "
        "(1 / 5 / 15 min) when it started.",
        "",
        "## CLI start",
        "",
        *cli_start(args.repeat),
    ]
    if not args.cli_only:
        lines += ["", "## Demo", "", *demo_time(args.task, [2, 1] if args.compare_workers else [0], args.set)]
    load = os.getloadavg()
    lines += ["", f"Load average when it ended: {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}.", ""]
    text = "\n".join(lines)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
