"""The training loop shared by every solver: seeds, batches, logs, checkpoints, exact resume.

    results = train(load_config("run.toml"), "runs/lista")      # writes the run directory
    results = train(config, "runs/lista", resume=True)          # continues where it stopped

The update itself is :class:`~layerdescent.update.LayerwiseUpdate`, the object any loop can use;
the run directory's files are :mod:`layerdescent.rundir`'s and the stopping rules
:mod:`layerdescent.stopping`'s.
"""

from __future__ import annotations

import json
import math
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from layerdescent import rundir, stopping
from layerdescent.checkpoint import load_checkpoint, rng_state, save_checkpoint, set_rng_state
from layerdescent.config import RunConfig, TrainConfig
from layerdescent.data import Rows
from layerdescent.distributed import World, init_world, to_device
from layerdescent.errors import CheckpointError, ConfigError, DataError, DiskError, DivergenceError, PluginError
from layerdescent.evaluator import evaluate, evaluate_all
from layerdescent.guard import CheckedTask, calling, describe
from layerdescent.problem import ExtraSGD, LayerwiseProblem
from layerdescent.progress import progress_bar
from layerdescent.registry import Registry, get_registry
from layerdescent.update import LayerwiseUpdate


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch."""
    random.seed(seed)
    np.random.seed(seed % 2**32)  # a rank's offset seed may pass numpy's 32 bits; below them nothing changes
    torch.manual_seed(seed)


def epoch_steps(samples: int, train: TrainConfig) -> tuple[int, int]:
    """Micro-batches and optimizer steps in one epoch over ``samples`` training rows."""
    micro = math.ceil(samples / train.batch_size)
    return micro, math.ceil(micro / train.accumulate)


def build_primal_optimizer(model: torch.nn.Module, config: TrainConfig, extragradient: bool = False) -> torch.optim.Optimizer:
    """The model's optimizer as the config names it (Cooper's ExtraAdam/ExtraSGD for an extrapolation scheme)."""
    import cooper

    params = [p for p in model.parameters() if p.requires_grad]
    if extragradient and config.optimizer == "adamw":
        raise ConfigError("solver.scheme = 'extrapolation' has no extragradient AdamW: set train.optimizer = 'adam' (or 'sgd') and train.weight_decay as L2")
    if config.optimizer == "sgd":
        cls = ExtraSGD if extragradient else torch.optim.SGD
        return cls(params, lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay)
    cls = cooper.optim.ExtraAdam if extragradient else torch.optim.AdamW if config.optimizer == "adamw" else torch.optim.Adam
    return cls(params, lr=config.lr, weight_decay=config.weight_decay)


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
        read = ~torch.isnan(means)  # a step that read the last layer alone leaves the others NaN
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
    """What a run trains: its splits in memory, model, and the constrained update."""

    rows: dict[str, Rows]
    model: torch.nn.Module
    update: LayerwiseUpdate
    labels: list[str]
    world: World = World()
    device: torch.device = torch.device("cpu")

    @property
    def problem(self) -> LayerwiseProblem:
        """The constraints' Cooper problem (multipliers, labels)."""
        return self.update.problem


class Trainer:
    """Trains one RunConfig into one run directory."""

    def __init__(self, config: RunConfig, run_dir: str | Path, registry: Registry | None = None) -> None:
        self.config = config
        self.run_dir = Path(run_dir)
        self.registry = registry or get_registry()
        self.who = describe(self.registry, config.task.name)
        with calling(self.who, "__init__"):
            task = self.registry.task(config.task.name)(**config.task.options)
        self.task = CheckedTask(task, self.who)  # every call into the plugin is checked against the contract
        self.checkpoint_path, self.best_path = self.run_dir / "checkpoint.pt", self.run_dir / "best.pt"

    def setup(self) -> Session:
        """Join the data-parallel world (if any), seed, build splits, model and the constrained update."""
        train = self.config.train
        if train.device == "cuda" and not torch.cuda.is_available():
            raise ConfigError("train.device = 'cuda', but this torch has no usable GPU (a CPU build, or no device visible): use 'auto' or 'cpu'")
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
        solver = self.config.solver
        extragradient = self.registry.solver(solver.name).gradient_passes(solver.options) == 2
        primal = build_primal_optimizer(model, train, extragradient)
        # sync=False: the step below averages the layer means over ranks itself, before its checks
        update = LayerwiseUpdate(self.config.constraints, self.task.num_layers, primal, solver.name, sync=False, registry=self.registry, **vars(solver.options))
        update.problem.cmp.to(device)
        return Session(rows, model, update, [f"l{k}" for k in range(self.task.num_layers + 1)], world, device)

    def fit(self, resume: bool = False) -> dict[str, Any]:
        """Train (or continue), evaluate on the gamma grid, write and return ``results.json``."""
        with rundir.claim(self.run_dir):
            try:
                session = self.setup()
                results = self._fit(session, resume)
            except OSError as exc:
                if exc.errno not in rundir.DISK_ERRNOS:
                    raise
                raise DiskError(
                    f"cannot write to {self.run_dir}: {exc.strerror} ({getattr(exc, 'filename', None) or 'a run file'}); "
                    f"the last checkpoint is intact: free space and continue with --resume"
                ) from None
        session.world.close()  # on failure the ranks exit with their error; a barrier could hang
        return results

    def _fit(self, session: Session, resume: bool) -> dict[str, Any]:
        config, train = self.config, self.config.train
        rows, model, update, world = session.rows, session.model, session.update, session.world
        rundir.prepare(self.run_dir, config, self.registry, resume, write=world.is_main)
        world.barrier()

        # best_*: the epoch with the lowest last-layer validation loss, for early stopping
        position: dict[str, Any] = {"epoch": 0, "micro": 0, "step": 0, "best_loss": math.inf, "best_epoch": -1}
        step_times: list[float] = []
        skipped_steps = 0
        metrics_file = self.run_dir / "metrics.jsonl"
        if resume and self.checkpoint_path.exists():
            state = load_checkpoint(self.checkpoint_path, self.task.name, kind="run")
            self._restore(self.checkpoint_path, state, session)
            position, step_times = {**position, **state["position"]}, list(state["step_times"])
            skipped_steps = int(state["skipped_steps"])
            if world.is_main:
                rundir.rewind_log(metrics_file, self.checkpoint_path, state["metrics_offset"])

        train_set = rows["train"]
        # batch_size is global: ranks split each batch, so a config means the same run however it
        # is launched, and a run resumes on another number of processes on the same trajectory.
        micro_per_epoch, steps_per_epoch = epoch_steps(len(train_set), train)
        window = _Window()
        # Line-buffered so that `tail -f metrics.jsonl` follows a run; only rank 0 writes.
        log = metrics_file.open("a", buffering=1) if world.is_main else open(os.devnull, "w")

        def checkpoint() -> None:
            self._flush(log, window, position, update)
            log.flush()
            rngs = world.gather(rng_state())
            if world.is_main:
                payload = {"task": self.task.name, "model": model.state_dict(), **update.state_dict(), "rng": rngs, "position": dict(position)}
                save_checkpoint(self.checkpoint_path, {**payload, "step_times": step_times, "skipped_steps": skipped_steps, "metrics_offset": log.tell()})

        # a bar on a terminal, a timed line every 30 s when stderr is a pipe (a demo or bench log)
        bar = progress_bar(train.epochs * steps_per_epoch, position["step"], f"{config.name} seed {config.seed}", enabled=train.progress and world.is_main)
        try:
            while position["epoch"] < train.epochs and not stopping.patience_spent(train, position):
                order = torch.randperm(len(train_set), generator=torch.Generator().manual_seed(config.seed * 100_003 + position["epoch"]))
                micro_batches = order.split(train.batch_size)
                while position["micro"] < micro_per_epoch:
                    group = micro_batches[position["micro"] : position["micro"] + train.accumulate]
                    start = time.perf_counter()
                    try:
                        # a last-layer solver reads every layer on a log line's first step only, where the task can read the last alone
                        means, violations = self.step(session, group, position["step"], full=window.steps == 0)
                    except stopping.SkippedStep as skipped:
                        log.write(json.dumps({"event": "skipped", "epoch": position["epoch"], "step": position["step"], "reason": str(skipped)}) + "\n")
                        skipped_steps += 1
                    else:
                        step_times.append(time.perf_counter() - start)
                        window.add(means, violations)
                    position["micro"] += len(group)
                    position["step"] += 1
                    bar.update(1)
                    if window.steps >= train.log_every:
                        self._flush(log, window, position, update)
                    if train.checkpoint_every and position["step"] % train.checkpoint_every == 0:
                        checkpoint()
                update.end_epoch()
                self._flush(log, window, position, update)
                if train.validate:
                    val = evaluate(self.task, model, rows["validation"], [train.validation_gamma], config.eval.batch_size, config.eval.seed, world)[0]
                    log.write(json.dumps({"event": "epoch", "epoch": position["epoch"], "step": position["step"], "val_loss": val["layer_loss"], "val_metrics": val["metrics"]}) + "\n")
                    if stopping.improved(train, position, val["layer_loss"]) and world.is_main:
                        # written before the checkpoint that records it, so a resume finds it
                        save_checkpoint(self.best_path, {"task": self.task.name, "model": model.state_dict(), "epoch": position["epoch"]})
                position["epoch"] += 1
                position["micro"] = 0
                checkpoint()
        finally:
            bar.close()
            log.close()

        if step_times == [] and skipped_steps:
            raise DivergenceError(
                f"every one of the {skipped_steps} training steps was skipped for a non-finite loss (train.on_nonfinite = 'skip'): "
                f"nothing trained, so results.json was not written; see the 'skipped' lines of {metrics_file} for the first cause"
            )
        if train.early_stopping:
            world.barrier()  # rank 0 wrote best.pt
            self.load_model(self.best_path, model, load_checkpoint(self.best_path, self.task.name, kind="model")["model"])
        evaluation = evaluate_all(self.task, model, rows[config.eval.split], config.eval, world)
        stopping.check_finite_results(evaluation, self.who)
        results = rundir.results_table(config, self.task, position, step_times, skipped_steps, update, evaluation)
        if world.is_main:
            rundir.finish(self.run_dir, model.state_dict(), results, train.keep_checkpoint)
        return results

    def load_model(self, path: Path, model: torch.nn.Module, state: dict[str, Any]) -> None:
        """Load ``state`` into ``model``, or CheckpointError naming ``path`` when it belongs to another model."""
        try:
            model.load_state_dict(state)
        except (RuntimeError, KeyError, TypeError, ValueError) as exc:
            first = next((line.strip() for line in str(exc).splitlines()[1:] if line.strip()), str(exc).splitlines()[0] if str(exc) else "")
            raise CheckpointError(f"{path} does not fit this model ({first[:200]}): it was written by another config of task {self.task.name!r}") from None

    def _restore(self, path: Path, state: dict[str, Any], session: Session) -> None:
        """Put a run checkpoint's model, solver, multipliers and RNG back, or one CheckpointError naming the file."""
        self.load_model(path, session.model, state["model"])
        try:
            session.update.load_state_dict(state)
            set_rng_state(state["rng"][session.world.rank % len(state["rng"])])  # one state per rank it ran with
        except (RuntimeError, KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
            raise CheckpointError(
                f"checkpoint {path} holds solver, multiplier or RNG state this run cannot use ({type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:160]}); "
                f"it was written by another config or edited by hand"
            ) from None

    def step(self, session: Session, group: Sequence[torch.Tensor], step: int, full: bool = True) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """One optimizer step over micro-batches of training-row indices; the step's layer means and violations.

        Each micro-batch is global: this rank trains on its shard, and the layer means are
        reduced over ranks before anything uses them, so every rank sees the same numbers.
        ``full = False`` lets a solver that trains the last layer alone read it alone where the task offers that
        (``Task.last_layer_losses``); the other layers' means are then NaN.
        """
        update = session.update
        update.zero_grad()
        step_means = self._gradients(session, group, step, full)
        if self.config.train.lr_schedule == "cosine":  # from the step count alone, so a resumed run follows the same schedule
            total = self.config.train.epochs * epoch_steps(len(session.rows["train"]), self.config.train)[1]
            for optimizer in update.optimizer.primal_optimizers:
                for param_group in optimizer.param_groups:
                    param_group["lr"] = self.config.train.lr * 0.5 * (1 + math.cos(math.pi * min(step, total) / total))
        # a scheme that evaluates the batch again (extragradient, or a dual pass after the primal step) re-runs the same micro-batches
        update.step(closure=lambda: self._gradients(session, group, step, full=True))
        stopping.check_multipliers(update, step)
        return step_means, update.violations(step_means)

    def _gradients(self, session: Session, group: Sequence[torch.Tensor], step: int, full: bool) -> torch.Tensor:
        """Backpropagate the primal loss of every micro-batch in ``group`` (summed over ranks, clipped); the all-rank layer means."""
        train, update, labels = self.config.train, session.update, session.labels
        total = sum(len(idx) for idx in group)
        step_means = torch.zeros(len(labels), device=session.device)
        for idx in group:
            means, micro_mean, read_all = self._shard_means(session, idx, full)
            reason = stopping.nonfinite(step, "loss", micro_mean if read_all else micro_mean[-1:], labels if read_all else labels[-1:])
            if read_all:
                update.problem.start(micro_mean)  # anchors come from the whole first batch, not one shard
                # Every rank must agree on stopping, so the check reads the all-rank numbers.
                for name, value in update.violations(micro_mean).items():
                    reason = reason or stopping.nonfinite(step, f"violation of constraint {name!r}", value, update.labels[name])
                if reason is None:
                    stopping.check_nonnegative(self.who, step, micro_mean, update, labels)
            if reason and train.on_nonfinite == "skip":
                update.zero_grad()
                raise stopping.SkippedStep(reason)
            if reason:
                raise stopping.diverged(reason)
            update.observe(micro_mean, len(idx) / total)
            shard = len(idx.tensor_split(session.world.size)[session.world.rank])
            update.backward(means, shard / total, observe=False)  # a rank whose shard is empty adds no gradient
            step_means += micro_mean.detach() * (len(idx) / total)
        if torch.is_grad_enabled():
            session.world.sum_gradients(session.model.parameters())
            if train.grad_clip:
                torch.nn.utils.clip_grad_norm_(session.model.parameters(), train.grad_clip)
        return step_means

    def _shard_means(self, session: Session, idx: torch.Tensor, full: bool) -> tuple[torch.Tensor, torch.Tensor, bool]:
        """This rank's layer means on its shard of ``idx`` (differentiable), the mean over all of ``idx``, and whether every layer was read."""
        world = session.world
        shard = idx.tensor_split(world.size)[world.rank]
        width = len(session.labels)
        last_only = not (full or session.update.solver.trains_every_layer)
        if len(shard):
            batch = to_device(self.task.collate(session.rows["train"][shard]), session.device)
            gamma = self.config.train.train_gamma
            last = self.task.last_layer_losses(session.model, batch, gamma=gamma) if last_only else None
            if last is None:
                last_only = False
                means = self.task.layer_losses(session.model, batch, gamma=gamma).layer_means
            else:
                means = torch.cat([torch.full((width - 1,), float("nan"), device=session.device), last.layer_means])
            if not means.requires_grad and torch.is_grad_enabled():  # the alternating dual pass reads under no_grad
                method = "last_layer_losses" if last_only else "layer_losses"
                raise PluginError(f"{self.who}: {method} returned losses without gradients (computed under torch.no_grad() or detached): nothing would train")
        else:  # every rank takes the same branch: the task answers the same on every rank
            last_only = last_only and self.task.overrides("last_layer_losses")
            means = torch.zeros(width, device=session.device)
        if world.size == 1:
            return means, means.detach(), not last_only
        return means, world.sum(means.detach() * len(shard)) / len(idx), not last_only

    def _flush(self, log, window: _Window, position: dict[str, int], update: LayerwiseUpdate) -> None:
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
        record.update(update.record())
        log.write(json.dumps(record) + "\n")
        window.reset()


def train(config: RunConfig, run_dir: str | Path, resume: bool = False, registry: Registry | None = None) -> dict[str, Any]:
    """Train ``config`` into ``run_dir`` and return its results (see the README for the schema)."""
    return Trainer(config, run_dir, registry).fit(resume=resume)
