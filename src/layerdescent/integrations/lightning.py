"""Descent constraints in a Lightning ``LightningModule``: the module's per-sample layer losses in, the constrained step through manual optimization.

    class Model(DescentModule):
        def __init__(self):
            super().__init__([Descent(alpha=0.05)], num_layers=4, dual_lr=0.5)
            self.blocks = ...

        def layer_losses(self, batch, batch_idx):      # B x (L+1) per-sample losses, column 0 the input's
            ...

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-2)

    lightning.pytorch.Trainer(max_epochs=5).fit(Model(), loader)

The step is :class:`~layerdescent.core.update.LayerwiseUpdate`'s, the one the project's own trainer
and a loop of one's own take, built around the optimizer ``configure_optimizers`` returns: Lightning's
optimizer wrapper takes the model's step, so its precision plugins, strategies and step count
apply. Under ``strategy="ddp"`` DDP averages the gradients and the update averages the layer means
over ranks once per step, so the multipliers are the same on every rank. The multipliers, the dual
optimizer and the solver's state ride in Lightning's checkpoints (``checkpoint["layerdescent"]``);
``Trainer.fit(..., ckpt_path=...)`` resumes them exactly.

:class:`DescentCallback` adds the same constraints to any ``LightningModule`` under automatic
optimization, without a subclass: its ``training_step`` returns the B x (L+1) per-layer losses
(or a dict holding them under ``"layer_losses"``), the callback makes the loss Lightning
backpropagates the primal Lagrangian and steps the multipliers after each optimizer step, so
schedulers, ``accumulate_grad_batches``, ``gradient_clip_val``, precision plugins and strategies
apply as they do to any module. Two-pass schemes (``alternating-primal-dual``, ``extrapolation``)
need the closure only manual optimization gives: :class:`DescentModule`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch

from layerdescent.core.constraints import ConstraintSpec
from layerdescent.core.divergence import diverged
from layerdescent.core.grouping import LayerBatch
from layerdescent.core.update import LayerwiseUpdate, checked_solver
from layerdescent.errors import CheckpointError, ConfigError, PluginError
from layerdescent.optional import require
from layerdescent.options import plain
from layerdescent.registry import Registry, get_registry

require("lightning", extra="lightning", purpose="layerdescent.DescentModule")
import lightning.pytorch as pl  # noqa: E402  (after the check that names the extra)

STATE_KEY = "layerdescent"  # the update's state in a Lightning checkpoint


class DescentModule(pl.LightningModule):
    """A ``LightningModule`` whose every layer must lower the loss: write ``layer_losses`` and ``configure_optimizers``; the constrained step is taken here."""

    def __init__(
        self,
        constraints: Sequence[ConstraintSpec],
        num_layers: int,
        solver: str = "primal-dual",
        registry: Registry | None = None,
        band: Sequence[float] = (),
        rows: int | None = None,
        **options: Any,
    ) -> None:
        super().__init__()
        self.automatic_optimization = False  # the update takes the step: the primal one through Lightning's optimizer, then lambda's
        self._width = num_layers + 1
        # the update, once Lightning has built the optimizer it wraps
        self._new_update, self._hyperparameters, _ = _prepared(constraints, num_layers, solver, registry, band, rows, options)
        self.update: LayerwiseUpdate | None = None  # built around the optimizer configure_optimizers returns, when training starts
        self._saved: dict[str, Any] | None = None  # a checkpoint's update state, until the update exists

    def layer_losses(self, batch: Any, batch_idx: int) -> torch.Tensor | LayerBatch:
        """B x (L+1) per-sample losses of ``batch`` at every layer, column 0 the input's; a ``LayerBatch`` where constraints are held per level or per sample."""
        raise NotImplementedError(f"{type(self).__name__} must define layer_losses(batch, batch_idx): the B x (L+1) per-sample losses")

    def on_train_start(self) -> None:
        """Build the update around Lightning's optimizer, and restore a checkpoint's multipliers into it."""
        optimizer = self.optimizers()
        if isinstance(optimizer, list):
            raise ConfigError(
                f"{type(self).__name__}.configure_optimizers returned {len(optimizer)} optimizers; DescentModule steps one: put every parameter group in one optimizer"
            )
        for config in self.trainer.lr_scheduler_configs:
            if isinstance(config.scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
                raise ConfigError(
                    f"{type(self).__name__}.configure_optimizers returned ReduceLROnPlateau, which reads a monitored metric that DescentModule's manual steps do not pass: train with DescentCallback (automatic optimization steps it) or use a scheduler of steps or epochs"
                )
        if self.update is None:
            self.update = self._new_update(optimizer=optimizer).to(self.device)
        if self._saved is not None:
            self.update.load_state_dict(self._saved)
            self._saved = None
        log_hyperparameters(self.trainer, self._hyperparameters)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        """One constrained step on ``batch``: the primal Lagrangian backpropagated through Lightning, the model's step, then the multipliers'."""
        update = self.update
        update.zero_grad()
        loss = self._backward(batch, batch_idx)
        seen = update.step(lambda: self._backward(batch, batch_idx))  # the closure: schemes that read the batch twice
        if seen.stop:
            raise diverged(f"step {self.global_step}: {seen.stop}")
        if seen.skipped:  # a non-finite loss: the step was not taken, and says which value
            self.log("skipped", 1.0, on_step=True, on_epoch=False)
        else:
            self._step_schedulers("step", self.global_step)  # Lightning steps no scheduler under manual optimization
        log_line(self, update, loss)
        return loss.detach()

    def _step_schedulers(self, interval: str, count: int) -> None:
        """Step each scheduler ``configure_optimizers`` returned whose interval this is, every ``frequency`` of them."""
        for config in self.trainer.lr_scheduler_configs:
            if config.interval == interval and count % config.frequency == 0:
                config.scheduler.step()

    def _backward(self, batch: Any, batch_idx: int) -> torch.Tensor | None:
        """The primal loss of ``batch``'s layer losses, backpropagated through Lightning's precision and strategy."""
        losses, where = layer_table(self.layer_losses(batch, batch_idx), self._width, f"{type(self).__name__}.layer_losses")
        loss = self.update.forward(losses.float(), **where)  # the multipliers and means are float32, whatever the precision
        if loss is not None and loss.requires_grad:  # a pass under no_grad (alternating-primal-dual's dual pass) only counts
            self.manual_backward(loss)
        return loss

    def on_train_epoch_end(self) -> None:
        """The dual step of ``dual_every = "epoch"``; nothing for the others."""
        reason = self.update.end_epoch()
        if reason:
            raise diverged(f"end of epoch {self.current_epoch}: {reason}")
        self._step_schedulers("epoch", self.current_epoch + 1)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """The multipliers, dual optimizer and solver state beside Lightning's own (which holds the model's optimizer)."""
        state = self.update.state_dict(primal=False) if self.update is not None else self._saved
        if state is not None:
            checkpoint[STATE_KEY] = state

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Keep the checkpoint's update state until the update is built (Lightning restores checkpoints before it builds optimizers)."""
        if STATE_KEY not in checkpoint:
            raise CheckpointError(
                f"the checkpoint holds no {STATE_KEY!r} entry: it was not saved by a DescentModule, so its multipliers are unknown; resume from one a DescentModule saved, or load its weights alone (load_state_dict)"
            )
        self._saved = checkpoint[STATE_KEY]


class DescentCallback(pl.Callback):
    """Descent constraints for any ``LightningModule`` under automatic optimization: its ``training_step`` returns the per-layer losses, the callback does the rest."""

    def __init__(
        self,
        constraints: Sequence[ConstraintSpec],
        num_layers: int,
        solver: str = "primal-dual",
        registry: Registry | None = None,
        band: Sequence[float] = (),
        rows: int | None = None,
        key: str = "layer_losses",
        progress_bar: bool = False,
        **options: Any,
    ) -> None:
        self._new_update, self._hyperparameters, (solver_cls, settings) = _prepared(
            constraints, num_layers, solver, registry, band, rows, options
        )
        solver_cls.scheme_of(settings).check_outside_primal(
            "DescentCallback steps the multipliers after Lightning's own optimizer step", "subclass layerdescent.DescentModule for it"
        )
        self._width, self.key, self.progress_bar = num_layers + 1, key, progress_bar
        self.update: LayerwiseUpdate | None = None  # built around the module's optimizer when training starts
        self._saved: dict[str, Any] | None = None  # a checkpoint's update state, until the update exists
        self._loss: torch.Tensor | None = None  # the step's Lagrangian, for its log line
        self._global_step = 0  # Lightning's step count before the batch: a change after it means the optimizer stepped
        self._scale: float | None = None  # fp16's loss scale before the batch

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Route the module's ``training_step`` through the Lagrangian (automatic optimization only)."""
        if stage != "fit":
            return
        if isinstance(pl_module, DescentModule) or not pl_module.automatic_optimization:
            raise ConfigError(
                f"DescentCallback works with Lightning's automatic optimization; {type(pl_module).__name__} optimizes manually: drop the callback (a DescentModule takes the constrained step itself) or set automatic_optimization = True"
            )
        # An instance attribute: Lightning calls the module's training_step by name (through DDP's wrapper too)
        pl_module.training_step = functools.partial(self._training_step, type(pl_module).training_step.__get__(pl_module))

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Give the module back its own ``training_step``."""
        pl_module.__dict__.pop("training_step", None)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Build the update around the module's one optimizer, and restore a checkpoint's multipliers into it."""
        if len(trainer.optimizers) != 1:
            raise ConfigError(
                f"{type(pl_module).__name__}.configure_optimizers returned {len(trainer.optimizers)} optimizers; DescentCallback steps with one: put every parameter group in one optimizer"
            )
        if self.update is None:
            self.update = self._new_update(optimizer=trainer.optimizers[0]).to(pl_module.device)
        if self._saved is not None:
            self.update.load_state_dict(self._saved)
            self._saved = None
        log_hyperparameters(trainer, self._hyperparameters)

    def _training_step(self, step: Callable[..., Any], batch: Any, batch_idx: int, *args: Any, **kwargs: Any) -> Any:
        """The module's step, its per-layer losses turned into the primal Lagrangian that Lightning backpropagates."""
        out = step(batch, batch_idx, *args, **kwargs)
        found = out.get(self.key) if isinstance(out, dict) else out
        losses, where = layer_table(found, self._width, f"{type(step.__self__).__name__}.training_step", self.key)
        trainer = step.__self__.trainer
        # the means of the micro-batches of one optimizer step, each its share (Lightning divides the loss by the same count)
        weight = 1.0 / _window(trainer, batch_idx)
        self._loss = self.update.forward(losses.float(), weight, **where)  # float32 multipliers and means, whatever the precision
        return {**out, "loss": self._loss} if isinstance(out, dict) else self._loss

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int) -> None:
        self._global_step, self._scale = trainer.global_step, _scale(trainer)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        """After an optimizer step, the multipliers' step from its layer means (averaged over ranks), and its log line."""
        if trainer.global_step == self._global_step:  # accumulating: no optimizer step yet
            return
        if self._scale is not None and _scale(trainer) < self._scale:
            self.update.discard()  # fp16's scaler found inf gradients and left the model as it was: lambda waits too
            return
        seen = self.update.dual_step()  # a step whose means are not finite moves no multiplier (seen.skipped)
        if seen.stop:
            raise diverged(f"step {trainer.global_step}: {seen.stop}")
        log_line(pl_module, self.update, self._loss, self.progress_bar)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """The dual step of ``dual_every = "epoch"``; nothing for the others."""
        reason = self.update.end_epoch()
        if reason:
            raise diverged(f"end of epoch {trainer.current_epoch}: {reason}")

    def state_dict(self) -> dict[str, Any]:
        """The multipliers, dual optimizer and solver state (Lightning's checkpoint holds the model's optimizer)."""
        state = self.update.state_dict(primal=False) if self.update is not None else self._saved
        return {STATE_KEY: state} if state is not None else {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Keep the checkpoint's update state until the update is built (Lightning restores callbacks before it builds optimizers)."""
        self._saved = state_dict.get(STATE_KEY)

    def on_load_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]) -> None:
        """Refuse a checkpoint without the multipliers: resuming would restart them at 0 without a word."""
        if not checkpoint.get("callbacks", {}).get(self.state_key, {}).get(STATE_KEY):
            raise CheckpointError(
                "the checkpoint holds no DescentCallback state: it was not saved with this callback, so its multipliers are unknown; resume from one saved with DescentCallback, or load its weights alone (load_state_dict)"
            )


def layer_table(out: Any, width: int, who: str, key: str = "layer_losses") -> tuple[torch.Tensor, dict[str, Any]]:
    """The B x (L+1) losses (and, from a ``LayerBatch``, each row's index and level) a module returned, or one PluginError line."""
    losses, where = (out.losses, {"rows": out.rows, "levels": out.levels}) if isinstance(out, LayerBatch) else (out, {})
    if not isinstance(losses, torch.Tensor) or losses.dim() != 2 or losses.shape[1] != width or not losses.is_floating_point():
        got = f"shape {tuple(losses.shape)} of {losses.dtype}" if isinstance(losses, torch.Tensor) else type(losses).__name__
        raise PluginError(
            f"{who} returned {got}; it must return B x {width} floating-point per-sample losses (num_layers = {width - 1}, plus the input's column 0), or a dict holding them under {key!r}"
        )
    return losses, where


def log_line(module: pl.LightningModule, update: LayerwiseUpdate, loss: torch.Tensor | None, progress_bar: bool = False) -> None:
    """One step's named values (``line_scalars``' vocabulary) per step and as epoch means; the Lagrangian as ``train/lagrangian``."""
    values = update.scalars()  # the layer means are over every rank already
    shown = {k: v for k, v in values.items() if progress_bar and k.startswith("train/lambda/")}
    module.log_dict({k: v for k, v in values.items() if k not in shown}, on_step=True, on_epoch=True)
    if shown:
        module.log_dict(shown, on_step=True, on_epoch=True, prog_bar=True)
    if loss is not None:
        module.log("train/lagrangian", loss.detach(), on_step=True, on_epoch=True, prog_bar=True)


def hyperparameters(constraints: Sequence[ConstraintSpec], num_layers: int, solver: str, band: Sequence[float], options: dict) -> dict:
    """The constraint and solver settings, as a logger records hyperparameters."""
    specs = [{"kind": spec.kind, **{k: plain(v) for k, v in dataclasses.asdict(spec).items()}} for spec in constraints]
    return {"layerdescent": {"constraints": specs, "num_layers": num_layers, "solver": solver, "band": list(band), **options}}


def log_hyperparameters(trainer: pl.Trainer, values: dict) -> None:
    """Record the settings with every logger the trainer has (TensorBoard's hparams, W&B's config, ...)."""
    for logger in trainer.loggers:
        logger.log_hyperparams(values)


def _window(trainer: pl.Trainer, batch_idx: int) -> int:
    """The micro-batches of the optimizer step ``batch_idx`` belongs to (the epoch's last may be short)."""
    every = trainer.accumulate_grad_batches
    total = trainer.num_training_batches
    start = batch_idx - batch_idx % every
    return max(1, min(every, int(total) - start)) if total != float("inf") else every


def _scale(trainer: pl.Trainer) -> float | None:
    """fp16's loss scale (None without a scaler): the scaler lowers it exactly when it skips a step for inf gradients."""
    scaler = getattr(trainer.precision_plugin, "scaler", None)
    return float(scaler.get_scale()) if scaler is not None and scaler.is_enabled() else None


def _prepared(
    constraints: Sequence[ConstraintSpec],
    num_layers: int,
    solver: str,
    registry: Registry | None,
    band: Sequence[float],
    rows,
    options: dict,
) -> tuple[Callable[..., LayerwiseUpdate], dict, tuple[type, Any]]:
    """What either front checks before Lightning starts: the update to build once the optimizer exists, the settings as hyperparameters, and the solver's class and options."""
    registry = registry or get_registry()
    checked = checked_solver(constraints, num_layers, solver, registry, options)
    update = functools.partial(
        LayerwiseUpdate, tuple(constraints), num_layers, solver=solver, registry=registry, band=tuple(band), rows=rows, **options
    )
    return update, hyperparameters(constraints, num_layers, solver, band, options), checked
