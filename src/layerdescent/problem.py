"""The run's constraint specs compiled into one Cooper CMP, with multipliers and a dual optimizer.

Cooper's sharp edges stay here: constraints register by attribute after ``super().__init__()``,
each spec gets a ``DenseMultiplier`` sized to its violation vector, the dual optimizer has
``maximize=True`` and its parameters in registration order, and resilience (a quadratic
relaxation cost (c/2)||u||^2) is the dual weight decay 1/c, its exact closed form (u = lambda / c).
"""

from __future__ import annotations

from typing import Any

import cooper
import torch

from layerdescent.constraints import ConstraintSpec
from layerdescent.errors import PluginError


class _LayerwiseCMP(cooper.ConstrainedMinimizationProblem):
    """A CMP whose states are built from layer losses by :class:`LayerwiseProblem`."""

    def compute_cmp_state(self, *args: Any, **kwargs: Any) -> cooper.CMPState:
        raise NotImplementedError("LayerwiseProblem builds CMP states from layer losses directly")


class LayerwiseProblem:
    """Constraints on the per-layer mean losses, as one Cooper CMP."""

    def __init__(self, specs: tuple[ConstraintSpec, ...], num_layers: int) -> None:
        self.specs = specs
        self.num_layers = num_layers
        self.cmp = _LayerwiseCMP()
        self.labels: dict[str, list[str]] = {}
        for spec in specs:
            self.labels[spec.name] = spec.labels(num_layers)
            multiplier = cooper.multipliers.DenseMultiplier(num_constraints=len(self.labels[spec.name]))
            setattr(self.cmp, spec.name, cooper.Constraint(cooper.ConstraintType.INEQUALITY, multiplier=multiplier))
        self.state: dict[str, dict[str, torch.Tensor]] | None = None

    def dual_optimizer(self, kind: str, lr: float, kp: float = 1.0, ki: float = 1.0, ema: float = 0.0) -> torch.optim.Optimizer:
        """SGD or nuPI ascent on the multipliers; resilient specs get weight decay 1/c."""
        groups = [
            {"params": [self.constraint(spec).multiplier.weight], "weight_decay": 1.0 / spec.resilience if spec.resilience else 0.0}
            for spec in self.specs
        ]
        if kind == "nupi":
            return cooper.optim.nuPI(groups, lr=lr, Kp=kp, Ki=ki, ema_nu=ema, maximize=True)
        return torch.optim.SGD(groups, lr=lr, maximize=True)

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

    def primal_state(self, loss: torch.Tensor, violations: dict[str, torch.Tensor]) -> cooper.CMPState:
        """The Cooper CMPState whose primal Lagrangian the model's optimizer descends."""
        observed = {
            self.constraint(spec): cooper.ConstraintState(violation=violations[spec.name], contributes_to_dual_update=False)
            for spec in self.specs
        }
        return cooper.CMPState(loss=loss, observed_constraints=observed)

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
