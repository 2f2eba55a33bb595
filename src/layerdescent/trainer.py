"""The training loop shared by every solver: seeds, batches, logs, checkpoints, exact resume.

    results = train(load_config("run.toml"), "runs/lista")      # writes the run directory
    results = train(config, "runs/lista", resume=True)          # continues where it stopped

A run directory holds ``config.toml`` (the resolved config), ``metrics.jsonl``,
``checkpoint.pt`` and, once finished, ``results.json``.
"""

from __future__ import annotations

import json
import math
import os
import random
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import tomli_w
import torch

from layerdescent import __version__
from layerdescent.checkpoint import load_checkpoint, rng_state, save_checkpoint, set_rng_state
from layerdescent.config import RunConfig, TrainConfig, load_config
from layerdescent.data import Rows
from layerdescent.distributed import World, init_world, to_device
from layerdescent.errors import ConfigError, DataError, DivergenceError
from layerdescent.evaluator import evaluate, evaluate_all
from layerdescent.problem import LayerwiseProblem
from layerdescent.progress import progress_bar
from layerdescent.registry import Registry, get_registry
from layerdescent.solvers import Solver, build_solver
from layerdescent.task import Task

RESULTS_SCHEMA = 1


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def build_primal_optimizer(model: torch.nn.Module, config: TrainConfig) -> torch.optim.Optimizer:
    """The model's optimizer as the config names it."""
    params = [p for p in model.parameters() if p.requires_grad]
    if config.optimizer == "sgd":
        return torch.optim.SGD(params, lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay)
    cls = torch.optim.AdamW if config.optimizer == "adamw" else torch.optim.Adam
    return cls(params, lr=config.lr, weight_decay=config.weight_decay)


def _nonfinite(step: int, what: str, values: torch.Tensor, labels: list[str]) -> str | None:
    """Why ``values`` cannot be trained on (naming the step, the entry and the quantity), or None."""
    if bool(torch.isfinite(values).all()):
        return None
    bad = int((~torch.isfinite(values)).nonzero().flatten()[0])
    return f"non-finite {what} at step {step}, {labels[bad]} = {values.flatten()[bad].item()}"


def _diverged(reason: str) -> DivergenceError:
    return DivergenceError(f"{reason}; the last checkpoint is intact (lower train.lr or solver.dual_lr, or set train.grad_clip)")


class _SkippedStep(Exception):
    """A step whose loss was not finite, dropped because train.on_nonfinite = 'skip'."""


class _Window:
    """Sums of what one log line reports, over the steps since the last line."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Start a new log line."""
        self.steps = 0
        self.full = 0  # steps that read every layer, so whose violations are known
        self.feasible = 0
        self.loss: torch.Tensor | None = None
        self.counts: torch.Tensor | None = None
        self.violation: dict[str, torch.Tensor] = {}

    def add(self, means: torch.Tensor, violations: dict[str, torch.Tensor]) -> None:
        self.steps += 1
        read = ~torch.isnan(means)  # an erm step on the last layer alone leaves the others NaN
        self.loss = means.nan_to_num() if self.loss is None else self.loss + means.nan_to_num()
        self.counts = read.float() if self.counts is None else self.counts + read
        if not bool(read.all()):
            return
        self.full += 1
        self.feasible += all(bool((v <= 0).all()) for v in violations.values())
        for name, value in violations.items():
            self.violation[name] = value.clone() if name not in self.violation else self.violation[name] + value


def set_dropout(model: torch.nn.Module, rate: float, task: str) -> None:
    """Give every dropout layer of ``model`` the rate ``train.dropout`` asks for."""
    layers = [m for m in model.modules() if isinstance(m, torch.nn.modules.dropout._DropoutNd)]
    if not layers:
        raise ConfigError(f"train.dropout = {rate:g}, but task {task!r} builds a model with no dropout layer; remove train.dropout")
    for layer in layers:
        layer.p = rate


@dataclass
class Session:
    """What a run trains: its splits in memory, model, constraints and solver."""

    rows: dict[str, Rows]
    model: torch.nn.Module
    problem: LayerwiseProblem
    solver: Solver
    labels: list[str]
    world: World = World()
    device: torch.device = torch.device("cpu")


class Trainer:
    """Trains one RunConfig into one run directory."""

    def __init__(self, config: RunConfig, run_dir: str | Path, registry: Registry | None = None) -> None:
        self.config = config
        self.run_dir = Path(run_dir)
        self.registry = registry or get_registry()
        self.task: Task = self.registry.task(config.task.name)(**config.task.options)

    @property
    def checkpoint_path(self) -> Path:
        return self.run_dir / "checkpoint.pt"

    @property
    def best_path(self) -> Path:
        """The model of the best validation epoch, kept when ``train.early_stopping`` is on."""
        return self.run_dir / "best.pt"

    def setup(self) -> Session:
        """Join the data-parallel world (if any), seed, build splits, model, constraints and solver."""
        train = self.config.train
        world, device = init_world(train.device)
        if train.threads:
            torch.set_num_threads(train.threads)
        seed_everything(self.config.seed)
        splits = self.task.build_datasets()
        rows = {}
        for split in ("train", "validation", "test"):
            if split not in splits or len(splits[split]) == 0:
                raise DataError(f"task {self.task.name!r} built an empty or missing {split!r} split; check its data options")
            rows[split] = Rows(splits[split])
            rows[split].check_finite(split)
        model = self.task.build_model().to(device)
        if train.dropout is not None:
            set_dropout(model, train.dropout, self.task.name)
        if world.rank:  # the same initial model everywhere, independent perturbations per rank
            seed_everything(self.config.seed + 1_000_003 * world.rank)
        problem = LayerwiseProblem(self.config.constraints, self.task.num_layers)
        problem.cmp.to(device)
        solver = build_solver(self.config.solver, problem, build_primal_optimizer(model, train))
        return Session(rows, model, problem, solver, [f"l{k}" for k in range(self.task.num_layers + 1)], world, device)

    def fit(self, resume: bool = False) -> dict[str, Any]:
        """Train (or continue), evaluate on the gamma grid, write and return ``results.json``."""
        session = self.setup()
        results = self._fit(session, resume)
        session.world.close()  # on failure the ranks exit with their error; a barrier could hang
        return results

    def _fit(self, session: Session, resume: bool) -> dict[str, Any]:
        config, train = self.config, self.config.train
        rows, model, problem, solver, world = session.rows, session.model, session.problem, session.solver, session.world
        self._prepare_run_dir(resume, write=world.is_main)
        world.barrier()

        # best_*: the epoch with the lowest last-layer validation loss, for early stopping
        position: dict[str, Any] = {"epoch": 0, "micro": 0, "step": 0, "best_loss": math.inf, "best_epoch": -1}
        step_times: list[float] = []
        skipped_steps = 0
        metrics_file = self.run_dir / "metrics.jsonl"
        if resume and self.checkpoint_path.exists():
            state = load_checkpoint(self.checkpoint_path, self.task.name)
            model.load_state_dict(state["model"])
            solver.load_state_dict(state["solver"])
            problem.load_state_dict(state["problem"])
            set_rng_state(state["rng"][world.rank % len(state["rng"])])  # one state per rank it ran with
            position, step_times = {**position, **state["position"]}, list(state["step_times"])
            skipped_steps = int(state["skipped_steps"])
            if world.is_main:
                with metrics_file.open("r+b") as handle:  # drop what was logged after the checkpoint
                    handle.truncate(state["metrics_offset"])

        train_set = rows["train"]
        # batch_size is global: ranks split each batch, so a config means the same run however it
        # is launched, and a run resumes on another number of processes on the same trajectory.
        micro_per_epoch = math.ceil(len(train_set) / train.batch_size)
        steps_per_epoch = math.ceil(micro_per_epoch / train.accumulate)
        window = _Window()
        # Line-buffered so that `tail -f metrics.jsonl` follows a run; only rank 0 writes.
        log = metrics_file.open("a", buffering=1) if world.is_main else open(os.devnull, "w")

        def checkpoint() -> None:
            self._flush(log, window, position, problem)
            log.flush()
            rngs = world.gather(rng_state())
            if not world.is_main:
                return
            save_checkpoint(
                self.checkpoint_path,
                {
                    "task": self.task.name,
                    "model": model.state_dict(),
                    "solver": solver.state_dict(),
                    "problem": problem.state_dict(),
                    "rng": rngs,
                    "position": dict(position),
                    "step_times": step_times,
                    "skipped_steps": skipped_steps,
                    "metrics_offset": log.tell(),
                },
            )

        # a bar on a terminal, a timed line every 30 s when stderr is a pipe (a demo or bench log)
        bar = progress_bar(train.epochs * steps_per_epoch, position["step"], f"{config.name} seed {config.seed}", enabled=train.progress and world.is_main)
        try:
            while position["epoch"] < train.epochs and not _patience_spent(train, position):
                order = torch.randperm(len(train_set), generator=torch.Generator().manual_seed(config.seed * 100_003 + position["epoch"]))
                micro_batches = order.split(train.batch_size)
                while position["micro"] < micro_per_epoch:
                    group = micro_batches[position["micro"] : position["micro"] + train.accumulate]
                    start = time.perf_counter()
                    try:
                        # erm reads every layer on a log line's first step only, where the task can read the last alone
                        means, violations = self.step(session, group, position["step"], full=window.steps == 0)
                    except _SkippedStep as skipped:
                        log.write(json.dumps({"event": "skipped", "epoch": position["epoch"], "step": position["step"], "reason": str(skipped)}) + "\n")
                        skipped_steps += 1
                    else:
                        step_times.append(time.perf_counter() - start)
                        window.add(means, violations)
                    position["micro"] += len(group)
                    position["step"] += 1
                    bar.update(1)
                    if window.steps >= train.log_every:
                        self._flush(log, window, position, problem)
                    if train.checkpoint_every and position["step"] % train.checkpoint_every == 0:
                        checkpoint()
                solver.end_epoch()
                self._flush(log, window, position, problem)
                if train.validate:
                    val = evaluate(self.task, model, rows["validation"], [train.validation_gamma], config.eval.batch_size, config.eval.seed, world)[0]
                    log.write(json.dumps({"event": "epoch", "epoch": position["epoch"], "step": position["step"], "val_loss": val["layer_loss"], "val_metrics": val["metrics"]}) + "\n")
                    if train.early_stopping and val["layer_loss"][-1] < position["best_loss"]:
                        position["best_loss"], position["best_epoch"] = val["layer_loss"][-1], position["epoch"]
                        position["best_val_loss"] = val["layer_loss"]  # every layer's, for tuning and the reports
                        if world.is_main:  # written before the checkpoint that records it, so a resume finds it
                            save_checkpoint(self.best_path, {"task": self.task.name, "model": model.state_dict(), "epoch": position["epoch"]})
                position["epoch"] += 1
                position["micro"] = 0
                checkpoint()
        finally:
            bar.close()
            log.close()

        if train.early_stopping:
            world.barrier()  # rank 0 wrote best.pt
            model.load_state_dict(load_checkpoint(self.best_path, self.task.name)["model"])
        evaluation = evaluate_all(self.task, model, rows[config.eval.split], config.eval, world)
        relaxations = problem.relaxations()
        results = {
            "schema": RESULTS_SCHEMA,
            "layerdescent": __version__,
            "label": config.name,
            "task": self.task.name,
            "solver": config.solver.name,
            "seed": config.seed,
            "num_layers": self.task.num_layers,
            "split": config.eval.split,
            "perturbation": self.task.perturbation,
            "train": {
                "steps": position["step"],
                "epochs": position["epoch"],
                **({"best_epoch": position["best_epoch"], "best_val_loss": position.get("best_val_loss")} if train.early_stopping else {}),
                "step_time_median": statistics.median(step_times) if step_times else None,
                "skipped_steps": skipped_steps,
            },
            "constraints": {
                name: {
                    "labels": problem.labels[name],
                    "lambda": value.tolist(),
                    **({"relaxation": relaxations[name].tolist()} if name in relaxations else {}),
                }
                for name, value in problem.multipliers().items()
            },
            **evaluation,
        }
        if world.is_main:
            (self.run_dir / "results.json").write_text(json.dumps(results, indent=2) + "\n")
        return results

    def step(self, session: Session, group: Sequence[torch.Tensor], step: int, full: bool = True) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """One optimizer step over micro-batches of training-row indices; the step's layer means and violations.

        Each micro-batch is global: this rank trains on its shard, and the layer means are
        reduced over ranks before anything uses them, so every rank sees the same numbers.
        ``full = False`` lets erm read the last layer alone where the task offers that
        (``Task.last_layer_losses``); the other layers' means are then NaN.
        """
        train = self.config.train
        model, solver, problem, labels = session.model, session.solver, session.problem, session.labels
        solver.optimizer.zero_grad()
        total = sum(len(idx) for idx in group)
        step_means = torch.zeros(len(labels), device=session.device)
        for idx in group:
            means, micro_mean, read_all = self._shard_means(session, idx, full)
            if read_all:
                problem.start(micro_mean)  # anchors come from the whole first batch, not one shard
                violations = problem.violations(means)
                # Every rank must agree on stopping, so the check reads the all-rank numbers.
                checked = {k: v.detach() for k, v in violations.items()} if session.world.size == 1 else problem.violations(micro_mean)
                reason = _nonfinite(step, "loss", micro_mean, labels)
            else:  # erm on the last layer alone: nothing else to check
                violations, checked = {}, {}
                reason = _nonfinite(step, "loss", micro_mean[-1:], labels[-1:])
            for name, value in checked.items():
                reason = reason or _nonfinite(step, f"violation of constraint {name!r}", value, problem.labels[name])
            if reason and train.on_nonfinite == "skip":
                solver.optimizer.zero_grad()
                raise _SkippedStep(reason)
            if reason:
                raise _diverged(reason)
            if means.requires_grad:  # a rank whose shard is empty adds nothing
                shard = len(idx.tensor_split(session.world.size)[session.world.rank])
                (solver.primal_loss(means, violations) * (shard / total)).backward()
            step_means += micro_mean.detach() * (len(idx) / total)
        session.world.sum_gradients(model.parameters())
        if train.grad_clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), train.grad_clip)
        solver.optimizer.primal_step()
        dual_means = step_means
        if solver.needs_dual and self.config.solver.scheme == "alternating":
            with torch.no_grad():  # lambda follows the updated model
                dual_means = sum(self._shard_means(session, idx, full=True)[1] * (len(idx) / total) for idx in group)
        solver.observe(dual_means)
        bound = self.config.solver.max_multiplier
        for name, value in problem.multipliers().items():
            reason = _nonfinite(step, f"multiplier of constraint {name!r}", value, problem.labels[name])
            if reason is None and bool((value > bound).any()):
                entry = int((value > bound).nonzero()[0])
                reason = f"multiplier of constraint {name!r} exploded at step {step}, {problem.labels[name][entry]} = {value[entry].item():.4g} > solver.max_multiplier = {bound:g}"
            if reason:
                raise _diverged(reason)
        with torch.no_grad():
            violations = problem.violations(step_means)
        return step_means, violations

    def _shard_means(self, session: Session, idx: torch.Tensor, full: bool) -> tuple[torch.Tensor, torch.Tensor, bool]:
        """This rank's layer means on its shard of ``idx`` (differentiable), the mean over all of ``idx``, and whether every layer was read."""
        world = session.world
        shard = idx.tensor_split(world.size)[world.rank]
        width = len(session.labels)
        last_only = not (full or session.solver.trains_every_layer)
        if len(shard):
            batch = to_device(self.task.collate(session.rows["train"][shard]), session.device)
            gamma = self.config.train.train_gamma
            last = self.task.last_layer_losses(session.model, batch, gamma=gamma) if last_only else None
            if last is None:
                last_only = False
                means = self.task.layer_losses(session.model, batch, gamma=gamma).layer_means
            else:
                means = torch.cat([torch.full((width - 1,), float("nan"), device=session.device), last.layer_means])
        else:  # every rank takes the same branch: the task answers the same on every rank
            last_only = last_only and type(self.task).last_layer_losses is not Task.last_layer_losses
            means = torch.zeros(width, device=session.device)
        if world.size == 1:
            return means, means.detach(), not last_only
        return means, world.sum(means.detach() * len(shard)) / len(idx), not last_only

    def _flush(self, log, window: _Window, position: dict[str, int], problem: LayerwiseProblem) -> None:
        if window.steps == 0:
            return
        full = max(window.full, 1)
        record: dict[str, Any] = {
            "event": "train",
            "epoch": position["epoch"],
            "step": position["step"],
            "loss": (window.loss / window.counts.clamp(min=1)).tolist(),
            "feasible": window.feasible / full,
            "violation": {k: (v / full).tolist() for k, v in window.violation.items()},
        }
        if self.config.solver.name == "primal-dual":
            record["lambda"] = {k: v.tolist() for k, v in problem.multipliers().items()}
            record["relaxation"] = {k: v.tolist() for k, v in problem.relaxations().items()}
        log.write(json.dumps(record) + "\n")
        window.reset()

    def _prepare_run_dir(self, resume: bool, write: bool = True) -> None:
        config_file = self.run_dir / "config.toml"
        resolved = tomli_w.dumps(self.config.as_dict())
        if resume:
            if config_file.exists() and config_file.read_text() != resolved:
                raise ConfigError(f"--resume: the config differs from the one recorded in {config_file}; resume with the same config")
        elif self.checkpoint_path.exists() or (self.run_dir / "results.json").exists():
            raise ConfigError(f"{self.run_dir} already holds a run; pass --resume to continue it or --out a new directory")
        if not write:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        for stale in self.run_dir.glob(f".{self.checkpoint_path.name}.*"):
            stale.unlink()  # a checkpoint write cut short by a kill
        config_file.write_text(resolved)
        if not (resume and self.checkpoint_path.exists()):
            (self.run_dir / "metrics.jsonl").write_text("")  # nothing to continue: start the log over


def _patience_spent(train: TrainConfig, position: dict[str, Any]) -> bool:
    """Whether early stopping has seen ``train.early_stopping`` epochs without a better validation loss."""
    return bool(train.early_stopping) and position["epoch"] - 1 - position["best_epoch"] >= train.early_stopping


def train(config: RunConfig, run_dir: str | Path, resume: bool = False, registry: Registry | None = None) -> dict[str, Any]:
    """Train ``config`` into ``run_dir`` and return its results (see the README for the schema)."""
    return Trainer(config, run_dir, registry).fit(resume=resume)


# What a re-evaluation may change: how the finished model is tested, never how it was trained.
REEVALUATE_KEYS = ("task.perturbation", "eval.")


def evaluate_run(run_dir: str | Path, out: str | Path, overrides: Sequence[str] = (), registry: Registry | None = None) -> dict[str, Any]:
    """Test a finished run's final model again (another perturbation or gamma grid) into ``out``."""
    run_dir, out = Path(run_dir), Path(out)
    if not (run_dir / "results.json").exists():
        raise ConfigError(f"{run_dir} holds no finished run (no results.json): train it to the end first")
    for override in overrides:
        key = override.partition("=")[0].strip()
        if not key.startswith(REEVALUATE_KEYS):
            raise ConfigError(f"re-evaluation can change only task.perturbation and eval.*, not {key} (that needs a new run)")
    if not (run_dir / "checkpoint.pt").exists():
        raise ConfigError(f"{run_dir} has no checkpoint.pt, so its model is gone: re-run it to evaluate it again")
    if out.resolve() == run_dir.resolve():
        raise ConfigError(f"--out must differ from the run directory {run_dir}: its results would be overwritten")
    config = load_config(run_dir / "config.toml", list(overrides), registry)
    trainer = Trainer(config, out, registry)
    session = trainer.setup()
    # The model that was tested: the best validation epoch's when early stopping kept one.
    model_file = run_dir / ("best.pt" if config.train.early_stopping else "checkpoint.pt")
    session.model.load_state_dict(load_checkpoint(model_file, trainer.task.name)["model"])
    evaluation = evaluate_all(trainer.task, session.model, session.rows[config.eval.split], config.eval, session.world)
    results = {
        **{k: v for k, v in json.loads((run_dir / "results.json").read_text()).items() if k != "domains"},
        "split": config.eval.split,
        "perturbation": trainer.task.perturbation,
        "evaluated_from": str(run_dir),
        **evaluation,
    }
    if session.world.is_main:
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.toml").write_text(tomli_w.dumps(config.as_dict()))
        (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    session.world.close()
    return results
