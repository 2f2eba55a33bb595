"""Speed-up of 2 data-parallel CPU processes (torchrun, gloo) over 1 process, same global batch.

    python benchmarks/distributed_speedup.py --out benchmarks/results/lista/distributed_speedup.md

Each configuration trains the same lista config (global batch 128) and reports its median step
time from results.json; configurations are interleaved over repeats and the speed-up is the
median over repeats of (1 process, 1 thread) / (configuration) within a repeat.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CONFIG = """
[task]
name = "lista"
layers = 8
code_dim = {code_dim}
measure_dim = {measure_dim}
sparsity = 16
weights = "ista"
train_size = 4096
validation_size = 64
test_size = 64

[train]
epochs = 1
batch_size = 128
lr = 0.0003
threads = {threads}
progress = false
validate = false

[solver]
name = "primal-dual"

[[constraints]]
kind = "descent"
"""

LAUNCHES = {
    "1 process, 1 thread": (1, 1),
    "1 process, 2 threads": (1, 2),
    "2 processes (torchrun, gloo), 1 thread each": (2, 1),
}
SIZES = {"small (64x32)": (64, 32), "wide (512x256)": (512, 256)}


def step_time(size: tuple[int, int], processes: int, threads: int) -> float:
    """Median step time (s) of one run."""
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "run.toml"
        config.write_text(CONFIG.format(code_dim=size[0], measure_dim=size[1], threads=threads))
        command = [sys.executable, "-m", "layerdescent.cli", "run", str(config), "--out", f"{tmp}/run"]
        if processes > 1:
            command = [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                f"--nproc_per_node={processes}",
                "-m",
                "layerdescent.cli",
                "run",
                str(config),
                "--out",
                f"{tmp}/run",
            ]
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        subprocess.run(command, check=True, env=env, capture_output=True)
        return json.loads(Path(f"{tmp}/run/results.json").read_text())["train"]["step_time_median"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    lines = [
        "# Data-parallel speed-up on 2 CPUs",
        "",
        f"Made by `python benchmarks/distributed_speedup.py --out {args.out}`; lista, 8 layers, global batch 128,",
        f"primal-dual, medians over {args.repeats} interleaved repeats.",
        "",
        "| model | launch | median step (ms) | speed-up over 1 process, 1 thread |",
        "|---|---|---|---|",
    ]
    for size_name, size in SIZES.items():
        times = {name: [] for name in LAUNCHES}
        for _ in range(args.repeats):
            for name, (processes, threads) in LAUNCHES.items():
                times[name].append(step_time(size, processes, threads))
        base = times["1 process, 1 thread"]
        for name in LAUNCHES:
            speedup = statistics.median(b / t for b, t in zip(base, times[name]))
            lines.append(f"| {size_name} | {name} | {statistics.median(times[name]) * 1e3:.2f} | {speedup:.2f}x |")
            print(lines[-1], flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
