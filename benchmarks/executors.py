"""Wall time of one lista bench (erm and primal-dual, 2 seeds) on each executor, 2 runs at a time.

    python benchmarks/executors.py --out benchmarks/results/lista/executors.md

Each executor trains the same 4 runs from scratch into its own temporary directory, through the
`layerdescent bench` command a user types (interpreter start, Ray's local instance and every
worker's imports included); the executors take turns in one process, one after the other. The
overhead per run is the difference from the local pool's wall time, over the 4 runs, since each
trains the identical runs (the results.json files are compared, step times aside).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
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
        "slurm": {"cluster": "local", "time": 60},  # no scheduler here: submitit runs the jobs as local processes
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
        found[str(path.relative_to(out))] = data
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    layerdescent = shutil.which("layerdescent")
    command = [layerdescent] if layerdescent else [sys.executable, "-m", "layerdescent.cli"]
    rows, outcomes = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        path = bench_file(Path(tmp))
        for name, flags in EXECUTORS.items():
            out = Path(tmp) / name.split()[0]
            load = os.getloadavg()[0]
            start = time.perf_counter()
            subprocess.run([*command, "bench", str(path), "--out", str(out), *flags], check=True, stdout=subprocess.DEVNULL)
            wall = time.perf_counter() - start
            steps = [json.loads(p.read_text())["train"]["step_time_median"] for p in sorted(out.glob("*/seed-*/results.json"))]
            outcomes[name] = results(out)
            rows.append((name, " ".join(flags), wall, sum(steps) / len(steps), load))
    base = rows[0][2]
    same = all(found == outcomes[rows[0][0]] for found in outcomes.values())
    lines = [
        "# Bench executors on lista: wall time of the same 4 runs",
        "",
        "Made by `python benchmarks/executors.py --out benchmarks/results/lista/executors.md`: `benchmarks/lista.toml`",
        "cut to erm and primal-dual at seeds 0 and 1 (30 epochs each), trained from scratch by `layerdescent bench FILE",
        "--out DIR` plus the flags below, 2 runs at a time on one torch thread each, one executor after the other.",
        f"Machine: {os.cpu_count()} CPUs; the load average (1 min) before each bench is given, since other work ran beside it.",
        "",
        "| executor | flags | wall time (s) | per run over local (s) | median step (ms) | load before |",
        "|---|---|---|---|---|---|",
    ]
    for name, flags, wall, step, load in rows:
        lines.append(f"| {name} | `{flags}` | {wall:.1f} | {(wall - base) / 4:+.1f} | {step * 1000:.2f} | {load:.1f} |")
    lines += ["", f"Every executor wrote the same results.json files (step times aside): {'yes' if same else 'NO'}.", ""]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
