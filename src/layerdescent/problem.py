"""The run's constraint specs compiled into one Cooper CMP, with multipliers, penalties and a dual optimizer.

Cooper's sharp edges stay here: constraints register by attribute after ``super().__init__()``,
each spec gets a ``DenseMultiplier`` sized to its violation vector, the dual optimizer has
``maximize=True`` and its parameters in registration order, and resilience (a quadratic
relaxation cost (c/2)||u||^2) is the dual weight decay 1/c, its exact closed form (u = lambda / c).
"""

from __future__ import annotations

from typing import Any, Callable

import cooper
import torch

from layerdescent.constraints import ConstraintSpec
from layerdescent.errors import PluginError


class ExtraSGD(cooper.optim.ExtraSGD):
    """Cooper's ExtraSGD, able to load a saved state (cooper-optim 1.0.1's ``__setstate__`` calls ``super(torch.optim.SGD, self)``, which fails)."""

    def __setstate__(self, state: dict) -> None:
        torch.optim.Optimizer.__setstate__(self, state)
        for group in self.param_groups:
            group.setdefault("nesterov", False)


class _LayerwiseCMP(cooper.ConstrainedMinimizationProblem):
    """The layerwise problem as a Cooper CMP: layer means in, the objective and every spec's violation out."""

    def __init__(self, problem: "LayerwiseProblem") -> None:
        super().__init__()
        self._problem = problem

    def compute_cmp_state(self, layer_losses: Any, primal: bool = True, dual: bool = True) -> cooper.CMPState:
        """The CMPState of B x (L+1) layer losses or their L+1 means (or a callable returning them, as ``roll()`` passes).

        The loss is the solver's objective; ``primal = False`` (a dual pass) leaves it out and
        ``dual = False`` leaves the dual update to a pass of its own (the window of ``dual_every``).
        """
        means = layer_losses() if callable(layer_losses) else layer_losses
        if means.dim() == 2:
            means = means.mean(dim=0)
        violations = self._problem.violations(means)
        observed = {
            self._problem.constraint(spec): cooper.ConstraintState(violation=violations[spec.name], contributes_to_primal_update=primal, contributes_to_dual_update=dual)
            for spec in self._problem.specs
        }
        return cooper.CMPState(loss=self._problem.objective(means) if primal else None, observed_constraints=observed)


class LayerwiseProblem:
    """Constraints on the per-layer mean losses, as one Cooper CMP."""

    def __init__(self, specs: tuple[ConstraintSpec, ...], num_layers: int, augmented: bool = False, rho: float = 1.0, growth: float = 1.0, tolerance: float = 1e-4) -> None:
        self.specs = specs
        self.num_layers = num_layers
        self.cmp = _LayerwiseCMP(self)
        self.labels: dict[str, list[str]] = {}
        for spec in specs:
            self.labels[spec.name] = spec.labels(num_layers)
            size = len(self.labels[spec.name])
            multiplier = cooper.multipliers.DenseMultiplier(num_constraints=size)
            extra: dict[str, Any] = {}
            if augmented:  # Cooper's augmented Lagrangian: a penalty rho per entry beside lambda
                extra = {"formulation_type": cooper.formulations.AugmentedLagrangian, "penalty_coefficient": cooper.penalty_coefficients.DensePenaltyCoefficient(torch.full((size,), rho))}
            setattr(self.cmp, spec.name, cooper.Constraint(cooper.ConstraintType.INEQUALITY, multiplier=multiplier, **extra))
        self._growth = cooper.penalty_coefficients.MultiplicativePenaltyCoefficientUpdater(growth, tolerance, has_restart=False) if augmented and growth > 1 else None
        self.state: dict[str, dict[str, torch.Tensor]] | None = None
        self.objective: Callable[[torch.Tensor], torch.Tensor] = lambda means: means[-1]  # the solver's, once it has one

    def dual_optimizer(self, kind: str, lr: float, kp: float = 1.0, ki: float = 1.0, ema: float = 0.0) -> torch.optim.Optimizer:
        """SGD or nuPI ascent on the multipliers; resilient specs get weight decay 1/c."""
        groups = [
            {"params": [self.constraint(spec).multiplier.weight], "weight_decay": 1.0 / spec.resilience if spec.resilience else 0.0}
            for spec in self.specs
        ]
        if kind == "nupi":
            return cooper.optim.nuPI(groups, lr=lr, Kp=kp, Ki=ki, ema_nu=ema, maximize=True)
        if kind == "extra-sgd":
            return ExtraSGD(groups, lr=lr, maximize=True)
        return torch.optim.SGD(groups, lr=lr, maximize=True)

    def dual_gradient(self, state: cooper.CMPState) -> None:
        """Put the gradient of Cooper's dual Lagrangian on each multiplier, replacing any there: the strict violation it observed."""
        # Both formulations' dual Lagrangian is lambda . g.detach() (Cooper's compute_dual_weighted_violation),
        # so its gradient in lambda is g itself; written directly it skips an autograd pass that cost
        # a small model 5% of its step. A test checks it against compute_dual_lagrangian().backward().
        for constraint, observed in state.observed_constraints.items():
            constraint.multiplier.weight.grad = observed.extract_violations()[1].clone()

    def grow_penalties(self, state: cooper.CMPState) -> None:
        """Grow the augmented Lagrangian's rho where a dual pass saw a violation above the tolerance."""
        if self._growth is not None:
            self._growth.step(state.observed_constraints)

    def penalties(self) -> dict[str, torch.Tensor]:
        """The augmented Lagrangian's current rho of each spec (empty for the plain Lagrangian)."""
        return {spec.name: self.constraint(spec).penalty_coefficient.value.detach() for spec in self.specs if self.constraint(spec).penalty_coefficient is not None}

    def constraint(self, spec: ConstraintSpec) -> cooper.Constraint:
        """The Cooper constraint compiled from ``spec``."""
        return getattr(self.cmp, spec.name)

    def start(self, means: torch.Tensor) -> None:
        """Fix what specs take from the first training batch (anchors), once per run."""
        if self.state is None:
            self.state = {spec.name: spec.initial_state(means.detach()) for spec in self.specs}

    def violations(self, means: torch.Tensor) -> dict[str, torch.Tensor]:
        """Each spec's violation vector for these layer means (differentiable)."""
        self.start(means)
        out = {}
        for spec in self.specs:
            violation = spec.violation(means, self.state[spec.name])
            # Cooper would silently broadcast a multiplier over a violation of another size.
            if violation.shape != (len(self.labels[spec.name]),):
                raise PluginError(
                    f"constraint {spec.name!r} ({spec.kind}) returned a violation of shape {tuple(violation.shape)}; "
                    f"its labels() promise {len(self.labels[spec.name])} entries"
                )
            out[spec.name] = violation
        return out

    def multipliers(self) -> dict[str, torch.Tensor]:
        """Current lambda of each spec."""
        return {spec.name: self.constraint(spec).multiplier.weight.detach() for spec in self.specs}

    def relaxations(self) -> dict[str, torch.Tensor]:
        """The optimal relaxation u = lambda / c of each resilient spec."""
        return {
            spec.name: self.constraint(spec).multiplier.weight.detach() / spec.resilience
            for spec in self.specs
            if spec.resilience
        }

    def state_dict(self) -> dict[str, Any]:
        """Multipliers and per-spec state, for checkpoints."""
        return {"cmp": self.cmp.state_dict(), "state": self.state}

    @property
    def device(self) -> torch.device:
        """Where the multipliers live."""
        return next((m.device for m in self.cmp.multipliers()), torch.device("cpu"))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` saved."""
        self.cmp.load_state_dict(state["cmp"])
        saved = state["state"]
        self.state = None if saved is None else {name: {k: v.to(self.device) for k, v in tensors.items()} for name, tensors in saved.items()}
