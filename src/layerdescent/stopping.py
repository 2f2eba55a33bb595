"""When a run must stop: early stopping, non-finite losses and multipliers, the multiplier limit, and losses a constraint cannot take."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from layerdescent.errors import DataError, DivergenceError, PluginError

if TYPE_CHECKING:
    import torch

    from layerdescent.config import TrainConfig
    from layerdescent.trainer import Position
    from layerdescent.update import LayerwiseUpdate


def nonfinite(step: int, what: str, values: torch.Tensor, labels: list[str]) -> str | None:
    """Why ``values`` cannot be trained on (naming the step, the entry and the quantity), or None."""
    import torch

    if bool(torch.isfinite(values).all()):
        return None
    bad = int((~torch.isfinite(values)).nonzero().flatten()[0])
    return f"non-finite {what} at step {step}, {labels[bad]} = {values.flatten()[bad].item()}"


def diverged(reason: str) -> DivergenceError:
    """The error that stops a diverged run, with what to change."""
    return DivergenceError(f"{reason}; the last checkpoint is intact (lower train.lr or solver.dual_lr, or set train.grad_clip)")


def step_problem(
    who: str,
    step: int,
    means: torch.Tensor,
    violations: dict[str, torch.Tensor] | None,
    every_layer: bool,
    update: LayerwiseUpdate,
    labels: list[str],
) -> str | None:
    """Why a step's layer means (the last layer's alone, where it read only that) or violations cannot be trained on, or None.

    A PluginError when a constraint that assumes losses >= 0 sees a negative one: no setting fixes that.
    """
    import torch

    if every_layer:  # the usual case, in one test: every value finite and, where a constraint needs it, every mean >= 0
        fine = torch.isfinite(torch.cat([means, *violations.values()]) if violations else means).all()
        if update.problem.needs_nonnegative:
            fine = fine & (means >= 0).all()
        if bool(fine):
            return None
    reason = nonfinite(step, "loss", means if every_layer else means[-1:], labels if every_layer else labels[-1:])
    if not every_layer:
        return reason
    for name, value in (violations or {}).items():
        reason = reason or nonfinite(step, f"violation of constraint {name!r}", value, update.labels[name])
    if reason is None:
        check_nonnegative(who, step, means, update, labels)
    return reason


def multiplier_problem(update: LayerwiseUpdate, step: int) -> str | None:
    """Why the run must stop for its multipliers (one not finite, or past the solver's ``max_multiplier``), or None."""
    if not update.solver.enforces_constraints:
        return None  # its multipliers never move
    bound = update.solver.max_multiplier
    if bound is not None:  # the usual case, in one test: every multiplier at most the bound (NaN fails it too)
        import torch

        if bool(torch.stack([weight.detach().max() for weight in update.problem.multiplier_weights()]).le(bound).all()):
            return None
    for name, value in update.problem.multipliers().items():
        if bound is not None and bool((value <= bound).all()):  # one test per step: NaN fails it too, and is told apart below
            continue
        reason = nonfinite(step, f"multiplier of constraint {name!r}", value, update.labels[name])
        if reason is None and bound is not None and bool((value > bound).any()):
            entry = int((value > bound).nonzero()[0])
            reason = f"multiplier of constraint {name!r} exploded at step {step}, {update.labels[name][entry]} = {value[entry].item():.4g} > solver.max_multiplier = {bound:g}"
        if reason:
            return reason
    return None


def check_nonnegative(who: str, step: int, means: torch.Tensor, update: LayerwiseUpdate, labels: list[str]) -> None:
    """Raise PluginError when a constraint that assumes losses >= 0 (descent's (1 - alpha) margin) sees a negative one."""
    needing = update.problem.needs_nonnegative
    if needing and bool((means < 0).any()):
        k = int((means < 0).nonzero()[0])
        spec = needing[0]
        raise PluginError(
            f"{who}: layer_losses returned a negative mean loss at step {step}, {labels[k]} = {means[k].item():.4g}; "
            f"constraint {spec.name!r} ({spec.kind}) needs losses >= 0 (its margin scales the previous layer's loss): shift the loss, or use a bound"
        )


def check_finite_results(evaluation: dict[str, Any], who: str) -> None:
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


def patience_spent(train: TrainConfig, position: Position) -> bool:
    """Whether early stopping has seen ``train.early_stopping`` epochs without a better validation loss."""
    return bool(train.early_stopping) and position.epoch - 1 - position.best_epoch >= train.early_stopping


def improved(train: TrainConfig, position: Position, val_loss: list[float]) -> bool:
    """Record a new best last-layer validation loss in ``position``; True when it is one (early stopping keeps its model)."""
    if not train.early_stopping or val_loss[-1] >= position.best_loss:
        return False
    position.best_loss, position.best_epoch = val_loss[-1], position.epoch
    position.best_val_loss = val_loss  # every layer's, for tuning and the reports
    return True
