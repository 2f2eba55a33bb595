"""Solvers: how a run turns layer losses into updates, each a registered plugin that owns its whole step, driven through Cooper.

- ``erm``: minimize the last layer's loss; constraints are measured and logged, never enforced.
- ``penalty``: minimize fixed weights times the layer losses (deep supervision).
- ``primal-dual``: minimize the Lagrangian (or augmented Lagrangian) in the model, ascend it in the
  multipliers, with Cooper's simultaneous, alternating or extrapolation schemes. ``PrimalDual`` is
  the documented base for new dual methods (docs/solvers.md).

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
from typing import TYPE_CHECKING, Any, Literal, Union

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
        self._window = torch.zeros(problem.num_layers + 1)  # the sum of the steps' layer means since the last dual step
        self._count = 0
        self._window_violations: dict[str, torch.Tensor] | None = None  # a one-step window's violations, computed in its pass
        self._tables: Tables = {}  # per-group sums and counts since the last dual step

    @classmethod
    def gradient_passes(cls, options: PrimalDualOptions) -> int:
        return 2 if options.scheme == "extrapolation" else 1

    @classmethod
    def check(cls, options: PrimalDualOptions, num_layers: int, constraints: tuple) -> list[str]:
        return [] if constraints else [f"solver.name = {cls.name!r} needs at least one [[constraints]] table (or use 'erm')"]

    @classmethod
    def outside_primal_step(cls, options: PrimalDualOptions) -> str | None:
        if options.scheme != "simultaneous":
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
        if options.scheme != "extrapolation":
            return super().primal_optimizer(options, params, train)
        import cooper

        from layerdescent.core.problem import ExtraSGD

        if train.optimizer == "adamw":
            raise ConfigError(
                "solver.scheme = 'extrapolation' has no extragradient AdamW: set train.optimizer = 'adam' (or 'sgd') and train.weight_decay as L2"
            )
        if train.optimizer == "sgd":
            return ExtraSGD(params, lr=train.lr, momentum=train.momentum, weight_decay=train.weight_decay)
        return cooper.optim.ExtraAdam(params, lr=train.lr, weight_decay=train.weight_decay)

    def cooper_optimizer(self, primal: torch.optim.Optimizer) -> cooper.optim.CooperOptimizer:
        import cooper

        o = self.options
        if o.scheme == "extrapolation":
            if not isinstance(primal, cooper.optim.ExtragradientOptimizer):
                raise ConfigError(
                    f"solver.scheme = 'extrapolation' needs an extragradient primal optimizer (cooper.optim.ExtraAdam or ExtraSGD), "
                    f"got {type(primal).__name__}: set train.optimizer = 'adam' or 'sgd'"
                )
            return cooper.optim.ExtrapolationConstrainedOptimizer(
                self.problem.cmp, primal, self.problem.dual_optimizer("extra-sgd", o.dual_lr)
            )
        dual = self.problem.dual_optimizer(o.dual_optimizer, o.dual_lr, o.nupi_kp, o.nupi_ki, o.nupi_ema)
        scheme = {
            "simultaneous": cooper.optim.SimultaneousOptimizer,
            "alternating": cooper.optim.AlternatingDualPrimalOptimizer,
            "alternating-primal-dual": cooper.optim.AlternatingPrimalDualOptimizer,
        }[o.scheme]
        return scheme(self.problem.cmp, primal, dual)

    # -- one micro-batch: one pass of the CMP ----------------------------------------------------

    def primal_loss(self, means: Any) -> torch.Tensor:
        return self.problem.primal_lagrangian(means)[0]

    def forward(self, batch: Any, weight: float = 1.0) -> torch.Tensor:
        import torch

        means = _means(batch)
        self._start(means, weight)
        if not torch.is_grad_enabled():  # a pass that only counts (the dual pass of alternating-primal-dual): no Lagrangian
            return super().forward(batch, weight)
        if self.options.scheme == "alternating":
            return self._dual_then_primal(batch, means, weight)
        # one pass, whose violations serve the Lagrangian, the checks, the dual step and the log; lambda steps from the window of dual_every
        lagrangian, violations, tables = self.problem.primal_lagrangian(batch)
        self.count(means.detach(), weight, violations, tables)
        return lagrangian

    def _dual_then_primal(self, batch: Any, means: torch.Tensor, weight: float) -> torch.Tensor:
        """The alternating scheme's pass (Cooper's dual-then-primal): lambda steps first, from this whole batch over every rank, then the primal Lagrangian reads it."""
        import torch

        state, violations, tables = self.problem.observe(batch, dual=False)
        self.count(means.detach(), weight, violations, tables)
        if self._seen.micro > 1:
            raise ConfigError(
                "solver.scheme = 'alternating' steps lambda from the whole batch before its primal step: accumulate no micro-batches (train.accumulate = 1)"
            )
        seen = self.observed()
        # a non-finite batch is skipped in step(), before lambda reads it
        if bool(torch.isfinite(seen.means).all()) and self.observe_step(seen):
            self.dual_step()
        return state.compute_primal_lagrangian().lagrangian

    # -- the step, per scheme --------------------------------------------------------------------

    def step(self, closure: Callable[[], Any] | None = None) -> Observation:
        """The step of ``options.scheme``: see docs/solvers.md for each one's order of calls."""
        scheme = self.options.scheme
        if scheme == "extrapolation":  # step to the midpoint, re-evaluate there, step from the start
            _require(closure, scheme)
            seen = self.take()
            if self.skip(seen):
                return seen
            self.observe_step(seen)  # dual_every = 1: always a dual gradient
            self.optimizer.primal_extrapolation_step()
            self.optimizer.dual_extrapolation_step()
            self.zero_grad()
            closure()
            self.observe_step(self.take())
            self.optimizer.primal_step()
            self.dual_step()
            return seen
        seen = self.take()
        if self.skip(seen):
            return seen
        self.optimizer.primal_step()
        if scheme == "alternating":
            return seen  # its dual step came before the primal one, in forward()
        if scheme == "alternating-primal-dual":
            _require(closure, scheme)
            import torch

            with torch.no_grad():  # lambda follows the updated model: only the means are needed
                closure()
            again = self.take()
            if again.means is not None and self.observe_step(again):
                self.dual_step()
            return seen
        if seen.means is not None and self.observe_step(seen):
            self.dual_step()
        return seen

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
        every = self.options.dual_every
        if every == 1 and seen.violations and len(seen.violations) == len(self.problem.plain):
            self.dual_gradient(seen.violations, self._tables)  # a one-step window: the step's own violations, from its pass
            self._tables = {}
            return True
        self._window += seen.means.detach().to(self._window)
        self._count += 1
        self._window_violations = seen.violations if self._count == 1 else None
        return every != "epoch" and self._count >= every and self._window_dual_gradient()

    def end_epoch(self) -> bool:
        return self.options.dual_every == "epoch" and self._count > 0 and self._window_dual_gradient()

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


def _require(closure: Callable[[], Any] | None, scheme: str) -> None:
    if closure is None:
        raise TypeError(
            f"solver.scheme = {scheme!r} evaluates each batch twice: pass step(closure), a function that calls backward() on the batch again"
        )


@hookimpl
def register_solvers(register) -> None:
    """The built-in solvers."""
    for solver in (ERM, Penalty, PrimalDual):
        register(solver)
