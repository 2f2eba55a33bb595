"""The training loop shared by every solver: seeds, batches, logs, checkpoints, exact resume.

    results = train(load_config("run.toml"), "runs/lista")      # writes the run directory
    results = train(config, "runs/lista", resume=True)          # continues where it stopped

A run directory holds ``config.toml`` (the resolved config), ``metrics.jsonl``,
``checkpoint.pt`` and, once finished, ``results.json``.
"""

from __future__ import annotations

import errno
import json
import math
import os
import random
import statistics
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
import tomli_w
import torch

from layerdescent import __version__
from layerdescent import rundir
from layerdescent.checkpoint import load_checkpoint, load_model_file, previous_path, rng_state, save_checkpoint, save_model_file, set_rng_state
from layerdescent.config import RunConfig, TrainConfig, load_config, read_toml
from layerdescent.data import Rows
from layerdescent.distributed import World, init_world, to_device
from layerdescent.errors import CheckpointError, ConfigError, DataError, DiskError, DivergenceError, PluginError
from layerdescent.evaluator import evaluate, evaluate_all
from layerdescent.guard import CheckedTask, calling, describe
from layerdescent.problem import LayerwiseProblem
from layerdescent.progress import progress_bar
from layerdescent.registry import Registry, get_registry
from layerdescent.solvers import Solver, build_solver
from layerdescent.trackers import open_trackers

RESULTS_SCHEMA = 1


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch."""
    random.seed(seed)
    np.random.seed(seed % 2**32)  # a rank's offset seed may pass numpy's 32 bits; below them nothing changes
    torch.manual_seed(seed)


def epoch_steps(samples: int, train: TrainConfig) -> tuple[int, int]:
    """Micro-batches and optimizer steps in one epoch over ``samples`` training rows."""
    micro = math.ceil(samples / train.batch_size)
    return micro, math.ceil(micro / train.accumulate)


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


# Write errors that mean the disk, not the run, is the problem (EFBIG: a file size limit).
DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EIO)


def _check_finite_results(evaluation: dict[str, Any], who: str) -> None:
    """Raise DataError when the final evaluation holds a NaN or infinite loss, before results.json is written."""
    where = [("test", evaluation["gammas"]), *((f"domain {name!r}", records) for name, records in evaluation.get("domains", {}).items())]
    for what, records in where:
        for record in records:
            for key in ("layer_loss", "descent_rate"):
                bad = [k for k, v in enumerate(record[key]) if not math.isfinite(v)]
                if bad:
                    raise DataError(
                        f"{who}: layer_losses gave a non-finite evaluation loss on the {what} set at gamma {record['gamma']:g}, "
                        f"l{bad[0]} = {record[key][bad[0]]}; results.json was not written (check the perturbation at that level)"
                    )


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
        self.who = describe(self.registry, config.task.name)
        with calling(self.who, "__init__"):
            task = self.registry.task(config.task.name)(**config.task.options)
        self.task = CheckedTask(task, self.who)  # every call into the plugin is checked against the contract

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
        problem = LayerwiseProblem(self.config.constraints, self.task.num_layers)
        problem.cmp.to(device)
        solver = build_solver(self.config.solver, problem, build_primal_optimizer(model, train))
        return Session(rows, model, problem, solver, [f"l{k}" for k in range(self.task.num_layers + 1)], world, device)

    def fit(self, resume: bool = False) -> dict[str, Any]:
        """Train (or continue), evaluate on the gamma grid, write and return ``results.json``."""
        # Only rank 0 writes, so only rank 0 locks; torchrun sets RANK before anything runs.
        main = int(os.environ.get("RANK", "0")) == 0
        with rundir.locked(self.run_dir) if main else _no_lock() as was_run:
            if main:
                rundir.refuse_foreign(self.run_dir, was_run)
            try:
                session = self.setup()
                results = self._fit(session, resume)
            except OSError as exc:
                if exc.errno not in DISK_ERRNOS:
                    raise
                raise DiskError(
                    f"cannot write to {self.run_dir}: {exc.strerror} ({getattr(exc, 'filename', None) or 'a run file'}); "
                    f"the last checkpoint is intact: free space and continue with --resume"
                ) from None
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
            state = load_checkpoint(self.checkpoint_path, self.task.name, kind="run")
            self._restore(self.checkpoint_path, state, session)
            position, step_times = {**position, **state["position"]}, list(state["step_times"])
            skipped_steps = int(state["skipped_steps"])
            if world.is_main:
                logged = metrics_file.stat().st_size if metrics_file.exists() else None
                if logged is None:
                    raise CheckpointError(f"{metrics_file} is missing, so the run's log cannot continue: restore it, or start the run again in a new --out")
                if state["metrics_offset"] > logged:
                    raise CheckpointError(
                        f"checkpoint {self.checkpoint_path} says metrics.jsonl held {state['metrics_offset']} bytes, but it holds {logged}: "
                        f"the log is not the one this checkpoint wrote; restore it, or start the run again in a new --out"
                    )
                with metrics_file.open("r+b") as handle:  # drop what was logged after the checkpoint
                    handle.truncate(state["metrics_offset"])

        train_set = rows["train"]
        # batch_size is global: ranks split each batch, so a config means the same run however it
        # is launched, and a run resumes on another number of processes on the same trajectory.
        micro_per_epoch, steps_per_epoch = epoch_steps(len(train_set), train)
        window = _Window()
        # Line-buffered so that `tail -f metrics.jsonl` follows a run; only rank 0 writes.
        log = metrics_file.open("a", buffering=1) if world.is_main else open(os.devnull, "w")
        self._trackers = open_trackers(config, self.run_dir, position["step"])

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
                    record = {"event": "epoch", "epoch": position["epoch"], "step": position["step"], "val_loss": val["layer_loss"], "val_metrics": val["metrics"]}
                    log.write(json.dumps(record) + "\n")
                    self._trackers.log(record)
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

        if step_times == [] and skipped_steps:
            raise DivergenceError(
                f"every one of the {skipped_steps} training steps was skipped for a non-finite loss (train.on_nonfinite = 'skip'): "
                f"nothing trained, so results.json was not written; see the 'skipped' lines of {metrics_file} for the first cause"
            )
        if train.early_stopping:
            world.barrier()  # rank 0 wrote best.pt
            best = load_checkpoint(self.best_path, self.task.name, kind="model")
            self._load_model(self.best_path, model, best["model"])
        evaluation = evaluate_all(self.task, model, rows[config.eval.split], config.eval, world)
        _check_finite_results(evaluation, self.who)
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
            # What evaluation needs outlives the run; optimizer state only on request (it is most of the bytes).
            save_model_file(self.run_dir / MODEL_FILE, model.state_dict())
            _write_atomic(self.run_dir / "results.json", json.dumps(results, indent=2) + "\n")
            self._trackers.close(results, self.run_dir)
            if not train.keep_checkpoint:
                for stale in (self.checkpoint_path, self.best_path):
                    stale.unlink(missing_ok=True)
                    previous_path(stale).unlink(missing_ok=True)
        return results

    def _load_model(self, path: Path, model: torch.nn.Module, state: dict[str, Any]) -> None:
        """Load ``state`` into ``model``, or CheckpointError naming ``path`` when it belongs to another model."""
        try:
            model.load_state_dict(state)
        except (RuntimeError, KeyError, TypeError, ValueError) as exc:
            first = next((line.strip() for line in str(exc).splitlines()[1:] if line.strip()), str(exc).splitlines()[0] if str(exc) else "")
            raise CheckpointError(f"{path} does not fit this model ({first[:200]}): it was written by another config of task {self.task.name!r}") from None

    def _restore(self, path: Path, state: dict[str, Any], session: Session) -> None:
        """Put a run checkpoint's model, solver, multipliers and RNG back, or one CheckpointError naming the file."""
        self._load_model(path, session.model, state["model"])
        try:
            session.solver.load_state_dict(state["solver"])
            session.problem.load_state_dict(state["problem"])
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
            if reason is None and read_all:
                self._check_nonnegative(step, micro_mean, problem, labels)
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
        if train.lr_schedule == "cosine":  # from the step count alone, so a resumed run follows the same schedule
            total = train.epochs * epoch_steps(len(session.rows["train"]), train)[1]
            for optimizer in solver.optimizer.primal_optimizers:
                for group in optimizer.param_groups:
                    group["lr"] = train.lr * 0.5 * (1 + math.cos(math.pi * min(step, total) / total))
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

    def _check_nonnegative(self, step: int, means: torch.Tensor, problem: LayerwiseProblem, labels: list[str]) -> None:
        """Raise PluginError when a constraint that assumes losses >= 0 (descent's (1 - alpha) margin) sees a negative one."""
        needing = [spec for spec in problem.specs if getattr(spec, "needs_nonnegative_losses", False)]
        if needing and bool((means < 0).any()):
            k = int((means < 0).nonzero()[0])
            spec = needing[0]
            raise PluginError(
                f"{self.who}: layer_losses returned a negative mean loss at step {step}, {labels[k]} = {means[k].item():.4g}; "
                f"constraint {spec.name!r} ({spec.kind}) needs losses >= 0 (its margin scales the previous layer's loss): shift the loss, or use a bound"
            )

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
            if not means.requires_grad and torch.is_grad_enabled():  # the alternating dual pass reads under no_grad
                method = "last_layer_losses" if last_only else "layer_losses"
                raise PluginError(f"{self.who}: {method} returned losses without gradients (computed under torch.no_grad() or detached): nothing would train")
        else:  # every rank takes the same branch: the task answers the same on every rank
            last_only = last_only and self.task.overrides("last_layer_losses")
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
        self._trackers.log(record)
        window.reset()

    def _prepare_run_dir(self, resume: bool, write: bool = True) -> None:
        config_file = self.run_dir / "config.toml"
        finished = (self.run_dir / "results.json").exists()
        if resume:
            if config_file.exists():
                difference = rundir.config_difference(read_toml(config_file), self.config, self.registry)
                if difference:
                    raise ConfigError(f"--resume: the config differs from the one recorded in {config_file} at {difference}; resume with the same config")
            if finished and not self.checkpoint_path.exists():
                raise ConfigError(f"{self.run_dir} holds a finished run and no checkpoint.pt: nothing to resume (train.keep_checkpoint = true keeps it); --out a new directory")
        elif self.checkpoint_path.exists() or finished:
            raise ConfigError(f"{self.run_dir} already holds a run; pass --resume to continue it or --out a new directory")
        if not write:
            return
        for stale in self.run_dir.glob(f".{self.checkpoint_path.name}.*"):
            stale.unlink()  # a checkpoint write cut short by a kill
        config_file.write_text(tomli_w.dumps(self.config.as_dict()))
        if not (resume and self.checkpoint_path.exists()):
            (self.run_dir / "metrics.jsonl").write_text("")  # nothing to continue: start the log over


MODEL_FILE = "model.safetensors"  # the final (evaluated) model of a finished run


def _write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file, so a reader sees the old file or the new one."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


@contextmanager
def _no_lock() -> Iterator[bool]:
    yield True


def _patience_spent(train: TrainConfig, position: dict[str, Any]) -> bool:
    """Whether early stopping has seen ``train.early_stopping`` epochs without a better validation loss."""
    return bool(train.early_stopping) and position["epoch"] - 1 - position["best_epoch"] >= train.early_stopping


def train(config: RunConfig, run_dir: str | Path, resume: bool = False, registry: Registry | None = None) -> dict[str, Any]:
    """Train ``config`` into ``run_dir`` and return its results (see the README for the schema)."""
    return Trainer(config, run_dir, registry).fit(resume=resume)


# What a re-evaluation may change: how the finished model is tested, never how it was trained.
REEVALUATE_KEYS = ("task.perturbation", "eval.")


def final_model_file(run_dir: Path, config: RunConfig) -> Path:
    """The file holding a finished run's tested model: model.safetensors, or in runs from before it best.pt / checkpoint.pt."""
    for name in (MODEL_FILE, "best.pt" if config.train.early_stopping else "checkpoint.pt"):
        if (run_dir / name).exists():
            return run_dir / name
    raise ConfigError(f"{run_dir} has neither {MODEL_FILE} nor a checkpoint, so its model is gone: re-run it to evaluate it again")


def evaluate_config(run_dir: str | Path, overrides: Sequence[str] = (), registry: Registry | None = None) -> RunConfig:
    """The config a re-evaluation of ``run_dir`` runs under: its recorded one, with only task.perturbation and eval.* changed."""
    run_dir = Path(run_dir)
    if not (run_dir / "results.json").exists():
        raise ConfigError(f"{run_dir} holds no finished run (no results.json): train it to the end first")
    for override in overrides:
        key = override.partition("=")[0].strip()
        if not key.startswith(REEVALUATE_KEYS):
            raise ConfigError(f"re-evaluation can change only task.perturbation and eval.*, not {key} (that needs a new run)")
    return load_config(run_dir / "config.toml", list(overrides), registry)


def evaluate_run(run_dir: str | Path, out: str | Path, overrides: Sequence[str] = (), registry: Registry | None = None) -> dict[str, Any]:
    """Test a finished run's final model again (another perturbation or gamma grid) into ``out``."""
    run_dir, out = Path(run_dir), Path(out)
    config = evaluate_config(run_dir, overrides, registry)
    model_file = final_model_file(run_dir, config)
    if out.resolve() == run_dir.resolve():
        raise ConfigError(f"--out must differ from the run directory {run_dir}: its results would be overwritten")
    from layerdescent.report import read_results  # the same checks a summary makes

    recorded = read_results(run_dir / "results.json")
    trainer = Trainer(config, out, registry)
    main = int(os.environ.get("RANK", "0")) == 0
    with rundir.locked(out) if main else _no_lock() as was_run:
        if main:
            rundir.refuse_foreign(out, was_run)
        session = trainer.setup()
        # The model that was tested: the best validation epoch's when early stopping kept one.
        if model_file.suffix == ".safetensors":
            state = load_model_file(model_file)
        else:
            state = load_checkpoint(model_file, trainer.task.name, kind="model")["model"]
        trainer._load_model(model_file, session.model, state)
        evaluation = evaluate_all(trainer.task, session.model, session.rows[config.eval.split], config.eval, session.world)
        _check_finite_results(evaluation, trainer.who)
        results = {
            **{k: v for k, v in recorded.items() if k != "domains"},
            "split": config.eval.split,
            "perturbation": trainer.task.perturbation,
            "evaluated_from": str(run_dir),
            **evaluation,
        }
        if session.world.is_main:
            (out / "config.toml").write_text(tomli_w.dumps(config.as_dict()))
            _write_atomic(out / "results.json", json.dumps(results, indent=2) + "\n")
    session.world.close()
    return results
