"""When the multipliers step (the dual window of ``dual_every``) and how a step's primal and dual sides interleave (the schemes, each named for Cooper's constrained optimizer that steps it)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from layerdescent.core.observation import Observation, Tables
from layerdescent.errors import ConfigError

if TYPE_CHECKING:  # the registry loads solvers without torch or cooper; their methods run in training
    import cooper
    import torch

    from layerdescent.core.problem import LayerwiseProblem
    from layerdescent.core.solver import Solver

__all__ = ["DualWindow", "PrimalSettings", "SCHEMES"]


class PrimalSettings(Protocol):
    """What a solver's primal optimizer reads of a run's [train] table (a ``TrainConfig``, or any object with these)."""

    optimizer: str
    lr: float
    momentum: float
    weight_decay: float


# -- when the multipliers step: the dual window --------------------------------------------------


class DualWindow:
    """The optimizer steps one dual step reads (``dual_every``: a count, or every step of an epoch) and their sums since the last one."""

    def __init__(self, steps: int | None, width: int) -> None:
        import torch

        self.steps = steps  # None: the end of each epoch closes the window
        self.means = torch.zeros(width)  # the sum of the steps' layer means
        self.count = 0
        self.violations: dict[str, Any] | None = None  # a one-step window's violations, computed in its pass
        self.tables: Tables = {}  # the steps' per-group sums and counts

    @classmethod
    def of(cls, every: int | str, width: int) -> DualWindow:
        """The window ``solver.dual_every`` names (a number of steps, or ``"epoch"``) over ``width`` layer means."""
        return cls(None if every == "epoch" else int(every), width)

    @property
    def per_epoch(self) -> bool:
        """Whether the dual step comes at the end of each epoch."""
        return self.steps is None

    def add(self, seen: Observation, problem: LayerwiseProblem) -> tuple[dict[str, Any], Tables] | None:
        """Count a taken step: the window's violations and per-group tables where this step fills it (the window starts again), else None."""
        if seen.tables:
            from layerdescent.core.grouping import add_tables

            self.tables = add_tables(self.tables, seen.tables)
        if self.steps == 1 and seen.violations and len(seen.violations) == len(problem.plain):
            tables, self.tables = self.tables, {}  # a one-step window: the step's own violations, from its pass
            return seen.violations, tables
        self.means += seen.means.detach().to(self.means)
        self.count += 1
        self.violations = seen.violations if self.count == 1 else None
        return self.close(problem) if self.steps is not None and self.count >= self.steps else None

    def close(self, problem: LayerwiseProblem) -> tuple[dict[str, Any], Tables]:
        """The window's violations and tables, and it starts again: its one step's violations where its pass computed them, else those at its mean layer losses."""
        # The window holds expectations E[l_k] over its batches; specs are functions of them.
        import torch

        violations = self.violations if self.count == 1 else None
        if violations is None or len(violations) < len(problem.plain):  # none known, or a non-finite step's
            with torch.no_grad():
                violations = problem.violations((self.means / self.count).to(problem.device))
        tables, self.tables = self.tables, {}
        self.means.zero_()
        self.count = 0
        self.violations = None
        return violations, tables

    def state_dict(self) -> dict[str, Any]:
        """The sums since the last dual step, for checkpoints."""
        state: dict[str, Any] = {"window": self.means.clone(), "count": self.count}
        if self.tables:  # only runs with constraints held per level or per sample have them
            state["group_window"] = {name: [sums.clone(), counts.clone()] for name, (sums, counts) in self.tables.items()}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` saved."""
        self.means = state["window"].clone()
        self.count = int(state["count"])
        self.violations = None
        self.tables = {name: (sums.clone(), counts.clone()) for name, (sums, counts) in state.get("group_window", {}).items()}


# -- how the primal and dual steps interleave: the schemes ---------------------------------------


class Simultaneous:
    """One pass: the primal step, then the dual step from the same pass (Cooper's ``SimultaneousOptimizer``)."""

    passes: ClassVar[int] = 1  # forward and backward passes per optimizer step
    after_outside_primal: ClassVar[bool] = True  # whether the dual side may follow a primal step another loop took

    def primal_optimizer(self, params: list, train: PrimalSettings) -> torch.optim.Optimizer | None:
        """The model's optimizer this scheme needs, or None for the run's own (``train.optimizer``)."""
        return None

    def cooper_optimizer(self, solver: Solver, primal: torch.optim.Optimizer) -> cooper.optim.CooperOptimizer:
        """Cooper's constrained optimizer of this scheme, around ``primal`` and the solver's dual optimizer."""
        import cooper

        return self.cooper_class(cooper)(solver.problem.cmp, primal, solver.dual_optimizer())

    @staticmethod
    def cooper_class(cooper: Any) -> type:
        return cooper.optim.SimultaneousOptimizer

    def attach(self, solver: Solver) -> None:
        """What the scheme needs of a step's passes (nothing, but for alternating)."""

    def step(self, solver: Solver, closure: Callable[[], Any] | None) -> Observation:
        """The optimizer step: the primal step, then what the scheme does on the dual side."""
        seen = solver.take()
        if (dropped := solver.skip(seen)) is not None:
            return dropped
        solver.optimizer.primal_step()
        self.after_primal(solver, seen, closure)
        return seen

    def after_primal(self, solver: Solver, seen: Observation, closure: Callable[[], Any] | None) -> None:
        """The dual side after the primal step: a dual step where the step fills the window."""
        if seen.means is not None and solver.count_step(seen):
            solver.dual_step()


class Alternating(Simultaneous):
    """Cooper's dual-then-primal (``AlternatingDualPrimalOptimizer``): lambda steps from the whole batch, then the primal Lagrangian reads it."""

    after_outside_primal = False

    @staticmethod
    def cooper_class(cooper: Any) -> type:
        return cooper.optim.AlternatingDualPrimalOptimizer

    def attach(self, solver: Solver) -> None:
        solver.problem.before_primal = lambda: self.dual_first(solver)

    def dual_first(self, solver: Solver) -> None:
        """The dual step, in the batch's one pass, between its violations and its primal Lagrangian."""
        # a method counting dual steps counts this step's before its primal step (docs/solvers.md: a
        # warm-up switches one primal step earlier)
        import torch

        seen = solver.observation()
        if seen.micro > 1:
            raise ConfigError(
                "solver.scheme = 'alternating' steps lambda from the whole batch before its primal step: accumulate no micro-batches (train.accumulate = 1)"
            )
        # a non-finite batch is skipped in step(), before lambda reads it
        if bool(torch.isfinite(seen.means).all()) and solver.count_step(seen):
            solver.dual_step()

    def after_primal(self, solver: Solver, seen: Observation, closure: Callable[[], Any] | None) -> None:
        """Nothing: the dual step came before the primal one, in the pass."""


class AlternatingPrimalDual(Simultaneous):
    """The primal step, then the dual step from a second pass of the batch, no-grad (Cooper's ``AlternatingPrimalDualOptimizer``)."""

    after_outside_primal = False

    @staticmethod
    def cooper_class(cooper: Any) -> type:
        return cooper.optim.AlternatingPrimalDualOptimizer

    def after_primal(self, solver: Solver, seen: Observation, closure: Callable[[], Any] | None) -> None:
        import torch

        with torch.no_grad():  # lambda follows the updated model: only the means are needed
            _required(closure, "alternating-primal-dual")()
        again = solver.take()
        if again.means is not None and solver.count_step(again):
            solver.dual_step()


class Extrapolation(Simultaneous):
    """Cooper's extragradient (``ExtrapolationConstrainedOptimizer``): step to the midpoint, evaluate there, step from the start."""

    passes = 2
    after_outside_primal = False

    def primal_optimizer(self, params: list, train: PrimalSettings) -> torch.optim.Optimizer:
        from layerdescent.core.optimizers import primal_optimizer

        return primal_optimizer(params, train, extragradient=True)

    def cooper_optimizer(self, solver: Solver, primal: torch.optim.Optimizer) -> cooper.optim.CooperOptimizer:
        import cooper

        from layerdescent.core.optimizers import ExtraSGD

        if not isinstance(primal, cooper.optim.ExtragradientOptimizer):
            raise ConfigError(
                f"solver.scheme = 'extrapolation' needs an extragradient primal optimizer (cooper.optim.ExtraAdam or ExtraSGD), "
                f"got {type(primal).__name__}: set train.optimizer = 'adam' or 'sgd'"
            )
        dual = ExtraSGD(solver.problem.dual_groups(), lr=solver.options.dual_lr, maximize=True)  # the options allow SGD alone here
        return cooper.optim.ExtrapolationConstrainedOptimizer(solver.problem.cmp, primal, dual)

    def step(self, solver: Solver, closure: Callable[[], Any] | None) -> Observation:
        _required(closure, "extrapolation")
        seen = solver.take()
        if (dropped := solver.skip(seen)) is not None:
            return dropped
        solver.count_step(seen)  # a window of one step (the options say so): always a dual gradient
        solver.optimizer.primal_extrapolation_step()
        solver.optimizer.dual_extrapolation_step()
        solver.zero_grad()
        closure()
        solver.count_step(solver.take())
        solver.optimizer.primal_step()
        solver.dual_step()
        return seen


SCHEMES: dict[str, type[Simultaneous]] = {
    "simultaneous": Simultaneous,
    "alternating": Alternating,
    "alternating-primal-dual": AlternatingPrimalDual,
    "extrapolation": Extrapolation,
}


def _required(closure: Callable[[], Any] | None, scheme: str) -> Callable[[], Any]:
    if closure is None:
        raise TypeError(
            f"solver.scheme = {scheme!r} evaluates each batch twice: pass step(closure), a function that calls backward() on the batch again"
        )
    return closure
