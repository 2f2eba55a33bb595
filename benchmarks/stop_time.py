"""How long a Ctrl-C takes to stop a bench under load: seconds from SIGINT to exit, and whether any traceback was printed.

    python benchmarks/stop_time.py --out benchmarks/results/stop_time.md --repeat 5

Starts ``layerdescent bench`` on a small lista bench (``--workers 2``, one torch thread each)
while ``--load`` busy processes (default: twice the CPU count) spin, waits until a run is
training, sends SIGINT to the bench's process group (what Ctrl-C in a terminal does) and times
its exit. The table gives each try and the median; a stop the promise covers is within 10 s.
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = """
[task]
name = "lista"
layers = 8
[train]
epochs = 200
batch_size = 64
threads = 1
[[constraints]]
kind = "descent"
[bench]
seeds = [0, 1, 2]
[bench.variants.erm]
solver.name = "erm"
[bench.variants.primal-dual]
solver.name = "primal-dual"
"""


def _spin() -> subprocess.Popen:
    """One process that keeps a core busy."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def one_stop(folder: Path, wait: float) -> tuple[float, int, bool]:
    """Seconds from SIGINT to the bench's exit, its exit status, and whether its stderr held a traceback."""
    (folder / "bench.toml").write_text(BENCH)
    err = folder / "stderr.txt"
    with err.open("w") as sink:
        proc = subprocess.Popen(
            ["layerdescent", "bench", str(folder / "bench.toml"), "--out", str(folder / "out"), "--workers", "2"],
            stdout=subprocess.DEVNULL,
            stderr=sink,
            start_new_session=True,  # its own process group, as a terminal's foreground job
        )
        deadline = time.monotonic() + 120
        while not list((folder / "out").glob("*/seed-*/metrics.jsonl")) and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
        time.sleep(wait)
        if proc.poll() is not None:
            raise SystemExit(f"the bench ended before the interrupt (status {proc.returncode}): {err.read_text().strip()[-500:]}")
        start = time.perf_counter()
        os.killpg(proc.pid, signal.SIGINT)
        status = proc.wait(timeout=300)
        seconds = time.perf_counter() - start
    return seconds, status, "Traceback" in err.read_text()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--load", type=int, default=2 * (os.cpu_count() or 1), help="busy processes beside the bench")
    parser.add_argument("--wait", type=float, default=3.0, help="seconds of training before the interrupt")
    args = parser.parse_args()
    spinners = [_spin() for _ in range(args.load)]
    rows = []
    try:
        for i in range(args.repeat):
            with tempfile.TemporaryDirectory() as folder:
                rows.append(one_stop(Path(folder), args.wait + i))  # each try interrupts at another moment of training
    finally:
        for s in spinners:
            s.kill()
    median = statistics.median(seconds for seconds, _, _ in rows)
    lines = [
        "# Stopping a bench with Ctrl-C under load",
        "",
        f"Made by `python benchmarks/stop_time.py --out {args.out} --repeat {args.repeat}` on {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPUs, with {args.load} busy processes beside the bench (`layerdescent bench --workers 2`, lista).",
        "",
        "| try | seconds from SIGINT to exit | exit status | traceback printed |",
        "|---|---|---|---|",
        *(f"| {i + 1} | {s:.2f} | {status} | {'yes' if tb else 'no'} |" for i, (s, status, tb) in enumerate(rows)),
        "",
        f"Median {median:.2f} s; the slowest {max(s for s, _, _ in rows):.2f} s (the promise: within 10 s).",
        "",
    ]
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
