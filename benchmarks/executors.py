"""Wall time of one lista bench (erm and primal-dual, 2 seeds) on each executor, 2 runs at a time.

    python benchmarks/executors.py --out benchmarks/results/lista/executors.md [--rounds 2]

Each executor trains the same 4 runs from scratch into its own temporary directory, through the
`layerdescent bench` command a user types (interpreter start, Ray's local instance and every
worker's imports included); the executors take turns, interleaved over rounds, so a change in
the machine's load falls on all of them. The overhead per run is the difference from the local
pool's wall time in the same round, over the 4 runs, since each trains the identical runs (the
results.json files are compared, step times aside).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import tomli_w

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

HERE = Path(__file__).resolve().parent
EXECUTORS = {
    "local (process pool)": ["--workers", "2"],
    "ray (local instance)": ["--executor", "ray", "--workers", "2"],
    "slurm (submitit's local jobs)": ["--executor", "slurm", "--workers", "2"],
}


def bench_file(folder: Path) -> Path:
    """benchmarks/lista.toml cut to erm and primal-dual at seeds 0 and 1."""
    table = tomllib.loads((HERE / "lista.toml").read_text())
    table["bench"] = {
        "seeds": [0, 1],
        "variants": {"erm": table["bench"]["variants"]["erm"], "primal-dual": table["bench"]["variants"]["primal-dual"]},
        "executor": {"cluster": "local", "time": 60},  # slurm's: no scheduler here, submitit runs the jobs as local processes
    }
    table["train"]["progress"] = False
    path = folder / "lista2x2.toml"
    path.write_text(tomli_w.dumps(table))
    return path


def results(out: Path) -> dict[str, dict]:
    found = {}
    for path in sorted(out.glob("*/seed-*/results.json")):
        data = json.loads(path.read_text())
        data["train"].pop("step_time_median")
        data.pop("eval_seconds", None)  # wall times differ between identical runs
        found[str(path.relative_to(out))] = data
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    layerdescent = shutil.which("layerdescent")
    command = [layerdescent] if layerdescent else [sys.executable, "-m", "layerdescent.cli"]
    rows, outcomes = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        path = bench_file(Path(tmp))
        for round_ in range(args.rounds):
            base = None
            for name, flags in EXECUTORS.items():
                out = Path(tmp) / f"{name.split()[0]}-{round_}"
                load = os.getloadavg()[0]
                start = time.perf_counter()
                subprocess.run(
                    [*command, "bench", str(path), "--out", str(out), *flags],
                    check=True,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                wall = time.perf_counter() - start
                base = wall if base is None else base
                steps = [json.loads(p.read_text())["train"]["step_time_median"] for p in sorted(out.glob("*/seed-*/results.json"))]
                outcomes[(name, round_)] = results(out)
                rows.append((round_ + 1, name, " ".join(flags), wall, (wall - base) / 4, sum(steps) / len(steps), load))
                print(rows[-1], flush=True)
    first = next(iter(outcomes.values()))
    same = all(found == first for found in outcomes.values())
    lines = [
        "# Bench executors on lista: wall time of the same 4 runs",
        "",
        f"Made by `python benchmarks/executors.py --out benchmarks/results/lista/executors.md --rounds {args.rounds}`:",
        "`benchmarks/lista.toml` cut to erm and primal-dual at seeds 0 and 1 (30 epochs each), trained from scratch by",
        "`layerdescent bench FILE --out DIR` plus the flags below, 2 runs at a time on one torch thread each; the executors",
        f"take turns within each round. Machine: {os.cpu_count()} CPUs, shared with other work: the load average (1 min)",
        "before each bench and the runs' mean median step time show how busy it was.",
        "",
        "| round | executor | flags | wall time (s) | per run over local (s) | mean median step (ms) | load before |",
        "|---|---|---|---|---|---|---|",
    ]
    for round_, name, flags, wall, extra, step, load in rows:
        lines.append(f"| {round_} | {name} | `{flags}` | {wall:.1f} | {extra:+.1f} | {step * 1000:.2f} | {load:.1f} |")
    lines += ["", "Median over rounds:", "", "| executor | wall time (s) | per run over local (s) |", "|---|---|---|"]
    for name in EXECUTORS:
        walls = [r[3] for r in rows if r[1] == name]
        extras = [r[4] for r in rows if r[1] == name]
        lines.append(f"| {name} | {statistics.median(walls):.1f} | {statistics.median(extras):+.1f} |")
    lines += ["", f"Every executor wrote the same results.json files in every round (step times aside): {'yes' if same else 'NO'}.", ""]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
