"""The solver contract, what a registered solver implements, and the schemes that take its steps.

A solver is what a method is: its problem's formulation, its objective, its scheme, its dual
window and how its multipliers move (hooks a plugin overrides). A scheme is how a step runs, the
counterpart of Cooper's constrained optimizer of the same name, which it wraps: the step's
observation (over every rank), the non-finite check, then the primal and dual steps in its order.
The front (``LayerwiseUpdate``) builds the scheme the solver names and calls it; the problem counts
each micro-batch (``LayerwiseProblem.forward``) before.
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
    """One pass: the primal step, then the dual step from the same pass (Cooper's ``SimultaneousOptimizer``); the base of every scheme, which takes a solver's steps."""

    name: ClassVar[str] = "simultaneous"
    passes: ClassVar[int] = 1  # forward and backward passes per optimizer step
    after_outside_primal: ClassVar[bool] = True  # whether the dual side may follow a primal step another loop took

    def __init__(self, solver: Solver, primal: torch.optim.Optimizer) -> None:
        problem = self.problem = solver.problem
        self.solver = solver
        problem.enforced = solver.enforces_constraints  # the constraints enter the primal loss
        if type(solver).objective is not Solver.objective:  # the problem's loss, for Cooper's roll() too
            problem.objective = solver.objective
        self.optimizer = solver.optimizer = self._cooper_optimizer(primal)  # the solver's dual_step steps it
        self._reduced: tuple[Observation, Observation] | None = None  # the problem's observation and the same over every rank

    @classmethod
    def check_outside_primal(cls, what: str, instead: str) -> None:
        """Refuse (one ConfigError) ``what``, a dual side after a primal step another loop took, where this scheme cannot follow one; ``instead`` is the fix."""
        if not cls.after_outside_primal:
            raise ConfigError(f"{what}, which needs scheme = 'simultaneous' (got {cls.name!r}); {instead}")

    @classmethod
    def primal_optimizer(cls, params: list, train: PrimalSettings) -> torch.optim.Optimizer:
        """The model's optimizer this scheme steps, as ``train`` names it (sgd, adam, adamw)."""
        from layerdescent.core.optimizers import primal_optimizer

        return primal_optimizer(params, train)

    def _cooper_optimizer(self, primal: torch.optim.Optimizer) -> cooper.optim.CooperOptimizer:
        """Cooper's optimizer of this scheme around ``primal`` and the solver's dual optimizer (Cooper's unconstrained one without)."""
        import cooper

        dual = self.solver.dual_optimizer()
        if dual is None:
            return cooper.optim.UnconstrainedOptimizer(self.problem.cmp, primal)
        return self._cooper_class(cooper)(self.problem.cmp, primal, dual)

    @staticmethod
    def _cooper_class(cooper: Any) -> type:
        return cooper.optim.SimultaneousOptimizer

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
        if self.solver.enforces_constraints and violations is None:
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

    def _take(self) -> Observation:
        """This step's observation, over every rank; the next micro-batch starts a new one."""
        seen = self.observation()
        self.problem.seen = self._reduced = None
        return seen

    def _skip(self, seen: Observation) -> Observation | None:
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

    def _count_step(self, seen: Observation) -> bool:
        """Count one taken step toward the dual update; True when a dual gradient is on the multipliers (the solver's ``dual_step`` follows)."""
        solver = self.solver
        if solver.dual_window is None:  # a solver of its own schedule: its hook sees the step
            return solver.observe(seen)
        full = solver.dual_window.add(seen, self.problem)
        if full is None:
            return False
        solver.dual_gradient(*full)
        return True

    # -- what the front calls ------------------------------------------------------------------

    def zero_grad(self) -> None:
        """Clear the model's gradients (each dual step writes the multipliers' own afresh)."""
        for optimizer in self.optimizer.primal_optimizers:
            optimizer.zero_grad()

    def discard(self) -> None:
        """Drop this step's observation and the model's gradients (a skipped step)."""
        self.problem.seen = self._reduced = None
        self.zero_grad()

    def step(self, closure: Callable[[], Any] | None = None) -> Observation:
        """The primal step and the dual side, in the scheme's order; the observation (for the log line), with ``skipped`` set where it was dropped."""
        seen = self._take()
        if (dropped := self._skip(seen)) is not None:
            return dropped
        self.optimizer.primal_step()
        self._after_primal(seen, closure)
        return seen

    def dual_step(self) -> Observation:
        """The step's dual side alone, after a primal step another loop took; the observation."""
        self.check_outside_primal("dual_step() follows a primal step taken elsewhere", "use step() for it")
        seen = self._take()
        if (dropped := self._skip(seen)) is not None:
            return dropped
        self._after_primal(seen, None)
        return seen

    def end_epoch(self) -> bool:
        """Epoch boundary: the dual step of ``dual_every = "epoch"``; True when the multipliers stepped."""
        window = self.solver.dual_window
        if window is None or not window.per_epoch or window.count == 0:
            return False
        self.solver.dual_gradient(*window.close(self.problem))
        self.solver.dual_step()
        return True

    def _after_primal(self, seen: Observation, closure: Callable[[], Any] | None) -> None:
        """The dual side after the primal step: a dual step where the step fills the window."""
        if seen.means is not None and self._count_step(seen):
            self.solver.dual_step()


class Alternating(Simultaneous):
    """Cooper's dual-then-primal (``AlternatingDualPrimalOptimizer``): lambda steps from the whole batch, then the primal Lagrangian reads it."""

    name = "alternating"
    after_outside_primal = False

    def __init__(self, solver: Solver, primal: torch.optim.Optimizer) -> None:
        super().__init__(solver, primal)
        self.problem.before_primal = self._dual_first

    @staticmethod
    def _cooper_class(cooper: Any) -> type:
        return cooper.optim.AlternatingDualPrimalOptimizer

    def _dual_first(self) -> None:
        """The dual step, in the batch's one pass, between its violations and its primal Lagrangian."""
        # a method counting dual steps counts this step's before its primal step (docs/solvers.md: a
        # warm-up switches one primal step earlier)
        import torch

        seen = self.observation()
        if seen.micro > 1:
            raise ConfigError(
                "solver.scheme = 'alternating' steps lambda from the whole batch before its primal step: accumulate no micro-batches (train.accumulate = 1)"
            )
        # a non-finite batch is skipped in step(), before lambda reads it
        if bool(torch.isfinite(seen.means).all()) and self._count_step(seen):
            self.solver.dual_step()

    def _after_primal(self, seen: Observation, closure: Callable[[], Any] | None) -> None:
        """Nothing: the dual step came before the primal one, in the pass."""


class AlternatingPrimalDual(Simultaneous):
    """The primal step, then the dual step from a second pass of the batch, no-grad (Cooper's ``AlternatingPrimalDualOptimizer``)."""

    name = "alternating-primal-dual"
    after_outside_primal = False

    @staticmethod
    def _cooper_class(cooper: Any) -> type:
        return cooper.optim.AlternatingPrimalDualOptimizer

    def _after_primal(self, seen: Observation, closure: Callable[[], Any] | None) -> None:
        import torch

        with torch.no_grad():  # lambda follows the updated model: only the means are needed
            _required(closure, self.name)()
        again = self._take()
        if again.means is not None and self._count_step(again):
            self.solver.dual_step()


class Extrapolation(Simultaneous):
    """Cooper's extragradient (``ExtrapolationConstrainedOptimizer``): step to the midpoint, evaluate there, step from the start."""

    name = "extrapolation"
    passes = 2
    after_outside_primal = False

    @classmethod
    def primal_optimizer(cls, params: list, train: PrimalSettings) -> torch.optim.Optimizer:
        """Cooper's ExtraAdam or ExtraSGD, as ``train`` names it."""
        from layerdescent.core.optimizers import primal_optimizer

        return primal_optimizer(params, train, extragradient=True)

    def _cooper_optimizer(self, primal: torch.optim.Optimizer) -> cooper.optim.CooperOptimizer:
        import cooper

        from layerdescent.core.extragradient import ExtraSGD

        if not isinstance(primal, cooper.optim.ExtragradientOptimizer):
            raise ConfigError(
                f"solver.scheme = 'extrapolation' needs an extragradient primal optimizer (cooper.optim.ExtraAdam or ExtraSGD), "
                f"got {type(primal).__name__}: set train.optimizer = 'adam' or 'sgd'"
            )
        dual = ExtraSGD(self.problem.dual_groups(), lr=self.solver.options.dual_lr, maximize=True)  # the options allow SGD alone here
        return cooper.optim.ExtrapolationConstrainedOptimizer(self.problem.cmp, primal, dual)

    def step(self, closure: Callable[[], Any] | None = None) -> Observation:
        _required(closure, self.name)
        seen = self._take()
        if (dropped := self._skip(seen)) is not None:
            return dropped
        self._count_step(seen)  # a window of one step (the options say so): always a dual gradient
        self.optimizer.primal_extrapolation_step()
        self.optimizer.dual_extrapolation_step()
        self.zero_grad()
        closure()
        self._count_step(self._take())
        self.optimizer.primal_step()
        self.solver.dual_step()
        return seen


SCHEMES: dict[str, type[Simultaneous]] = {
    scheme.name: scheme for scheme in (Simultaneous, Alternating, AlternatingPrimalDual, Extrapolation)
}


def _required(closure: Callable[[], Any] | None, scheme: str) -> Callable[[], Any]:
    if closure is None:
        raise TypeError(
            f"solver.scheme = {scheme!r} evaluates each batch twice: pass step(closure), a function that calls backward() on the batch again"
        )
    return closure


# -- the solver ----------------------------------------------------------------------------------


class Solver:
    """A registered solver: its objective, scheme, dual window and dual update, and the state they keep; subclass and register.

    Every method is a hook, called by the front and its scheme (docs/solvers.md gives the order
    per scheme); a plugin overrides what its method changes.
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
        self.dual_window: DualWindow | None = None  # the steps one dual step reads; None: the solver's own hook (observe) sees each step
        self.optimizer: Any = None  # Cooper's optimizer, once the front built the scheme around it

    # -- what the solver is, before it is built -------------------------------------------------

    @classmethod
    def scheme_of(cls, options: Any) -> type[Simultaneous]:
        """The scheme its steps take (a class of ``SCHEMES``): the model's optimizer, the passes per step and the order of the primal and dual steps."""
        return Simultaneous

    @classmethod
    def check(cls, options: Any, num_layers: int, constraints: tuple) -> list[str]:
        """Problems (one line each) that need the model's depth or the constraints; empty when the run can start."""
        return []

    @classmethod
    def build_problem(
        cls, options: Any, constraints: tuple[ConstraintSpec, ...], num_layers: int, band: tuple[float, ...] = (), rows: int | None = None
    ) -> LayerwiseProblem:
        """The Cooper problem of these constraints in this solver's formulation (a plain Lagrangian here)."""
        from layerdescent.core.problem import LayerwiseProblem

        return LayerwiseProblem(constraints, num_layers, band=band, rows=rows)

    # -- the objective and the dual update -------------------------------------------------------

    def objective(self, means: torch.Tensor) -> torch.Tensor:
        """What the primal step minimizes, before constraint terms."""
        return means[-1]

    def dual_optimizer(self) -> torch.optim.Optimizer | None:
        """The multipliers' optimizer over ``self.problem.dual_groups()``, ascending (``maximize=True``); None: they never move (Cooper's unconstrained optimizer)."""
        return None

    def observe(self, seen: Observation) -> bool:
        """A solver without a dual window sees each taken step here (its layer means, and its tables where constraints are held per group); True when a dual gradient is on the multipliers."""
        return False

    def dual_gradient(self, violations: dict[str, torch.Tensor], tables: Tables) -> None:
        """Put the gradient of Cooper's dual Lagrangian on every multiplier, replacing any there: each plain constraint's violation, and each grouped one's at the groups seen; the augmented Lagrangian's rho grows here too.

        ``violations`` are the window's (one entry per constraint name, detached); ``tables`` its
        per-group sums and counts. Override to change what the multipliers ascend
        (``self.problem.constraints[name].multiplier``).
        """
        import torch

        problem = self.problem
        state = problem.cmp.compute_cmp_state(Observation(violations=violations, tables=tables), primal=False)
        # The dual Lagrangian is lambda . g.detach() (Cooper's compute_dual_weighted_violation), so its
        # gradient in lambda is the strict violation itself: written directly it skips an autograd pass
        # that cost a small model 5% of its step. A test checks it against compute_dual_lagrangian().backward().
        for constraint in problem.constraints.values():
            weight = constraint.multiplier.weight
            observed = state.observed_constraints.get(constraint)
            if observed is None:  # a grouped spec whose window saw no group: no step, not even the relaxation's decay
                weight.grad = None
                continue
            strict = observed.extract_violations()[1].detach()
            if observed.constraint_features is None:
                weight.grad = strict.clone()
            else:  # the groups come sorted and distinct from nonzero(), so the indices are already coalesced
                index = observed.constraint_features
                weight.grad = torch.sparse_coo_tensor(index[None], strict[:, None], weight.shape, is_coalesced=True, check_invariants=False)
        if problem.growth is not None:  # the augmented Lagrangian's rho grows where the window saw a violation above the tolerance
            problem.growth.step(state.observed_constraints)

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
