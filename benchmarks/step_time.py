"""Step time of each solver against erm, with one and two torch threads, on lista.

    python benchmarks/step_time.py --out benchmarks/results/lista/step_time.md

All solvers live in one process, each with its own model, and take turns: a round gives every
solver, with one and with two threads, a few steps on the same batches, in an order rotated every
round, so machine noise and warm-up hit them alike. Each step is the trainer's own ``Trainer.step``. The table gives the
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

SIZES = {"small (8 layers, 64x32, 50k params)": {}, "wide (8 layers, 512x256, 3.1M params)": {"code_dim": 512, "measure_dim": 256, "sparsity": 16, "weights": "ista", "lr": 3e-4}}
THREADS = (1, 2)
VARIANTS = {
    "erm": {"name": "erm"},
    "penalty": {"name": "penalty"},
    "primal-dual (simultaneous)": {"name": "primal-dual"},
    "primal-dual (alternating)": {"name": "primal-dual", "scheme": "alternating"},
}


def trainer(task: dict, solver: dict, threads: int, out: Path) -> Trainer:
    """A lista trainer for ``solver``."""
    task = dict(task)
    lr = task.pop("lr", 0.003)  # the wide model diverges at the small one's rate
    table = {
        "task": {"name": "lista", "train_size": 1024, "validation_size": 64, "test_size": 64, **task},
        "train": {"batch_size": 64, "lr": lr, "threads": threads},
        "solver": solver,
        "constraints": [{"kind": "descent", "alpha": 0.05}],
    }
    return Trainer(ld.config_from_dict(table), out)


def measure(task: dict, rounds: int, steps: int) -> dict[tuple[str, int], tuple[float, float]]:
    """Per (variant, threads): (median step seconds, median over rounds of the ratio to erm at those threads)."""
    with tempfile.TemporaryDirectory() as tmp:
        runs = {name: trainer(task, solver, 1, Path(tmp) / str(i)) for i, (name, solver) in enumerate(VARIANTS.items())}
        sessions = {name: run.setup() for name, run in runs.items()}
        order = torch.randperm(1024, generator=torch.Generator().manual_seed(0)).split(64)
        turns = [(name, threads) for threads in THREADS for name in VARIANTS]
        per_round: dict[tuple[str, int], list[float]] = {turn: [] for turn in turns}
        for r in range(rounds + 1):
            for name, threads in turns[r % len(turns) :] + turns[: r % len(turns)]:
                torch.set_num_threads(threads)
                times = []
                for i in range(steps):
                    start = time.perf_counter()
                    runs[name].step(sessions[name], [order[(r * steps + i) % len(order)]], r * steps + i)
                    times.append(time.perf_counter() - start)
                if r:  # round 0 warms up
                    per_round[name, threads].append(statistics.median(times))
    return {
        (name, threads): (
            statistics.median(per_round[name, threads]),
            statistics.median(t / e for t, e in zip(per_round[name, threads], per_round["erm", threads])),
        )
        for name, threads in turns
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
        for (name, threads), (seconds, ratio) in measure(task, args.rounds, args.steps).items():
            lines.append(f"| {size} | {threads} | {name} | {seconds * 1e3:.3f} | {ratio:.3f} |")
            print(lines[-1], flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
