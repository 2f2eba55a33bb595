"""The three ways a run turns layer losses into updates, all driven through Cooper optimizers.

- ``erm``: minimize the last layer's loss; constraints are measured and logged, never enforced.
- ``penalty``: minimize fixed weights times the layer losses (deep supervision).
- ``primal-dual``: minimize the Lagrangian in the model, ascend it in the multipliers.

Cooper's ``roll()`` is not used: calling its pieces leaves room for gradient accumulation and
clipping between the backward pass and the primal step.
"""

from __future__ import annotations

from typing import Any

import cooper
import torch

from layerdescent.config import SolverConfig
from layerdescent.problem import LayerwiseProblem


class Solver:
    """The objective of the primal step and, for primal-dual, the multiplier updates."""

    name = "erm"
    needs_dual = False
    trains_every_layer = False  # erm's gradient needs the last layer's loss alone

    def __init__(self, config: SolverConfig, problem: LayerwiseProblem, primal_optimizer: torch.optim.Optimizer) -> None:
        self.config = config
        self.problem = problem
        self.optimizer: cooper.optim.CooperOptimizer = cooper.optim.UnconstrainedOptimizer(problem.cmp, primal_optimizer)

    def objective(self, means: torch.Tensor) -> torch.Tensor:
        """What the primal step minimizes, before constraint terms."""
        return means[-1]

    def primal_loss(self, means: torch.Tensor, violations: dict[str, torch.Tensor]) -> torch.Tensor:
        """The differentiable quantity whose gradient the primal optimizer follows."""
        return self.objective(means)

    def observe(self, means: torch.Tensor) -> bool:
        """Record one step's layer means for the dual update; True when multipliers moved."""
        return False

    def end_epoch(self) -> bool:
        """Epoch boundary; True when multipliers moved."""
        return False

    def state_dict(self) -> dict[str, Any]:
        """Optimizer states, for checkpoints."""
        return {"optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` saved."""
        self.optimizer.load_state_dict(state["optimizer"])


class PenaltySolver(Solver):
    """Deep supervision: a fixed convex combination of all layer losses."""

    name = "penalty"
    trains_every_layer = True

    def objective(self, means: torch.Tensor) -> torch.Tensor:
        weights = self.config.penalty_weights
        if weights is None:
            return means.mean()
        w = torch.tensor(weights, dtype=means.dtype, device=means.device)
        return (w * means).sum() / w.sum()


class PrimalDualSolver(Solver):
    """Gradient descent on the Lagrangian in the model, projected ascent in the multipliers."""

    name = "primal-dual"
    needs_dual = True
    trains_every_layer = True

    def __init__(self, config: SolverConfig, problem: LayerwiseProblem, primal_optimizer: torch.optim.Optimizer) -> None:
        self.config = config
        self.problem = problem
        dual = problem.dual_optimizer(config.dual_optimizer, config.dual_lr, config.nupi_kp, config.nupi_ki, config.nupi_ema)
        self.optimizer = cooper.optim.SimultaneousOptimizer(problem.cmp, primal_optimizer, dual)
        self._window = torch.zeros(problem.num_layers + 1)
        self._count = 0

    def primal_loss(self, means: torch.Tensor, violations: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.problem.primal_state(self.objective(means), violations).compute_primal_lagrangian().lagrangian

    def observe(self, means: torch.Tensor) -> bool:
        self._window += means.detach().to(self._window)
        self._count += 1
        every = self.config.dual_every
        return every != "epoch" and self._count >= every and self._dual_step()

    def end_epoch(self) -> bool:
        return self.config.dual_every == "epoch" and self._count > 0 and self._dual_step()

    def _dual_step(self) -> bool:
        # The window holds expectations E[l_k] over its batches; specs are functions of them.
        means = (self._window / self._count).to(self.problem.device)
        with torch.no_grad():
            violations = self.problem.violations(means)
        # The dual Lagrangian is lambda^T g, so its gradient in lambda is g itself: writing it
        # directly gives what compute_dual_lagrangian().backward() gives, without an autograd
        # pass that cost a third of the primal-dual overhead on small models.
        for spec in self.problem.specs:
            weight = self.problem.constraint(spec).multiplier.weight
            weight.grad = violations[spec.name].detach().to(weight)
        self.optimizer.dual_step()  # also projects lambda >= 0 (multiplier.post_step_)
        self._window.zero_()
        self._count = 0
        return True

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "window": self._window.clone(), "count": self._count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self._window = state["window"].clone()
        self._count = int(state["count"])


SOLVERS: dict[str, type[Solver]] = {cls.name: cls for cls in (Solver, PenaltySolver, PrimalDualSolver)}


def build_solver(config: SolverConfig, problem: LayerwiseProblem, primal_optimizer: torch.optim.Optimizer) -> Solver:
    """The solver named by ``config.name``."""
    return SOLVERS[config.name](config, problem, primal_optimizer)
