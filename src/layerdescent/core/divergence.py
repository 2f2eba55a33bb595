"""Why a step cannot go on: non-finite losses, violations and multipliers, the multiplier limit, and losses a constraint cannot take."""

from __future__ import annotations

from typing import TYPE_CHECKING

from layerdescent.errors import DivergenceError, PluginError

if TYPE_CHECKING:  # solvers import this module where torch is not yet loaded (the registry, `layerdescent list`)
    import torch

    from layerdescent.core.observation import Observation
    from layerdescent.core.problem import LayerwiseProblem


def nonfinite(what: str, values: torch.Tensor, labels: list[str]) -> str | None:
    """Why ``values`` cannot be trained on (naming the entry and the quantity), or None."""
    import torch

    if bool(torch.isfinite(values).all()):
        return None
    bad = int((~torch.isfinite(values)).nonzero().flatten()[0])
    return f"non-finite {what}, {labels[bad]} = {values.flatten()[bad].item()}"


def diverged(reason: str, checkpoint: bool | None = None) -> DivergenceError:
    """The error that stops a diverged run, with what to change, and whether a checkpoint is there to go back to (None: the loop keeps its own)."""
    saved = {True: "; the last checkpoint is intact", False: "; no checkpoint was written before it", None: ""}[checkpoint]
    return DivergenceError(f"{reason}{saved} (lower train.lr or solver.dual_lr, or set train.grad_clip)")


def why_not_finite(seen: Observation, constraint_labels: dict[str, list[str]]) -> str | None:
    """The first non-finite value a step would train on: a layer mean (the last layer's alone, where the step read only that), then a violation."""
    labels = [f"l{k}" for k in range(len(seen.means))]
    if not seen.every_layer:
        return nonfinite("loss", seen.means[-1:], labels[-1:])
    reason = nonfinite("loss", seen.means, labels)
    for name, value in (seen.violations or {}).items():
        reason = reason or nonfinite(f"violation of constraint {name!r}", value, constraint_labels[name])
    return reason


def multiplier_problem(problem: LayerwiseProblem, bound: float | None) -> str | None:
    """Why the run must stop for its multipliers (one not finite, or above ``bound``, the solver's ``max_multiplier``), or None."""
    for name, value in problem.multipliers().items():
        if bound is not None and bool((value <= bound).all()):  # NaN fails it too, and is told apart below
            continue
        reason = nonfinite(f"multiplier of constraint {name!r}", value, problem.labels[name])
        if reason is None and bound is not None and bool((value > bound).any()):
            entry = int((value > bound).nonzero()[0])
            reason = f"multiplier of constraint {name!r} exploded, {problem.labels[name][entry]} = {value[entry].item():.4g} > solver.max_multiplier = {bound:g}"
        if reason:
            return reason
    return None


def check_nonnegative(who: str, means: torch.Tensor, problem: LayerwiseProblem) -> None:
    """Raise PluginError when a constraint that assumes losses >= 0 (descent's (1 - alpha) margin) sees a negative mean loss."""
    import torch

    needing = problem.needs_nonnegative
    negative = (means < 0) & torch.isfinite(means)  # a non-finite mean is the step's to skip, not the plugin's fault
    if needing and bool(negative.any()):
        k = int(negative.nonzero()[0])
        label = f"l{k}" if len(means) > 1 else f"l{problem.num_layers}"  # a last-layer-only read
        spec = needing[0]
        raise PluginError(
            f"{who}: layer_losses returned a negative mean loss, {label} = {means[k].item():.4g}; "
            f"constraint {spec.name!r} ({spec.kind}) needs losses >= 0 (its margin scales the previous layer's loss): shift the loss, or use a bound"
        )
