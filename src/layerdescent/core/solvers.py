"""Solvers: how a run turns layer losses into updates, each a registered plugin that chooses its step, driven through Cooper.

- ``erm``: minimize the last layer's loss; constraints are measured and logged, never enforced.
- ``penalty``: minimize fixed weights times the layer losses (deep supervision).
- ``primal-dual``: minimize the Lagrangian (or augmented Lagrangian) in the model, ascend it in the
  multipliers, with Cooper's simultaneous, alternating or extrapolation schemes. ``PrimalDual`` is
  the documented base for new dual methods (docs/solvers.md); its scheme and its dual window
  (``dual_every``) are types (``SCHEMES``, ``DualWindow``), chosen once from the options' strings.

A solver declares its ``[solver]`` keys as a frozen dataclass ``Options`` (checked like every
config table) and what the trainer and the report need as class attributes, so neither ever reads
a solver's name. It builds its Cooper problem (the formulation) and the multipliers' optimizer,
and names its scheme and dual window; the scheme (``core/solver.py``) takes the steps, and builds
the model's optimizer it needs. Third-party solvers register through the
``register_solvers`` hook.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Union

from layerdescent.core.penalty import Penalty
from layerdescent.core.solver import SCHEMES, Solver
from layerdescent.core.window import DualEvery, DualWindow
from layerdescent.errors import ConfigError
from layerdescent.hookspecs import hookimpl
from layerdescent.options import Choice

if TYPE_CHECKING:  # the registry loads solvers without torch or cooper; their methods run in training
    import torch

    from layerdescent.core.problem import LayerwiseProblem
    from layerdescent.core.solver import Simultaneous


class ERM(Solver):
    """Empirical risk minimization of the last layer's loss."""

    name = "erm"
    baseline = True
    trains_every_layer = False


class Formulation(Choice):
    """The problem Cooper solves: the Lagrangian, or the augmented Lagrangian with a penalty rho per entry."""

    LAGRANGIAN = "lagrangian"
    AUGMENTED = "augmented-lagrangian"


class Scheme(Choice):
    """How the primal and dual steps interleave: each names a scheme class of core/solver.py (``SCHEMES``)."""

    SIMULTANEOUS = "simultaneous"
    ALTERNATING = "alternating"
    ALTERNATING_PRIMAL_DUAL = "alternating-primal-dual"
    EXTRAPOLATION = "extrapolation"


class DualOptimizer(Choice):
    """The multipliers' optimizer: projected SGD ascent, or Cooper's nuPI."""

    SGD = "sgd"
    NUPI = "nupi"


@dataclass(frozen=True)
class PrimalDualOptions:
    """``primal-dual``'s keys: the formulation, the update scheme and the dual optimizer."""

    formulation: Formulation = Formulation.LAGRANGIAN
    """Cooper's Lagrangian, or its augmented Lagrangian with a penalty rho per entry."""
    # simultaneous: one pass, both steps from it; alternating: Cooper's dual-then-primal, one pass;
    # alternating-primal-dual: primal step, then the dual step from a second (no-grad) pass;
    # extrapolation: Cooper's extragradient, two passes a step (ExtraAdam/ExtraSGD).
    scheme: Scheme = Scheme.SIMULTANEOUS
    """How the primal and dual steps interleave (Cooper's constrained optimizers)."""
    dual_lr: float = 0.05
    """The multipliers' learning rate."""
    dual_optimizer: DualOptimizer = DualOptimizer.SGD
    """The multipliers' optimizer: projected SGD ascent, or Cooper's nuPI."""
    dual_every: Union[int, DualEvery] = 1
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
            (self.dual_every == DualEvery.EPOCH or self.dual_every >= 1, "solver.dual_every", "must be >= 1 (steps) or 'epoch'"),
            (0 <= self.nupi_ema < 1, "solver.nupi_ema", "must be in [0, 1)"),
            (self.penalty_coefficient > 0, "solver.penalty_coefficient", f"must be > 0, got {self.penalty_coefficient}"),
            (self.penalty_growth >= 1, "solver.penalty_growth", f"must be >= 1 (1 keeps rho fixed), got {self.penalty_growth}"),
            (self.penalty_tolerance >= 0, "solver.penalty_tolerance", f"must be >= 0, got {self.penalty_tolerance}"),
        )
        for ok, key, message in checks:
            if not ok:
                raise ConfigError(f"{key} {message}")
        if self.scheme == Scheme.EXTRAPOLATION and (self.dual_optimizer != DualOptimizer.SGD or self.dual_every != 1):
            raise ConfigError(
                "solver.scheme = 'extrapolation' steps the multipliers by extragradient every step: set dual_optimizer = 'sgd' and dual_every = 1"
            )
        if self.scheme == Scheme.ALTERNATING and self.dual_every == DualEvery.EPOCH:
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
        super().__init__(options, problem)
        self.max_multiplier = options.max_multiplier
        self.dual_window = DualWindow.of(options.dual_every, problem.num_layers + 1)

    @classmethod
    def scheme_of(cls, options: PrimalDualOptions) -> type[Simultaneous]:
        return SCHEMES[options.scheme]  # the config's string, as a type from here on

    @classmethod
    def check(cls, options: PrimalDualOptions, num_layers: int, constraints: tuple) -> list[str]:
        return [] if constraints else [f"solver.name = {cls.name!r} needs at least one [[constraints]] table (or use 'erm')"]

    @classmethod
    def build_problem(
        cls, options: PrimalDualOptions, constraints: tuple, num_layers: int, band: tuple[float, ...] = (), rows: int | None = None
    ) -> LayerwiseProblem:
        """The Lagrangian, or Cooper's augmented Lagrangian with a penalty rho per entry."""
        from layerdescent.core.problem import LayerwiseProblem

        if options.formulation != Formulation.AUGMENTED:
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

    def dual_optimizer(self) -> torch.optim.Optimizer:
        """The multipliers' optimizer the options name: SGD ascent (Cooper projects lambda >= 0 after it), or Cooper's nuPI."""
        import torch

        o, groups = self.options, self.problem.dual_groups()
        if o.dual_optimizer == DualOptimizer.NUPI:
            return nupi(groups, lr=o.dual_lr, kp=o.nupi_kp, ki=o.nupi_ki, ema=o.nupi_ema)
        return torch.optim.SGD(groups, lr=o.dual_lr, maximize=True, foreach=False)  # a few entries: the single-tensor step


def nupi(groups: list, lr: float, kp: float, ki: float, ema: float) -> torch.optim.Optimizer:
    """Cooper's nuPI ascent whose second update is right: its first step is SGD's, and it then holds xi_0 = e_0.

    Cooper 1.0's default initialization (``nuPIInitType.SGD``, xi_-1 = e_0) stores xi = 0 after the
    first step instead of xi_0 = e_0, so the second update's proportional term is Kp (1 - nu) e_1
    where it should be Kp (1 - nu) (e_1 - e_0) (cooper-org/cooper issue 107). The first error is set
    here, after the first step, for dense gradients (a multiplier held per sample has sparse ones,
    left to Cooper's own initialization).
    """
    import cooper

    class FirstErrorNuPI(cooper.optim.nuPI):
        def step(self, closure=None):
            first = [
                (p, p.grad.detach().clone())
                for group in self.param_groups
                for p in group["params"]
                if p.grad is not None and not p.grad.is_sparse and "xi" not in self.state[p]
            ]
            loss = super().step(closure)
            for p, error in first:
                if "xi" in self.state[p]:  # a proportional term: xi_0 = nu e_0 + (1 - nu) e_0
                    self.state[p]["xi"] = error
            return loss

    return FirstErrorNuPI(groups, lr=lr, Kp=kp, Ki=ki, ema_nu=ema, maximize=True)


@hookimpl
def register_solvers(register) -> None:
    """The built-in solvers."""
    for solver in (ERM, Penalty, PrimalDual):
        register(solver)
