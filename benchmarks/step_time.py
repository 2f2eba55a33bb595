"""Step time of each solver against erm, and of erm against a hand-written loop, in one process.

    python benchmarks/step_time.py --task lista --out benchmarks/results/lista/step_time.md
    python benchmarks/step_time.py --task text --out benchmarks/results/text/step_time.md

All solvers live in one process, each with its own model, and take turns: a round gives every
solver, at every thread count, a few steps on the same batches, in an order rotated every round,
so machine noise and warm-up hit them alike. Each step is the trainer's own ``Trainer.step``.
"hand-written loop" is ERM in plain PyTorch on the same model, loss and batches (zero_grad,
the task's last-layer loss, backward, optimizer step): the floor the framework's erm is held to.
The table gives the median step time and, as the ratio, the median over rounds of
(solver / erm) within a round.
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

LISTA = {"name": "lista", "train_size": 1024, "validation_size": 64, "test_size": 64}
# Per task: {model label: (task table, train table)}, the thread counts, and how many training rows to cycle.
SETUPS = {
    "lista": (
        {
            "small (8 layers, 64x32, 50k params)": (LISTA, {"batch_size": 64, "lr": 0.003}),
            # the wide model diverges at the small one's rate
            "wide (8 layers, 512x256, 3.1M params)": (
                {**LISTA, "code_dim": 512, "measure_dim": 256, "sparsity": 16, "weights": "ista"},
                {"batch_size": 64, "lr": 3e-4},
            ),
        },
        (1, 2),
        1024,
    ),
    "text": (
        {
            "MiniLM-L6 (22.7M params), movie reviews, batch 32": (
                {"name": "text-classification"},
                {"batch_size": 32, "lr": 3e-5, "optimizer": "adamw", "train_gamma": 0.1},
            ),
        },
        (2,),
        8454,
    ),
}
VARIANTS = {
    "erm": {"name": "erm"},
    "penalty": {"name": "penalty"},
    "primal-dual (simultaneous)": {"name": "primal-dual"},
    "primal-dual (alternating)": {"name": "primal-dual", "scheme": "alternating"},
}


class HandWrittenLoop:
    """ERM in plain PyTorch on a trainer's task, model and data, without the framework's step."""

    def __init__(self, trainer: Trainer) -> None:
        session = trainer.setup()
        train = trainer.config.train
        self.task, self.model, self.rows, self.gamma = trainer.task, session.model, session.rows["train"], train.train_gamma
        optimizer = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[train.optimizer]
        self.optimizer = optimizer(self.model.parameters(), lr=train.lr, weight_decay=train.weight_decay)

    def step(self, idx: torch.Tensor) -> None:
        self.optimizer.zero_grad()
        self.task.layer_losses(self.model, self.task.collate(self.rows[idx]), self.gamma).losses[:, -1].mean().backward()
        self.optimizer.step()


def trainer(task: dict, train: dict, solver: dict, out: Path) -> Trainer:
    """A trainer for ``solver`` with a descent constraint on every layer."""
    table = {"task": task, "train": {**train, "progress": False}, "solver": solver, "constraints": [{"kind": "descent", "alpha": 0.05}]}
    return Trainer(ld.config_from_dict(table), out)


def measure(task: dict, train: dict, threads: tuple[int, ...], rows: int, rounds: int, steps: int) -> dict[tuple[str, int], tuple[float, float]]:
    """Per (variant, threads): (median step seconds, median over rounds of the ratio to erm at those threads)."""
    with tempfile.TemporaryDirectory() as tmp:
        steppers = {}
        for i, (name, solver) in enumerate(VARIANTS.items()):
            run = trainer(task, train, solver, Path(tmp) / str(i))
            session = run.setup()
            steppers[name] = lambda idx, n, run=run, session=session: run.step(session, [idx], n)
        loop = HandWrittenLoop(trainer(task, train, {"name": "erm"}, Path(tmp) / "loop"))
        steppers["hand-written loop"] = lambda idx, n: loop.step(idx)
        order = torch.randperm(rows, generator=torch.Generator().manual_seed(0)).split(train["batch_size"])
        turns = [(name, n) for n in threads for name in steppers]
        per_round: dict[tuple[str, int], list[float]] = {turn: [] for turn in turns}
        for r in range(rounds + 1):
            for name, n in turns[r % len(turns) :] + turns[: r % len(turns)]:
                torch.set_num_threads(n)
                times = []
                for i in range(steps):
                    start = time.perf_counter()
                    steppers[name](order[(r * steps + i) % len(order)], r * steps + i)
                    times.append(time.perf_counter() - start)
                if r:  # round 0 warms up
                    per_round[name, n].append(statistics.median(times))
    return {
        (name, n): (
            statistics.median(per_round[name, n]),
            statistics.median(t / e for t, e in zip(per_round[name, n], per_round["erm", n])),
        )
        for name, n in turns
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", choices=sorted(SETUPS), default="lista")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--steps", type=int, default=5, help="steps per solver per round")
    args = parser.parse_args()
    models, threads, rows = SETUPS[args.task]
    command = f"python benchmarks/step_time.py --task {args.task} --out {args.out} --rounds {args.rounds} --steps {args.steps}"
    lines = [
        f"# Step time on {args.task}",
        "",
        f"Made by `{command}` on 2 CPUs: {args.rounds} rounds of {args.steps} steps per solver,",
        "interleaved in one process; median step time and median per-round ratio to erm.",
        "",
        "| model | threads | solver | median step (ms) | × erm |",
        "|---|---|---|---|---|",
    ]
    for model, (task, train) in models.items():
        for (name, n), (seconds, ratio) in measure(task, train, threads, rows, args.rounds, args.steps).items():
            lines.append(f"| {model} | {n} | {name} | {seconds * 1e3:.3f} | {ratio:.3f} |")
            print(lines[-1], flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
