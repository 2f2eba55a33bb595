"""The training loop shared by every solver: seeds, batches, logs, checkpoints, exact resume.

    results = train(load_config("run.toml"), "runs/lista")      # writes the run directory
    results = train(config, "runs/lista", resume=True)          # continues where it stopped

The update itself is :class:`~layerdescent.core.update.LayerwiseUpdate`, the object any loop can use;
what a run trains is built by :mod:`layerdescent.run.session`, the run directory's files are
:mod:`layerdescent.run.rundir`'s and the stopping rules :mod:`layerdescent.run.stopping`'s.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from layerdescent.core.divergence import diverged
from layerdescent.core.observation import Observation
from layerdescent.core.update import LayerwiseUpdate
from layerdescent.distributed import World
from layerdescent.errors import DivergenceError
from layerdescent.registry import Registry, get_registry
from layerdescent.run import files, finish, lock, rundir, stopping
from layerdescent.run.batches import epoch_levels, epoch_order
from layerdescent.run.checkpoint import load_checkpoint, load_model_state, restore_run, rng_state, run_payload, save_checkpoint
from layerdescent.run.config import OnNonfinite, RunConfig, check_depth, check_steps
from layerdescent.run.evaluator import evaluate, evaluate_all, rows_satisfied
from layerdescent.run.guard import build_task, describe
from layerdescent.run.progress import evaluation_in_steps, progress_bar
from layerdescent.run.session import Session, build_session, epoch_steps
from layerdescent.run.tracking import check_trackers, open_trackers


@dataclass
class Position:
    """Where a run is: its epoch, micro-batch and step, and the best validation loss so far (early stopping)."""

    epoch: int = 0
    micro: int = 0  # micro-batches of this epoch already trained
    step: int = 0  # optimizer steps taken (and skipped)
    best_loss: float = math.inf  # the lowest last-layer validation loss so far
    best_epoch: int = -1
    best_val_loss: list[float] | None = None  # every layer's at best_epoch, for tuning and the reports

    @classmethod
    def restore(cls, saved: dict[str, Any]) -> Position:
        """The position a checkpoint recorded (a dict, as every checkpoint holds it)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in saved.items() if k in names})

    def saved(self) -> dict[str, Any]:
        """What a checkpoint records: a plain dict, with best_val_loss only once there is one (as before the dataclass)."""
        out = dataclasses.asdict(self)
        if out["best_val_loss"] is None:
            del out["best_val_loss"]
        return out


@dataclass
class _Loop:
    """What the training loop carries from step to step: the session, where it is, its step times and skips, its log and bar."""

    session: Session
    position: Position
    step_times: list[float] = field(default_factory=list)
    skipped_steps: int = 0
    log: Any = None
    bar: Any = None
    name: str = ""  # how progress lines name the run
    shown: bool = False  # whether this rank draws progress


class Trainer:
    """Trains one RunConfig into one run directory."""

    def __init__(self, config: RunConfig, run_dir: str | Path, registry: Registry | None = None) -> None:
        self.config = config
        self.run_dir = Path(run_dir)
        self.registry = registry or get_registry()
        self.who = describe(self.registry, config.task.name)
        self.task = build_task(self.registry, config.task.name, config.task.options)
        check_depth(config, self.task.num_layers, self.registry)
        self.checkpoint_path, self.best_path = self.run_dir / "checkpoint.pt", self.run_dir / "best.pt"

    def setup(self) -> Session:
        """Join the data-parallel world (if any), seed, build splits, model and the constrained update."""
        return build_session(self.config, self.task, self.registry)

    def fit(self, resume: bool = False) -> dict[str, Any]:
        """Train (or continue), evaluate on the gamma grid, write and return ``results.json``."""
        check_trackers(self.config.train, self.registry)
        with lock.claim(self.run_dir) as self._claim:
            try:
                session = self.setup()
                results = self._fit(session, resume)
            except OSError as exc:
                if exc.errno not in files.DISK_ERRNOS:
                    raise
                raise files.write_failure(self.run_dir, exc) from None
        session.world.close()  # on failure the ranks exit with their error; a barrier could hang
        return results

    def _fit(self, session: Session, resume: bool) -> dict[str, Any]:
        config, world = self.config, session.world
        check_steps(config.train, epoch_steps(len(session.rows["train"]), config.train)[1])
        rundir.prepare(self.run_dir, config, self.registry, resume, write=world.is_main)
        world.barrier()
        loop = self._open(session, resume)
        with self._failure_recorded(loop.position, world, "training"):
            try:
                while loop.position.epoch < config.train.epochs and not stopping.patience_spent(config.train, loop.position):
                    self._epoch(loop)
                    self._end_epoch(loop)
            finally:
                loop.bar.close()
                loop.log.close()
            if loop.step_times == [] and loop.skipped_steps:
                raise DivergenceError(
                    f"every one of the {loop.skipped_steps} training steps was skipped for a non-finite loss (train.on_nonfinite = 'skip'): "
                    f"nothing trained, so results.json was not written; see the 'skipped' lines of {self.run_dir / 'metrics.jsonl'} for the first cause"
                )
        with self._failure_recorded(loop.position, world, "evaluation"):
            results = self._test(loop)
        if world.is_main:
            self._trackers.close(results, self.run_dir)
        return results

    def _open(self, session: Session, resume: bool) -> _Loop:
        """The loop's state, from the checkpoint when resuming; the metrics log (cut back to it), the trackers and the progress bar opened."""
        config, train, world = self.config, self.config.train, session.world
        loop = _Loop(session, Position())
        metrics_file = self.run_dir / "metrics.jsonl"
        if resume and self.checkpoint_path.exists():
            state = load_checkpoint(self.checkpoint_path, self.task.name, kind="run")
            restore_run(self.checkpoint_path, state, session.model, session.update, world.rank, self.task.name, session.schedule)
            loop.position, loop.step_times = Position.restore(state["position"]), list(state["step_times"])
            loop.skipped_steps = int(state["skipped_steps"])
            if session.schedule is not None and "schedule" not in state:
                session.schedule.resume(loop.position.step)  # a checkpoint from before the schedule kept its state
            if world.is_main:
                rundir.rewind_log(metrics_file, self.checkpoint_path, state["metrics_offset"])
        # Line-buffered so that `tail -f metrics.jsonl` follows a run; only rank 0 writes.
        loop.log = files.open_log(metrics_file) if world.is_main else open(os.devnull, "w")
        self._trackers = open_trackers(config, self.run_dir, loop.position.step, self.registry, session.update.labels)
        # a bar on a terminal, a timed line every 30 s when stderr is a pipe (a demo or bench log)
        loop.name, loop.shown = f"{config.name} seed {config.seed}", train.progress and world.is_main
        after = evaluation_in_steps(
            len(session.rows[config.eval.split]),
            len(config.eval.gammas) * (1 + len(config.eval.domains)),
            train.batch_size * train.accumulate,
        )
        steps_per_epoch = epoch_steps(len(session.rows["train"]), train)[1]
        # the time left covers the evaluation
        loop.bar = progress_bar(train.epochs * steps_per_epoch, loop.position.step, loop.name, enabled=loop.shown, after=after)
        return loop

    def _epoch(self, loop: _Loop) -> None:
        """The optimizer steps left in this epoch, each logged, and checkpointed every train.checkpoint_every."""
        config, train, session, position = self.config, self.config.train, loop.session, loop.position
        train_set, update = session.rows["train"], session.update
        # batch_size is global: ranks split each batch, so a config means the same run however it
        # is launched, and a run resumes on another number of processes on the same trajectory.
        micro_per_epoch = epoch_steps(len(train_set), train)[0]
        micro_batches = epoch_order(config, position.epoch, len(train_set))
        levels = epoch_levels(config, position.epoch, len(micro_batches))
        while position.micro < micro_per_epoch:
            group = micro_batches[position.micro : position.micro + train.accumulate]
            group_levels = levels[position.micro : position.micro + train.accumulate]
            start = time.perf_counter()
            # a last-layer solver reads every layer on a log line's first step only, where the task can read the last alone
            done = self.step(session, group, position.step, full=update.line.steps == 0, levels=group_levels)
            if done.skipped:
                loop.log.write(
                    json.dumps({"event": "skipped", "epoch": position.epoch, "step": position.step, "reason": done.skipped}) + "\n"
                )
                loop.skipped_steps += 1
            else:
                loop.step_times.append(time.perf_counter() - start)
            if session.schedule is not None:
                session.schedule.step()
            position.micro += len(group)
            position.step += 1
            loop.bar.update(1)
            if update.line.steps >= train.log_every:
                self._log(loop.log, position, update)
            if train.checkpoint_every and position.step % train.checkpoint_every == 0:
                self._checkpoint(loop)

    def _end_epoch(self, loop: _Loop) -> None:
        """The epoch's dual step where the solver takes one, its log line, the validation (and early stopping's best model), a checkpoint."""
        config, train, session, position = self.config, self.config.train, loop.session, loop.position
        reason = session.update.end_epoch()
        if reason:
            raise diverged(f"end of epoch {position.epoch}: {reason}", self.checkpoint_path.exists())
        self._log(loop.log, position, session.update)
        if train.validate:
            val = evaluate(
                self.task,
                session.model,
                session.rows["validation"],
                [train.validation_gamma],
                config.eval.batch_size,
                config.eval.seed,
                session.world,
            )[0]
            record = {
                "event": "epoch",
                "epoch": position.epoch,
                "step": position.step,
                "val_loss": val["layer_loss"],
                "val_metrics": val["metrics"],
            }
            loop.log.write(json.dumps(record) + "\n")
            self._trackers.log(record)
            if stopping.improved(train, position, val["layer_loss"]) and session.world.is_main:
                # written before the checkpoint that records it, so a resume finds it
                save_checkpoint(self.best_path, {"task": self.task.name, "model": session.model.state_dict(), "epoch": position.epoch})
        position.epoch += 1
        position.micro = 0
        self._checkpoint(loop)

    def _checkpoint(self, loop: _Loop) -> None:
        """The log line so far and a checkpoint of everything a resume needs, on rank 0, once the claim on the directory is checked."""
        self._claim.check()  # a directory moved or unlocked under the run is no longer written
        session = loop.session
        self._log(loop.log, loop.position, session.update)
        loop.log.flush()
        rngs = session.world.gather(rng_state())
        if session.world.is_main:
            payload = run_payload(
                self.task.name,
                session.model,
                session.update,
                session.schedule,
                rngs,
                loop.position.saved(),
                loop.step_times,
                loop.skipped_steps,
                loop.log.tell(),
            )
            save_checkpoint(self.checkpoint_path, payload)

    def _test(self, loop: _Loop) -> dict[str, Any]:
        """The final (or best) model tested at every gamma and domain, and results.json written with the run's record."""
        config, train, session = self.config, self.config.train, loop.session
        model, world = session.model, session.world
        if train.early_stopping:
            world.barrier()  # rank 0 wrote best.pt
            self.load_model(self.best_path, model, load_checkpoint(self.best_path, self.task.name, kind="model")["model"])
        evaluation = self._evaluate(session, loop.position, loop.name, loop.shown)
        stopping.check_finite_results(evaluation, self.who)
        satisfied = rows_satisfied(
            self.task, model, session.rows["train"], train.band, session.update, config.eval.batch_size, config.eval.seed, world
        )
        results = finish.results_table(
            config, self.task, loop.position, loop.step_times, loop.skipped_steps, session.update, evaluation, satisfied
        )
        if world.is_main:
            self._claim.check()
            finish.finish(self.run_dir, model.state_dict(), results, train.keep_checkpoint, self.who)
        return results

    @contextlib.contextmanager
    def _failure_recorded(self, position: Position, world: World, stage: str) -> Iterator[None]:
        """Write failure.json when the block raises, so that `bench --status` says the run failed, where, and why."""
        try:
            yield
        except Exception as exc:
            if world.is_main and not self._claim.gone():  # a directory no longer this run's is not written
                rundir.save_failure(self.run_dir, position.epoch, position.step, exc, stage)
            raise

    def _evaluate(self, session: Session, position: Position, name: str, shown: bool) -> dict[str, Any]:
        """The final evaluation, each record saved as it is taken, so that a run interrupted here resumes at the next record."""
        config, world = self.config, session.world
        # the model evaluated is the one this position trained (or its best epoch), under this eval config
        key = {"step": position.step, "epoch": position.epoch, "eval": config.as_dict()["eval"]}
        done, dropped = rundir.partial_evaluation(self.run_dir, key, config.eval.gammas, config.eval.domains, self.task.num_layers)
        if dropped and world.is_main:
            print(f"layerdescent: {dropped}", file=sys.stderr, flush=True)
        if done and shown:
            taken = len(done.get("gammas", [])) + sum(len(r) for r in done.get("domains", {}).values())
            print(
                f"{name} evaluation: resumed after {taken} of {len(config.eval.gammas) * (1 + len(config.eval.domains))} records",
                file=sys.stderr,
                flush=True,
            )

        def save(partial: dict[str, Any]) -> None:
            if world.is_main:
                self._claim.check()
                rundir.save_partial_evaluation(self.run_dir, key, partial)

        return evaluate_all(
            self.task,
            session.model,
            session.rows[config.eval.split],
            config.eval,
            world,
            lambda total: progress_bar(total, 0, f"{name} evaluation", shown, unit="batch"),
            done,
            save,
        )

    def load_model(self, path: Path, model: torch.nn.Module, state: dict[str, Any]) -> None:
        """Load ``state`` into ``model``, or CheckpointError naming ``path`` when it belongs to another model."""
        load_model_state(path, model, state, self.task.name)

    def _log(self, log, position: Position, update: LayerwiseUpdate) -> None:
        """Write the update's log line since the last one (nothing when no step was taken since)."""
        if update.line.steps:
            record = {"event": "train", "epoch": position.epoch, "step": position.step, **update.record()}
            log.write(json.dumps(record) + "\n")
            self._trackers.log(record)

    def step(
        self, session: Session, group: Sequence[torch.Tensor], step: int, full: bool = True, levels: Sequence[int] | None = None
    ) -> Observation:
        """One optimizer step over micro-batches of training-row indices: what it observed over every rank, or why it was skipped.

        Each micro-batch is global: this rank trains on its shard, and the update averages the
        layer means over ranks once per step, before anything reads them, so every rank sees the
        same numbers and takes the same decision. ``full = False`` lets a solver that trains the
        last layer alone read it alone where the task offers that (``Task.last_layer_losses``);
        the other layers' means are then NaN.
        """
        update, train = session.update, self.config.train
        levels = list(levels) if levels is not None else [0] * len(group)
        session.model.zero_grad()
        session.backward(group, levels, full)
        # a scheme that evaluates the batch again (extragradient, or a dual pass after the primal step) re-runs the same micro-batches
        seen = update.step(closure=lambda: session.backward(group, levels))
        if seen.skipped and train.on_nonfinite != OnNonfinite.SKIP:
            raise diverged(f"step {step}: {seen.skipped}", self.checkpoint_path.exists())
        if seen.stop:
            raise diverged(f"step {step}: {seen.stop}", self.checkpoint_path.exists())
        return seen


def train(config: RunConfig, run_dir: str | Path, resume: bool = False, registry: Registry | None = None) -> dict[str, Any]:
    """Train ``config`` into ``run_dir`` and return its results (see the README for the schema)."""
    return Trainer(config, run_dir, registry).fit(resume=resume)
