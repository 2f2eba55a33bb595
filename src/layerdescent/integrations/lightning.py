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
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import torch

from layerdescent.core.constraints import ConstraintSpec
from layerdescent.core.divergence import diverged
from layerdescent.core.grouping import LayerBatch
from layerdescent.core.update import LayerwiseUpdate
from layerdescent.errors import CheckpointError, ConfigError, PluginError
from layerdescent.optional import require
from layerdescent.options import build_solver_options
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
        registry = registry or get_registry()
        self._width = num_layers + 1
        _check(tuple(constraints), num_layers, solver, registry, options)
        # the update, once Lightning has built the optimizer it wraps
        self._new_update = functools.partial(
            LayerwiseUpdate, tuple(constraints), num_layers, solver=solver, registry=registry, band=tuple(band), rows=rows, **options
        )
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
        if self.update is None:
            self.update = self._new_update(optimizer=optimizer).to(self.device)
        if self._saved is not None:
            self.update.load_state_dict(self._saved)
            self._saved = None

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
        self.log_dict(update.scalars(), on_step=True, on_epoch=False)  # the layer means are over every rank already
        return loss.detach()

    def _backward(self, batch: Any, batch_idx: int) -> torch.Tensor | None:
        """The primal loss of ``batch``'s layer losses, backpropagated through Lightning's precision and strategy."""
        out = self.layer_losses(batch, batch_idx)
        losses, where = (out.losses, {"rows": out.rows, "levels": out.levels}) if isinstance(out, LayerBatch) else (out, {})
        width = self._width
        if not isinstance(losses, torch.Tensor) or losses.dim() != 2 or losses.shape[1] != width or not losses.is_floating_point():
            got = f"shape {tuple(losses.shape)} of {losses.dtype}" if isinstance(losses, torch.Tensor) else type(losses).__name__
            raise PluginError(
                f"{type(self).__name__}.layer_losses returned {got}; it must return B x {width} floating-point per-sample losses (num_layers = {width - 1}, plus the input's column 0)"
            )
        loss = self.update.forward(losses.float(), **where)  # the multipliers and means are float32, whatever the precision
        if loss is not None and loss.requires_grad:  # a pass under no_grad (alternating-primal-dual's dual pass) only counts
            self.manual_backward(loss)
        return loss

    def on_train_epoch_end(self) -> None:
        """The dual step of ``dual_every = "epoch"``; nothing for the others."""
        reason = self.update.end_epoch()
        if reason:
            raise diverged(f"end of epoch {self.current_epoch}: {reason}")

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


def _check(constraints: tuple, num_layers: int, solver: str, registry: Registry, options: dict[str, Any]) -> None:
    """Refuse what cannot train before Lightning starts: bad constraints, solver or options."""
    for spec in constraints:
        if not isinstance(spec, ConstraintSpec):
            raise ConfigError(f"constraints must be ConstraintSpec objects such as layerdescent.Descent(alpha=0.05), got {spec!r}")
    solver_cls = registry.solver(solver)
    problems = solver_cls.check(build_solver_options(solver_cls, options, registry), num_layers, constraints)
    if problems:
        raise ConfigError("\n".join(problems))
