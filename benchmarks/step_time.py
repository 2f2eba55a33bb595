"""Step time of each solver against erm, with one and two torch threads, on lista.

    python benchmarks/step_time.py --out benchmarks/results/lista/step_time.md

All solvers live in one process, each with its own model, and take turns: a round gives every
solver a few steps on the same batches, in an order rotated every round, so machine noise and
warm-up hit them alike. Each step is the trainer's own ``Trainer.step``. The table gives the
median step time and, as the ratio, the median over rounds of (solver / erm) within a round.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

import layerdescent as ld
from layerdescent.trainer import Trainer

SIZES = {"small (8 layers, 64x32, 50k params)": {}, "wide (8 layers, 512x256, 3.1M params)": {"code_dim": 512, "measure_dim": 256, "sparsity": 16}}
VARIANTS = {
    "erm": {"name": "erm"},
    "penalty": {"name": "penalty"},
    "primal-dual (simultaneous)": {"name": "primal-dual"},
    "primal-dual (alternating)": {"name": "primal-dual", "scheme": "alternating"},
}


def trainer(task: dict, solver: dict, threads: int, out: Path) -> Trainer:
    """A lista trainer for ``solver``."""
    table = {
        "task": {"name": "lista", "train_size": 1024, "validation_size": 64, "test_size": 64, **task},
        "train": {"batch_size": 64, "lr": 0.003, "threads": threads},
        "solver": solver,
        "constraints": [{"kind": "descent", "alpha": 0.05}],
    }
    return Trainer(ld.config_from_dict(table), out)


def measure(task: dict, threads: int, rounds: int, steps: int) -> dict[str, tuple[float, float]]:
    """Per variant: (median step seconds, median over rounds of the ratio to erm)."""
    with tempfile.TemporaryDirectory() as tmp:
        runs = {name: trainer(task, solver, threads, Path(tmp) / str(i)) for i, (name, solver) in enumerate(VARIANTS.items())}
        sessions = {name: run.setup() for name, run in runs.items()}
        order = torch.randperm(1024, generator=torch.Generator().manual_seed(0)).split(64)
        per_round = {name: [] for name in VARIANTS}
        names = list(VARIANTS)
        for r in range(rounds + 1):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                times = []
                for i in range(steps):
                    start = time.perf_counter()
                    runs[name].step(sessions[name], [order[(r * steps + i) % len(order)]], r * steps + i)
                    times.append(time.perf_counter() - start)
                if r:  # round 0 warms up
                    per_round[name].append(statistics.median(times))
    return {
        name: (statistics.median(per_round[name]), statistics.median(t / e for t, e in zip(per_round[name], per_round["erm"])))
        for name in VARIANTS
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--steps", type=int, default=5, help="steps per solver per round")
    args = parser.parse_args()
    lines = [
        "# Step time on lista",
        "",
        f"Made by `python benchmarks/step_time.py --out {args.out}` on 2 CPUs: {args.rounds} rounds of {args.steps} steps per solver,",
        "interleaved in one process; median step time and median per-round ratio to erm.",
        "",
        "| model | threads | solver | median step (ms) | × erm |",
        "|---|---|---|---|---|",
    ]
    for size, task in SIZES.items():
        for threads in (1, 2):
            for name, (seconds, ratio) in measure(task, threads, args.rounds, args.steps).items():
                lines.append(f"| {size} | {threads} | {name} | {seconds * 1e3:.3f} | {ratio:.3f} |")
                print(lines[-1], flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
