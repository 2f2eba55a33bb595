"""Solvers: how a run turns layer losses into updates, each a registered plugin that owns its whole step, driven through Cooper.

- ``erm``: minimize the last layer's loss; constraints are measured and logged, never enforced.
- ``penalty``: minimize fixed weights times the layer losses (deep supervision).
- ``primal-dual``: minimize the Lagrangian (or augmented Lagrangian) in the model, ascend it in the
  multipliers, with Cooper's simultaneous, alternating or extrapolation schemes. ``PrimalDual`` is
  the documented base for new dual methods (docs/solvers.md); its scheme and its dual window
  (``dual_every``) are types (``SCHEMES``, ``DualWindow``), chosen once from the options' strings.

A solver declares its ``[solver]`` keys as a frozen dataclass ``Options`` (checked like every
config table) and what the trainer and the report need as class attributes, so neither ever reads
a solver's name. It builds its Cooper problem (the formulation), the model's optimizer (the
scheme's), and takes each step: one pass per micro-batch, whose violations serve the primal
Lagrangian, the non-finite check, the dual step and the log line. Third-party solvers register
through the ``register_solvers`` hook.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Union

from layerdescent.core.penalty import Penalty
from layerdescent.core.solver import Observation, PrimalSettings, Solver, Tables, _means
from layerdescent.errors import ConfigError
from layerdescent.hookspecs import hookimpl

if TYPE_CHECKING:  # the registry loads solvers without torch or cooper; their methods run in training
    import cooper
    import torch

    from layerdescent.core.problem import LayerwiseProblem


class ERM(Solver):
    """Empirical risk minimization of the last layer's loss."""

    name = "erm"
    baseline = True
    trains_every_layer = False


@dataclass(frozen=True)
class PrimalDualOptions:
    """``primal-dual``'s keys: the formulation, the update scheme and the dual optimizer."""

    formulation: Literal["lagrangian", "augmented-lagrangian"] = "lagrangian"
    """Cooper's Lagrangian, or its augmented Lagrangian with a penalty rho per entry."""
    # simultaneous: one pass, both steps from it; alternating: Cooper's dual-then-primal, one pass;
    # alternating-primal-dual: primal step, then the dual step from a second (no-grad) pass;
    # extrapolation: Cooper's extragradient, two passes a step (ExtraAdam/ExtraSGD).
    scheme: Literal["simultaneous", "alternating", "alternating-primal-dual", "extrapolation"] = "simultaneous"
    """How the primal and dual steps interleave (Cooper's constrained optimizers)."""
    dual_lr: float = 0.05
    """The multipliers' learning rate."""
    dual_optimizer: Literal["sgd", "nupi"] = "sgd"
    """The multipliers' optimizer: projected SGD ascent, or Cooper's nuPI."""
    dual_every: Union[int, Literal["epoch"]] = 1
    """Optimizer steps per dual step (from the window's mean losses), or `"epoch"`."""
    nupi_kp: float = 1.0
    """nuPI's proportional gain (`dual_optimizer = "nupi"`)."""
    nupi_ki: float = 1.0
    """nuPI's integral gain."""
    nupi_ema: float = 0.0
    """nuPI's EMA coefficient of the proportional term."""
    penalty_coefficient: float = 1.0
    """Augmented Lagrangian: every entry's initial rho."""
    penalty_growth: float = 1.0
    """Rho is multiplied by this after a dual step that finds its entry violated; 1 keeps it fixed."""
    penalty_tolerance: float = 1e-4
    """The violation above which rho grows."""
    max_multiplier: float = 1e6
    """A larger multiplier stops the run as diverged."""

    def __post_init__(self) -> None:
        checks = (
            (self.dual_lr >= 0, "solver.dual_lr", f"must be >= 0, got {self.dual_lr}"),
            (self.max_multiplier > 0, "solver.max_multiplier", f"must be > 0, got {self.max_multiplier}"),
            (self.dual_every == "epoch" or self.dual_every >= 1, "solver.dual_every", "must be >= 1 (steps) or 'epoch'"),
            (0 <= self.nupi_ema < 1, "solver.nupi_ema", "must be in [0, 1)"),
            (self.penalty_coefficient > 0, "solver.penalty_coefficient", f"must be > 0, got {self.penalty_coefficient}"),
            (self.penalty_growth >= 1, "solver.penalty_growth", f"must be >= 1 (1 keeps rho fixed), got {self.penalty_growth}"),
            (self.penalty_tolerance >= 0, "solver.penalty_tolerance", f"must be >= 0, got {self.penalty_tolerance}"),
        )
        for ok, key, message in checks:
            if not ok:
                raise ConfigError(f"{key} {message}")
        if self.scheme == "extrapolation" and (self.dual_optimizer != "sgd" or self.dual_every != 1):
            raise ConfigError(
                "solver.scheme = 'extrapolation' steps the multipliers by extragradient every step: set dual_optimizer = 'sgd' and dual_every = 1"
            )
        if self.scheme == "alternating" and self.dual_every == "epoch":
            raise ConfigError(
                "solver.scheme = 'alternating' updates lambda before each primal step: use dual_every = 1 (or a step count), or scheme = 'simultaneous'"
            )


# -- when primal-dual's steps happen: its schemes and its dual window ------------------------------


@dataclass(frozen=True)
class DualWindow:
    """How many optimizer steps one dual step reads, from their mean layer losses: a count, or every step of an epoch (``steps`` None)."""

    steps: int | None

    @classmethod
    def of(cls, every: int | str) -> DualWindow:
        """The window ``solver.dual_every`` names: a number of steps, or ``"epoch"``."""
        return cls(None if every == "epoch" else int(every))

    @property
    def per_epoch(self) -> bool:
        """Whether the dual step comes at the end of each epoch."""
        return self.steps is None

    def full(self, count: int) -> bool:
        """Whether ``count`` observed steps fill the window (never, for a window of an epoch: the epoch's end closes it)."""
        return self.steps is not None and count >= self.steps


class Simultaneous:
    """One pass: the primal step, then the dual step from the same pass (Cooper's ``SimultaneousOptimizer``)."""

    passes: ClassVar[int] = 1  # forward and backward passes per optimizer step
    after_outside_primal: ClassVar[bool] = True  # whether the dual side may follow a primal step another loop took

    def primal_optimizer(self, params: list, train: PrimalSettings) -> torch.optim.Optimizer | None:
        """The model's optimizer this scheme needs, or None for the run's own (``train.optimizer``)."""
        return None

    def cooper_optimizer(self, solver: PrimalDual, primal: torch.optim.Optimizer) -> cooper.optim.CooperOptimizer:
        """Cooper's constrained optimizer of this scheme, around ``primal`` and the solver's dual optimizer."""
        import cooper

        return self.cooper_class(cooper)(solver.problem.cmp, primal, solver.dual_optimizer())

    @staticmethod
    def cooper_class(cooper: Any) -> type:
        return cooper.optim.SimultaneousOptimizer

    def forward(self, solver: PrimalDual, batch: Any, means: torch.Tensor, weight: float) -> torch.Tensor:
        """One micro-batch's primal Lagrangian; its violations serve the checks, the dual step and the log (lambda steps from the window)."""
        lagrangian, violations, tables = solver.problem.primal_lagrangian(batch, means)
        solver.count(means.detach(), weight, violations, tables)
        return lagrangian

    def step(self, solver: PrimalDual, closure: Callable[[], Any] | None) -> Observation:
        """The optimizer step: the primal step, then what the scheme does on the dual side."""
        seen = solver.take()
        if (dropped := solver.skip(seen)) is not None:
            return dropped
        solver.optimizer.primal_step()
        self.after_primal(solver, seen, closure)
        return seen

    def after_primal(self, solver: PrimalDual, seen: Observation, closure: Callable[[], Any] | None) -> None:
        """The dual side after the primal step: a dual step where the step's observation fills the window."""
        if seen.means is not None and solver.observe_step(seen):
            solver.dual_step()


class Alternating(Simultaneous):
    """Cooper's dual-then-primal (``AlternatingDualPrimalOptimizer``): lambda steps from the whole batch, then the primal Lagrangian reads it."""

    after_outside_primal = False

    @staticmethod
    def cooper_class(cooper: Any) -> type:
        return cooper.optim.AlternatingDualPrimalOptimizer

    def forward(self, solver: PrimalDual, batch: Any, means: torch.Tensor, weight: float) -> torch.Tensor:
        # the dual step comes here, in the batch's one pass: a method counting dual steps counts this
        # step's before its primal step (docs/solvers.md: a warm-up switches one primal step earlier)
        import torch

        state, violations, tables = solver.problem.observe(batch, dual=False, means=means)
        solver.count(means.detach(), weight, violations, tables)
        seen = solver.observed()
        if seen.micro > 1:
            raise ConfigError(
                "solver.scheme = 'alternating' steps lambda from the whole batch before its primal step: accumulate no micro-batches (train.accumulate = 1)"
            )
        # a non-finite batch is skipped in step(), before lambda reads it
        if bool(torch.isfinite(seen.means).all()) and solver.observe_step(seen):
            solver.dual_step()
        return state.compute_primal_lagrangian().lagrangian

    def after_primal(self, solver: PrimalDual, seen: Observation, closure: Callable[[], Any] | None) -> None:
        """Nothing: the dual step came before the primal one, in ``forward``."""


class AlternatingPrimalDual(Simultaneous):
    """The primal step, then the dual step from a second pass of the batch, no-grad (Cooper's ``AlternatingPrimalDualOptimizer``)."""

    after_outside_primal = False

    @staticmethod
    def cooper_class(cooper: Any) -> type:
        return cooper.optim.AlternatingPrimalDualOptimizer

    def after_primal(self, solver: PrimalDual, seen: Observation, closure: Callable[[], Any] | None) -> None:
        import torch

        with torch.no_grad():  # lambda follows the updated model: only the means are needed
            _required(closure, "alternating-primal-dual")()
        again = solver.take()
        if again.means is not None and solver.observe_step(again):
            solver.dual_step()


class Extrapolation(Simultaneous):
    """Cooper's extragradient (``ExtrapolationConstrainedOptimizer``): step to the midpoint, evaluate there, step from the start."""

    passes = 2
    after_outside_primal = False

    def primal_optimizer(self, params: list, train: PrimalSettings) -> torch.optim.Optimizer:
        import cooper

        from layerdescent.core.problem import ExtraSGD

        if train.optimizer == "adamw":
            raise ConfigError(
                "solver.scheme = 'extrapolation' has no extragradient AdamW: set train.optimizer = 'adam' (or 'sgd') and train.weight_decay as L2"
            )
        if train.optimizer == "sgd":
            return ExtraSGD(params, lr=train.lr, momentum=train.momentum, weight_decay=train.weight_decay)
        return cooper.optim.ExtraAdam(params, lr=train.lr, weight_decay=train.weight_decay)

    def cooper_optimizer(self, solver: PrimalDual, primal: torch.optim.Optimizer) -> cooper.optim.CooperOptimizer:
        import cooper

        from layerdescent.core.problem import ExtraSGD

        if not isinstance(primal, cooper.optim.ExtragradientOptimizer):
            raise ConfigError(
                f"solver.scheme = 'extrapolation' needs an extragradient primal optimizer (cooper.optim.ExtraAdam or ExtraSGD), "
                f"got {type(primal).__name__}: set train.optimizer = 'adam' or 'sgd'"
            )
        dual = ExtraSGD(solver.problem.dual_groups(), lr=solver.options.dual_lr, maximize=True)  # the options allow SGD alone here
        return cooper.optim.ExtrapolationConstrainedOptimizer(solver.problem.cmp, primal, dual)

    def step(self, solver: PrimalDual, closure: Callable[[], Any] | None) -> Observation:
        _required(closure, "extrapolation")
        seen = solver.take()
        if (dropped := solver.skip(seen)) is not None:
            return dropped
        solver.observe_step(seen)  # a window of one step (the options say so): always a dual gradient
        solver.optimizer.primal_extrapolation_step()
        solver.optimizer.dual_extrapolation_step()
        solver.zero_grad()
        closure()
        solver.observe_step(solver.take())
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


class PrimalDual(Solver):
    """Gradient descent on the Lagrangian in the model, projected ascent in the multipliers: the base for dual methods.

    The formulation (``options.formulation``) is the problem's; the scheme (``options.scheme``) is
    the order of one step's primal and dual updates, each on Cooper's constrained optimizer of the
    same name. A subclass changes how the multipliers move by overriding ``dual_gradient`` (what
    is put on them) or ``dual_step`` (how they step and are projected), and keeps its own state in
    ``state_dict`` beside the window's; docs/solvers.md is the contract.
    """

    name = "primal-dual"
    Options = PrimalDualOptions
    enforces_constraints = True

    def __init__(self, options: PrimalDualOptions, problem: LayerwiseProblem) -> None:
        import torch

        super().__init__(options, problem)
        if type(self).objective is not Solver.objective:  # a subclass's objective is the CMP's loss, for Cooper's roll() too
            problem.objective = self.objective
        self.max_multiplier = options.max_multiplier
        self.scheme = SCHEMES[options.scheme]()  # the strings of the config, as types from here on
        self.dual_window = DualWindow.of(options.dual_every)
        self._window = torch.zeros(problem.num_layers + 1)  # the sum of the steps' layer means since the last dual step
        self._count = 0
        self._window_violations: dict[str, torch.Tensor] | None = None  # a one-step window's violations, computed in its pass
        self._tables: Tables = {}  # per-group sums and counts since the last dual step

    @classmethod
    def gradient_passes(cls, options: PrimalDualOptions) -> int:
        return SCHEMES[options.scheme].passes

    @classmethod
    def check(cls, options: PrimalDualOptions, num_layers: int, constraints: tuple) -> list[str]:
        return [] if constraints else [f"solver.name = {cls.name!r} needs at least one [[constraints]] table (or use 'erm')"]

    @classmethod
    def outside_primal_step(cls, options: PrimalDualOptions) -> str | None:
        if not SCHEMES[options.scheme].after_outside_primal:
            return f"needs scheme = 'simultaneous' (got {options.scheme!r})"
        return None

    @classmethod
    def build_problem(
        cls, options: PrimalDualOptions, constraints: tuple, num_layers: int, band: tuple[float, ...] = (), rows: int | None = None
    ) -> LayerwiseProblem:
        """The Lagrangian, or Cooper's augmented Lagrangian with a penalty rho per entry."""
        from layerdescent.core.problem import LayerwiseProblem

        if options.formulation != "augmented-lagrangian":
            return LayerwiseProblem(constraints, num_layers, band=band, rows=rows)
        return LayerwiseProblem(
            constraints,
            num_layers,
            augmented=True,
            rho=options.penalty_coefficient,
            growth=options.penalty_growth,
            tolerance=options.penalty_tolerance,
            band=band,
            rows=rows,
        )

    @classmethod
    def primal_optimizer(cls, options: PrimalDualOptions, params: list, train: PrimalSettings) -> torch.optim.Optimizer:
        """The model's optimizer; Cooper's ExtraAdam or ExtraSGD under the extrapolation scheme."""
        return SCHEMES[options.scheme]().primal_optimizer(params, train) or super().primal_optimizer(options, params, train)

    def cooper_optimizer(self, primal: torch.optim.Optimizer) -> cooper.optim.CooperOptimizer:
        return self.scheme.cooper_optimizer(self, primal)

    def dual_optimizer(self) -> torch.optim.Optimizer:
        """The multipliers' optimizer the options name: SGD ascent (Cooper projects lambda >= 0 after it), or Cooper's nuPI."""
        import cooper
        import torch

        o, groups = self.options, self.problem.dual_groups()
        if o.dual_optimizer == "nupi":
            return cooper.optim.nuPI(groups, lr=o.dual_lr, Kp=o.nupi_kp, Ki=o.nupi_ki, ema_nu=o.nupi_ema, maximize=True)
        return torch.optim.SGD(groups, lr=o.dual_lr, maximize=True, foreach=False)  # a few entries: the single-tensor step

    # -- one micro-batch: one pass of the CMP ----------------------------------------------------

    def primal_loss(self, means: Any) -> torch.Tensor:
        return self.problem.primal_lagrangian(means)[0]

    def forward(self, batch: Any, weight: float = 1.0) -> torch.Tensor:
        import torch

        means = _means(batch)
        self._start(means, weight)
        if not torch.is_grad_enabled():  # a pass that only counts (the dual pass of alternating-primal-dual): no Lagrangian
            return super().forward(batch, weight)
        return self.scheme.forward(self, batch, means, weight)

    # -- the step, per scheme --------------------------------------------------------------------

    def step(self, closure: Callable[[], Any] | None = None) -> Observation:
        """The step of the scheme (``Simultaneous`` and the classes beside it): see docs/solvers.md for each one's order of calls."""
        return self.scheme.step(self, closure)

    def step_after_primal(self) -> Observation:
        problem = self.outside_primal_step(self.options)
        if problem:
            raise ConfigError(f"dual_step() follows a primal step taken elsewhere, which {problem}: use step() for it")
        return super().step_after_primal()

    # -- the dual side ---------------------------------------------------------------------------

    def observe_step(self, seen: Observation) -> bool:
        from layerdescent.core.grouping import add_tables

        if seen.tables:
            self._tables = add_tables(self._tables, seen.tables)
        if self.dual_window.steps == 1 and seen.violations and len(seen.violations) == len(self.problem.plain):
            self.dual_gradient(seen.violations, self._tables)  # a one-step window: the step's own violations, from its pass
            self._tables = {}
            return True
        self._window += seen.means.detach().to(self._window)
        self._count += 1
        self._window_violations = seen.violations if self._count == 1 else None
        return self.dual_window.full(self._count) and self._window_dual_gradient()

    def end_epoch(self) -> bool:
        return self.dual_window.per_epoch and self._count > 0 and self._window_dual_gradient()

    def _window_dual_gradient(self) -> bool:
        """Put the window's dual gradient on the multipliers (the caller steps them); True."""
        # The window holds expectations E[l_k] over its batches; specs are functions of them. A
        # one-step window's violations are its step's, computed in its pass: they are not computed again.
        import torch

        violations = self._window_violations if self._count == 1 else None
        if violations is None or len(violations) < len(self.problem.plain):  # none known, or a non-finite step's
            with torch.no_grad():
                violations = self.problem.violations((self._window / self._count).to(self.problem.device))
        self.dual_gradient(violations, self._tables)
        self._tables = {}
        self._window.zero_()
        self._count = 0
        self._window_violations = None
        return True

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

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"window": self._window.clone(), "count": self._count}
        if self._tables:  # only runs with constraints held per level or per sample have them
            state["group_window"] = {name: [sums.clone(), counts.clone()] for name, (sums, counts) in self._tables.items()}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._window = state["window"].clone()
        self._count = int(state["count"])
        self._window_violations = None
        self._tables = {name: (sums.clone(), counts.clone()) for name, (sums, counts) in state.get("group_window", {}).items()}


@hookimpl
def register_solvers(register) -> None:
    """The built-in solvers."""
    for solver in (ERM, Penalty, PrimalDual):
        register(solver)
