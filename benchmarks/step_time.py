"""Step time of each solver against erm, and of 2 torch threads against 1, on lista.

    python benchmarks/step_time.py --out benchmarks/results/lista/step_time.md

Every measurement is the median step time of a short run; runs are interleaved (erm, penalty,
primal-dual, erm, ...) so that machine noise hits all solvers alike, and each ratio is the median
over repeats of the ratio within one repeat.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import layerdescent as ld

SIZES = {"small (8 layers, 64x32)": {}, "wide (8 layers, 512x256)": {"code_dim": 512, "measure_dim": 256, "sparsity": 16}}


def step_time(task: dict, solver: dict, threads: int, scheme: str = "simultaneous") -> float:
    """Median step time (s) of a 2-epoch lista run."""
    table = {
        "task": {"name": "lista", "train_size": 2048, "validation_size": 64, "test_size": 64, **task},
        "train": {"epochs": 2, "batch_size": 64, "lr": 0.003, "threads": threads, "progress": False, "validate": False, "log_every": 1000},
        "solver": {**solver, **({"scheme": scheme} if solver["name"] == "primal-dual" else {})},
        "constraints": [{"kind": "descent", "alpha": 0.05}],
    }
    with tempfile.TemporaryDirectory() as tmp:
        return ld.train(ld.config_from_dict(table), Path(tmp) / "run")["train"]["step_time_median"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    variants = {
        "erm": ({"name": "erm"}, "simultaneous"),
        "penalty": ({"name": "penalty"}, "simultaneous"),
        "primal-dual (simultaneous)": ({"name": "primal-dual"}, "simultaneous"),
        "primal-dual (alternating)": ({"name": "primal-dual"}, "alternating"),
    }
    lines = [
        "# Step time on lista",
        "",
        f"Made by `python benchmarks/step_time.py --out {args.out}`; medians over {args.repeats} interleaved repeats, 2 CPUs.",
        "",
        "| model | threads | solver | median step (ms) | × erm |",
        "|---|---|---|---|---|",
    ]
    for size, task in SIZES.items():
        for threads in (1, 2):
            times = {name: [] for name in variants}
            for _ in range(args.repeats):
                for name, (solver, scheme) in variants.items():
                    times[name].append(step_time(task, solver, threads, scheme))
            for name in variants:
                ratio = statistics.median(t / e for t, e in zip(times[name], times["erm"]))
                lines.append(f"| {size} | {threads} | {name} | {statistics.median(times[name]) * 1e3:.3f} | {ratio:.3f} |")
                print(lines[-1], flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
