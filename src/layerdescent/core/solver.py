"""The solver contract: what a registered solver implements, and the one step every solver takes.

A step is counted by the problem, micro-batch by micro-batch (``LayerwiseProblem.forward``),
then taken here: the step's observation (over every rank), the non-finite check, then the
scheme's primal and dual steps on Cooper's optimizer. Each scheme is one of the classes below,
named for Cooper's constrained optimizer that steps it, and the dual window a ``DualWindow``
(``core/window.py``), both chosen once from the options' strings.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from layerdescent.core.divergence import why_not_finite
from layerdescent.core.observation import Observation, Tables
from layerdescent.core.window import DualWindow
from layerdescent.errors import ConfigError
from layerdescent.options import NoOptions

if TYPE_CHECKING:  # the registry loads solvers without torch or cooper; their methods run in training
    import cooper
    import torch

    from layerdescent.core.constraints import ConstraintSpec
    from layerdescent.core.optimizers import PrimalSettings
    from layerdescent.core.problem import LayerwiseProblem

__all__ = ["DualWindow", "Observation", "SCHEMES", "Solver", "Tables"]


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

        from layerdescent.core.extragradient import ExtraSGD

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


# -- the solver ----------------------------------------------------------------------------------


class Solver:
    """A registered solver: the objective, the scheme and dual window of its step, the dual update and the state they keep; subclass and register.

    The problem counts each micro-batch (``LayerwiseProblem.forward``, through the update front's
    ``backward``); the front then calls ``step`` (or, after a primal step taken elsewhere,
    ``step_after_primal``). docs/solvers.md gives the order of calls per scheme.
    """

    name: ClassVar[str] = ""
    Options: ClassVar[type] = NoOptions  # a frozen dataclass: this solver's [solver] keys, their types and defaults
    enforces_constraints: ClassVar[bool] = False  # its multipliers move: logged, traced, drawn solid, its ablations tabled
    baseline: ClassVar[bool] = False  # the solver every group is compared with (erm)
    reference: ClassVar[bool] = False  # constrained groups are also compared with it (penalty)
    trains_every_layer: ClassVar[bool] = True  # False: its gradient needs the last layer's loss alone
    max_multiplier: float | None = None  # a multiplier above this stops the run as diverged

    def __init__(self, options: Any, problem: LayerwiseProblem) -> None:
        self.options = options
        self.problem = problem
        self.gradient_evaluations = self.gradient_passes(options)
        self.optimizer: Any = None  # the Cooper optimizer, once ``attach`` built it
        self.scheme: Simultaneous = Simultaneous()  # how the primal and dual steps interleave
        self.dual_window: DualWindow | None = None  # the steps one dual step reads; None: the solver's own hooks (observe) see each step
        self._reduced: tuple[Observation, Observation] | None = None  # the problem's observation and the same over every rank

    # -- what the solver is, before it is built -------------------------------------------------

    @classmethod
    def gradient_passes(cls, options: Any) -> int:
        """Forward and backward passes per optimizer step (2 for extragradient, whose primal optimizer must be Cooper's)."""
        return 1

    @classmethod
    def check(cls, options: Any, num_layers: int, constraints: tuple) -> list[str]:
        """Problems (one line each) that need the model's depth or the constraints; empty when the run can start."""
        return []

    @classmethod
    def outside_primal_step(cls, options: Any) -> str | None:
        """Why the multipliers cannot step after a primal step another loop took (a Hugging Face ``Trainer``), or None when they can."""
        if cls.gradient_passes(options) != 1:
            return f"needs one pass per step (solver {cls.name!r} evaluates each batch twice)"
        return None

    @classmethod
    def build_problem(
        cls, options: Any, constraints: tuple[ConstraintSpec, ...], num_layers: int, band: tuple[float, ...] = (), rows: int | None = None
    ) -> LayerwiseProblem:
        """The Cooper problem of these constraints in this solver's formulation (a plain Lagrangian here)."""
        from layerdescent.core.problem import LayerwiseProblem

        return LayerwiseProblem(constraints, num_layers, band=band, rows=rows)

    @classmethod
    def primal_optimizer(cls, options: Any, params: list, train: PrimalSettings) -> torch.optim.Optimizer:
        """The model's optimizer as ``train`` names it (sgd, adam, adamw)."""
        from layerdescent.core.optimizers import primal_optimizer

        return primal_optimizer(params, train)

    # -- the objective and the optimizers ------------------------------------------------------

    def objective(self, means: torch.Tensor) -> torch.Tensor:
        """What the primal step minimizes, before constraint terms."""
        return means[-1]

    def cooper_optimizer(self, primal: torch.optim.Optimizer) -> cooper.optim.CooperOptimizer:
        """The Cooper optimizer that steps ``primal`` (and, for constrained solvers, the multipliers)."""
        import cooper

        return cooper.optim.UnconstrainedOptimizer(self.problem.cmp, primal)

    def attach(self, primal: torch.optim.Optimizer) -> None:
        """Join the problem (its loss, the multipliers, the scheme's hooks) and build the Cooper optimizer around the model's optimizer (the front calls this once)."""
        problem = self.problem
        problem.enforced = self.enforces_constraints  # the constraints enter the primal loss
        if type(self).objective is not Solver.objective:  # the problem's loss, for Cooper's roll() too
            problem.objective = self.objective
        self.optimizer = self.cooper_optimizer(primal)
        self.scheme.attach(self)

    # -- the step's observation ----------------------------------------------------------------

    def observation(self) -> Observation:
        """This step's observation over every rank (one all-reduce of means and tables), with its violations; the same value until the step is taken."""
        seen = self.problem.seen
        if seen is None:
            return Observation()
        if self._reduced is not None and self._reduced[0] is seen:
            return self._reduced[1]
        import torch

        means, tables, violations = seen.means, seen.tables, seen.violations
        distributed = torch.distributed
        if distributed.is_available() and distributed.is_initialized() and distributed.get_world_size() > 1:
            from layerdescent.distributed import World

            means, tables = World.current().reduce_step(means, tables)
            violations = None  # this rank's alone
        if self.enforces_constraints and violations is None:
            finite = bool(torch.isfinite(means).all())  # a last-layer-only read leaves the other layers NaN: no violations
            with torch.no_grad():
                violations = self.problem.violations(means) if finite else {}
        # a solver that enforces nothing leaves the violations to the log line, which takes them in one batch
        out = (
            seen
            if means is seen.means and violations is seen.violations
            else dataclasses.replace(seen, means=means, violations=violations, tables=tables)
        )
        self._reduced = (seen, out)
        return out

    def take(self) -> Observation:
        """This step's observation, over every rank; the next micro-batch starts a new one."""
        seen = self.observation()
        self.problem.seen = self._reduced = None
        return seen

    def discard(self) -> None:
        """Drop this step's observation and the model's gradients (a skipped step)."""
        self.problem.seen = self._reduced = None
        self.zero_grad()

    def zero_grad(self) -> None:
        """Clear the model's gradients (each dual step writes the multipliers' own afresh)."""
        for optimizer in self.optimizer.primal_optimizers:
            optimizer.zero_grad()

    def skip(self, seen: Observation) -> Observation | None:
        """The step dropped, where a mean or violation it would train on is not finite: ``seen`` with ``skipped`` saying why, the gradients cleared; else None.

        Every scheme's ``step`` calls it on the observation it takes first, before any primal or
        dual step, and returns what it gives instead of stepping.
        """
        import torch

        if seen.means is None:
            return None
        values = seen.means if seen.every_layer else seen.means[-1:]
        if seen.every_layer and seen.violations:
            values = torch.cat([values, *seen.violations.values()])
        if bool(torch.isfinite(values).all()):  # the usual case: one test
            return None
        self.zero_grad()
        return dataclasses.replace(seen, skipped=why_not_finite(seen, self.problem.labels))

    # -- the step --------------------------------------------------------------------------------

    def step(self, closure: Callable[[], Any] | None = None) -> Observation:
        """The step of the scheme: the primal step and the dual side, in its order; the observation (for the log line), with ``skipped`` set where it was dropped."""
        return self.scheme.step(self, closure)

    def step_after_primal(self) -> Observation:
        """The step's dual side alone, after a primal step another loop took; the observation."""
        problem = self.outside_primal_step(self.options)
        if problem:
            raise ConfigError(f"dual_step() follows a primal step taken elsewhere, which {problem}: use step() for it")
        seen = self.take()
        if (dropped := self.skip(seen)) is not None:
            return dropped
        self.scheme.after_primal(self, seen, None)  # a scheme that allows it steps lambda from this step's pass
        return seen

    # -- the dual side ---------------------------------------------------------------------------

    def count_step(self, seen: Observation) -> bool:
        """Count one taken step toward the dual update; True when a dual gradient is on the multipliers (``dual_step`` follows)."""
        if self.dual_window is None:  # a solver of its own schedule: its hooks see the step
            if seen.tables:
                self.observe_groups(seen.tables)
            return self.observe(seen.means)
        full = self.dual_window.add(seen, self.problem)
        if full is None:
            return False
        self.dual_gradient(*full)
        return True

    def end_epoch(self) -> bool:
        """Epoch boundary; True when a dual gradient is on the multipliers (``dual_step`` follows): the window of ``dual_every = "epoch"``."""
        window = self.dual_window
        if window is None or not window.per_epoch or window.count == 0:
            return False
        self.dual_gradient(*window.close(self.problem))
        return True

    def observe(self, means: torch.Tensor) -> bool:
        """A solver without a dual window sees each taken step's layer means here; True when a dual gradient is on the multipliers."""
        return False

    def observe_groups(self, tables: Tables) -> None:
        """A solver without a dual window sees each taken step's per-group loss sums and row counts here (before ``observe``)."""

    def dual_gradient(self, violations: dict[str, torch.Tensor], tables: Tables) -> None:
        """Put the gradient of the dual Lagrangian on every multiplier: each plain constraint's violation, and each grouped one's per group seen.

        ``violations`` are the window's (one entry per constraint name, detached); ``tables`` its
        per-group sums and counts. The augmented Lagrangian's penalties grow here too. Override to
        change what the multipliers ascend (``self.dual_parameters()`` names each one's tensor).
        """
        self.problem.put_dual_gradient(violations, tables)

    def dual_parameters(self) -> dict[str, torch.nn.Parameter]:
        """Each constraint's multiplier tensor, by name: what ``dual_gradient`` writes ``.grad`` of and ``dual_step`` steps."""
        return {spec.name: self.problem.constraint(spec).multiplier.weight for spec in self.problem.specs}

    def dual_step(self) -> None:
        """Step the multipliers from the gradient ``dual_gradient`` put on them (Cooper's dual step also projects lambda >= 0)."""
        self.optimizer.dual_step()

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps beyond the optimizers: the dual window's sums, where there is one."""
        return self.dual_window.state_dict() if self.dual_window is not None else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` saved."""
        if self.dual_window is not None:
            self.dual_window.load_state_dict(state)
