"""Solvers: how a run turns layer losses into updates, each a registered plugin driven through Cooper.

- ``erm``: minimize the last layer's loss; constraints are measured and logged, never enforced.
- ``penalty``: minimize fixed weights times the layer losses (deep supervision).
- ``primal-dual``: minimize the Lagrangian (or augmented Lagrangian) in the model, ascend it in the
  multipliers, with Cooper's simultaneous, alternating or extrapolation schemes.

A solver declares its ``[solver]`` keys as a frozen dataclass ``Options`` (checked like every
config table) and what the trainer and the report need as class attributes, so neither ever reads
a solver's name. Third-party solvers register through the ``register_solvers`` hook.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Union

from layerdescent.errors import ConfigError
from layerdescent.hookspecs import hookimpl

if TYPE_CHECKING:  # the registry loads solvers without torch or cooper; their methods run in training
    import cooper
    import torch

    from layerdescent.problem import LayerwiseProblem


@dataclass(frozen=True)
class NoOptions:
    """A solver with no [solver] keys beyond ``name``."""


class Solver:
    """The objective of the primal step and, for constrained solvers, the multiplier updates; subclass and register."""

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

    @classmethod
    def gradient_passes(cls, options: Any) -> int:
        """Forward and backward passes per optimizer step (2 for extragradient, whose primal optimizer must be Cooper's)."""
        return 1

    @classmethod
    def check(cls, options: Any, num_layers: int, constraints: tuple) -> list[str]:
        """Problems (one line each) that need the model's depth or the constraints; empty when the run can start."""
        return []

    def cooper_optimizer(self, primal: torch.optim.Optimizer) -> cooper.optim.CooperOptimizer:
        """The Cooper optimizer that steps ``primal`` (and, for constrained solvers, the multipliers)."""
        import cooper

        return cooper.optim.UnconstrainedOptimizer(self.problem.cmp, primal)

    def objective(self, means: torch.Tensor) -> torch.Tensor:
        """What the primal step minimizes, before constraint terms."""
        return means[-1]

    def primal_loss(self, means: torch.Tensor) -> torch.Tensor:
        """The differentiable quantity whose gradient the primal optimizer follows."""
        return self.objective(means)

    def observe(self, means: torch.Tensor) -> bool:
        """Record one step's layer means for the dual update; True when multipliers moved."""
        return False

    def observe_groups(self, tables: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Record one step's per-group loss sums and row counts of the constraints held per level or per sample (called before ``observe``)."""

    def end_epoch(self) -> bool:
        """Epoch boundary; True when multipliers moved."""
        return False

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps beyond the optimizers (nothing, by default)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` saved."""


class ERM(Solver):
    """Empirical risk minimization of the last layer's loss."""

    name = "erm"
    baseline = True
    trains_every_layer = False


@dataclass(frozen=True)
class PenaltyOptions:
    """``penalty``'s keys: the layer weights (all equal by default)."""

    penalty_weights: Union[tuple[float, ...], None] = None
    """A weight per layer 0..L; unset weighs all equally."""

    def __post_init__(self) -> None:
        if self.penalty_weights is not None:
            if not all(w >= 0 for w in self.penalty_weights):
                raise ConfigError("solver.penalty_weights must all be >= 0")
            if sum(self.penalty_weights) <= 0:
                raise ConfigError("solver.penalty_weights must not all be 0")


class Penalty(Solver):
    """Deep supervision: a fixed convex combination of all layer losses."""

    name = "penalty"
    Options = PenaltyOptions
    reference = True

    @classmethod
    def check(cls, options: PenaltyOptions, num_layers: int, constraints: tuple) -> list[str]:
        weights = options.penalty_weights
        if weights is not None and len(weights) != num_layers + 1:
            return [f"solver.penalty_weights has {len(weights)} entries; it needs one per layer 0..{num_layers}"]
        return []

    def objective(self, means: torch.Tensor) -> torch.Tensor:
        weights = self.options.penalty_weights
        if weights is None:
            return means.mean()
        import torch

        w = torch.tensor(weights, dtype=means.dtype, device=means.device)
        return (w * means).sum() / w.sum()


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
            raise ConfigError("solver.scheme = 'extrapolation' steps the multipliers by extragradient every step: set dual_optimizer = 'sgd' and dual_every = 1")
        if self.scheme == "alternating" and self.dual_every == "epoch":
            raise ConfigError("solver.scheme = 'alternating' updates lambda before each primal step: use dual_every = 1 (or a step count), or scheme = 'simultaneous'")


class PrimalDual(Solver):
    """Gradient descent on the Lagrangian in the model, projected ascent in the multipliers."""

    name = "primal-dual"
    Options = PrimalDualOptions
    enforces_constraints = True

    def __init__(self, options: PrimalDualOptions, problem: LayerwiseProblem) -> None:
        import torch

        super().__init__(options, problem)
        problem.objective = self.objective  # the CMP's loss, for Cooper's roll() too
        self.max_multiplier = options.max_multiplier
        self._window = torch.zeros(problem.num_layers + 1)
        self._count = 0
        self._tables: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}  # per-group sums and counts since the last dual step

    @classmethod
    def gradient_passes(cls, options: PrimalDualOptions) -> int:
        return 2 if options.scheme == "extrapolation" else 1

    @classmethod
    def check(cls, options: PrimalDualOptions, num_layers: int, constraints: tuple) -> list[str]:
        return [] if constraints else ["solver.name = 'primal-dual' needs at least one [[constraints]] table (or use 'erm')"]

    def cooper_optimizer(self, primal: torch.optim.Optimizer) -> cooper.optim.CooperOptimizer:
        import cooper

        o = self.options
        if o.scheme == "extrapolation":
            if not isinstance(primal, cooper.optim.ExtragradientOptimizer):
                raise ConfigError(
                    f"solver.scheme = 'extrapolation' needs an extragradient primal optimizer (cooper.optim.ExtraAdam or ExtraSGD), "
                    f"got {type(primal).__name__}: set train.optimizer = 'adam' or 'sgd'"
                )
            return cooper.optim.ExtrapolationConstrainedOptimizer(self.problem.cmp, primal, self.problem.dual_optimizer("extra-sgd", o.dual_lr))
        dual = self.problem.dual_optimizer(o.dual_optimizer, o.dual_lr, o.nupi_kp, o.nupi_ki, o.nupi_ema)
        scheme = {
            "simultaneous": cooper.optim.SimultaneousOptimizer,
            "alternating": cooper.optim.AlternatingDualPrimalOptimizer,
            "alternating-primal-dual": cooper.optim.AlternatingPrimalDualOptimizer,
        }[o.scheme]
        return scheme(self.problem.cmp, primal, dual)

    def primal_loss(self, means: torch.Tensor) -> torch.Tensor:
        # dual=False: the multipliers step from the window of dual_every, not from this pass
        return self.problem.cmp.compute_cmp_state(means, dual=False).compute_primal_lagrangian().lagrangian

    def observe_groups(self, tables: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
        from layerdescent.problem import add_tables  # the registry loads solvers without torch

        self._tables = add_tables(self._tables, tables)

    def observe(self, means: torch.Tensor) -> bool:
        self._window += means.detach().to(self._window)
        self._count += 1
        every = self.options.dual_every
        return every != "epoch" and self._count >= every and self._dual_gradient()

    def end_epoch(self) -> bool:
        return self.options.dual_every == "epoch" and self._count > 0 and self._dual_gradient()

    def _dual_gradient(self) -> bool:
        """Put the window's dual gradient on the multipliers (the caller steps them); True."""
        # The window holds expectations E[l_k] over its batches; specs are functions of them.
        import torch

        means = (self._window / self._count).to(self.problem.device)
        with torch.no_grad():
            state = self.problem.cmp.compute_cmp_state(means, primal=False)
        self.problem.dual_gradient(state)
        self.problem.grow_penalties(state)
        if self.problem.groupings:
            self.problem.grouped_dual_gradient(self._tables)
            self._tables = {}
        self._window.zero_()
        self._count = 0
        return True

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"window": self._window.clone(), "count": self._count}
        if self._tables:  # only runs with constraints held per level or per sample have them
            state["group_window"] = {name: [sums.clone(), counts.clone()] for name, (sums, counts) in self._tables.items()}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._window = state["window"].clone()
        self._count = int(state["count"])
        self._tables = {name: (sums.clone(), counts.clone()) for name, (sums, counts) in state.get("group_window", {}).items()}


@hookimpl
def register_solvers(register) -> None:
    """The built-in solvers."""
    for solver in (ERM, Penalty, PrimalDual):
        register(solver)
