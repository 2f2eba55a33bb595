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
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Union

from layerdescent.core.divergence import why_not_finite
from layerdescent.errors import ConfigError
from layerdescent.hookspecs import hookimpl
from layerdescent.options import NoOptions

if TYPE_CHECKING:  # the registry loads solvers without torch or cooper; their methods run in training
    import cooper
    import torch

    from layerdescent.core.constraints import ConstraintSpec
    from layerdescent.core.problem import LayerwiseProblem
    from layerdescent.run.config import TrainConfig

Tables = dict  # constraint name -> (per-group loss sums G x (L+1), per-group row counts G)


@dataclass
class Observation:
    """What one optimizer step saw, over its micro-batches and every rank: the layer means, each constraint's violation there, and per-group sums."""

    means: Any = None  # L+1 weighted means (NaN where a step read the last layer alone); None before any micro-batch
    violations: dict[str, Any] | None = (
        None  # each plain constraint's violation at ``means`` (constrained solvers); None until known, empty when ``means`` is not finite
    )
    tables: Tables = field(default_factory=dict)  # each grouped constraint's per-group loss sums and row counts
    micro: int = 0  # micro-batches counted
    reduced: bool = False  # means averaged and tables summed over ranks (done once, by ``Solver.observed``)
    reusable: bool = True  # the one micro-batch's violations are those of ``means`` (weight 1, one rank)
    every_layer: bool = True  # False: a micro-batch read the last layer alone (the other means are NaN and unchecked)
    skipped: str | None = None  # why the step was dropped, not taken: a mean or violation it would train on was not finite
    stop: str | None = None  # why the run must stop after the step: a multiplier not finite or above max_multiplier (set by the front)


class Solver:
    """A registered solver: the objective, the primal and dual steps of its scheme, and the state they keep; subclass and register.

    The update front (:class:`~layerdescent.LayerwiseUpdate`) calls ``forward`` once per
    micro-batch, ``observed`` once the step's micro-batches are in, then ``step`` (or, after a primal
    step taken elsewhere, ``step_after_primal``); docs/solvers.md gives the order per scheme.
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
        self._seen = Observation()  # this step's, so far

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
    def primal_optimizer(cls, options: Any, params: list, train: TrainConfig) -> torch.optim.Optimizer:
        """The model's optimizer as ``train`` names it (sgd, adam, adamw)."""
        import torch

        if train.optimizer == "sgd":
            return torch.optim.SGD(params, lr=train.lr, momentum=train.momentum, weight_decay=train.weight_decay)
        cls_ = torch.optim.AdamW if train.optimizer == "adamw" else torch.optim.Adam
        return cls_(params, lr=train.lr, weight_decay=train.weight_decay)

    # -- the objective ---------------------------------------------------------------------------

    def cooper_optimizer(self, primal: torch.optim.Optimizer) -> cooper.optim.CooperOptimizer:
        """The Cooper optimizer that steps ``primal`` (and, for constrained solvers, the multipliers)."""
        import cooper

        return cooper.optim.UnconstrainedOptimizer(self.problem.cmp, primal)

    def attach(self, primal: torch.optim.Optimizer) -> None:
        """Build the Cooper optimizer around the model's optimizer (the front calls this once)."""
        self.optimizer = self.cooper_optimizer(primal)

    def objective(self, means: torch.Tensor) -> torch.Tensor:
        """What the primal step minimizes, before constraint terms."""
        return means[-1]

    def primal_loss(self, means: Any) -> torch.Tensor:
        """The differentiable quantity whose gradient the primal optimizer follows (of L+1 means, or a LayerBatch for grouped constraints)."""
        return self.objective(_means(means))

    # -- one micro-batch -------------------------------------------------------------------------

    def forward(self, batch: Any, weight: float = 1.0) -> torch.Tensor | None:
        """Count one micro-batch (L+1 means, the last layer's alone, or a LayerBatch) toward this step with ``weight``; its primal loss, unweighted (None under ``torch.no_grad()``: a pass that only counts)."""
        import torch

        from layerdescent.core.problem import LayerBatch

        means = _means(batch)
        if len(means) == 1 < self.problem.num_layers + 1:  # the last layer read alone: the others are NaN, left out of checks and means
            means = batch = torch.cat([means.new_full((self.problem.num_layers,), float("nan")), means])
            self._seen.every_layer = False
        self._start(means, weight)
        loss = self.primal_loss(batch) if torch.is_grad_enabled() else None
        tables = self.problem.group_tables(batch) if self.problem.groupings and isinstance(batch, LayerBatch) else {}
        self.count(means.detach(), weight, None, tables)
        return loss

    def _start(self, means: torch.Tensor, weight: float) -> None:
        """Fix the constraints' anchors from the run's first micro-batch, over every rank, before any Lagrangian needs them."""
        if self.problem.state is None:
            self.problem.start(_over_ranks(means.detach(), weight))

    def count(
        self, means: torch.Tensor, weight: float = 1.0, violations: dict[str, torch.Tensor] | None = None, tables: Tables | None = None
    ) -> None:
        """Add detached layer means (times ``weight``), and per-group tables, to this step's observation: the one accumulation path."""
        from layerdescent.core.problem import add_tables

        seen = self._seen
        term = means if weight == 1.0 else means * weight  # times 1 is exact: one op less on the usual path
        seen.means = term if seen.means is None else seen.means + term
        seen.reusable = seen.micro == 0 and weight == 1.0
        seen.violations = violations if seen.reusable else None
        if tables:
            seen.tables = add_tables(seen.tables, tables)
        seen.micro += 1
        seen.reduced = False

    def observed(self) -> Observation:
        """This step's observation over every rank (one all-reduce of means and tables), with its violations; the same object until the step is taken."""
        seen = self._seen
        if seen.reduced or seen.means is None:
            return seen
        if _world() > 1:
            _all_reduce(seen)
            seen.reusable = False
        if self.enforces_constraints and (not seen.reusable or seen.violations is None):
            import torch

            finite = bool(torch.isfinite(seen.means).all())  # a last-layer-only read leaves the other layers NaN: no violations
            with torch.no_grad():
                seen.violations = self.problem.violations(seen.means) if finite else {}
        seen.reduced = True  # a solver that enforces nothing leaves the violations to the log line, which takes them in one batch
        return seen

    def discard(self) -> None:
        """Drop this step's observation and the model's gradients (a skipped step)."""
        self._seen = Observation()
        self.zero_grad()

    def zero_grad(self) -> None:
        """Clear the model's gradients (each dual pass clears the multipliers' own before it writes them)."""
        for optimizer in self.optimizer.primal_optimizers:
            optimizer.zero_grad()

    def take(self) -> Observation:
        """This step's observation, over every rank; the next micro-batch starts a new one."""
        seen = self.observed()
        self._seen = Observation()
        return seen

    def skip(self, seen: Observation) -> bool:
        """Whether the step must be dropped: a mean or violation it would train on is not finite; if so, say why in ``seen.skipped`` and clear the gradients.

        Every ``step`` calls it on the observation it takes first, before any primal or dual step.
        """
        import torch

        if seen.means is None:
            return False
        values = seen.means if seen.every_layer else seen.means[-1:]
        if seen.every_layer and seen.violations:
            values = torch.cat([values, *seen.violations.values()])
        if bool(torch.isfinite(values).all()):  # the usual case: one test
            return False
        seen.skipped = why_not_finite(seen, self.problem.labels)
        self.zero_grad()
        return True

    # -- the step --------------------------------------------------------------------------------

    def step(self, closure: Callable[[], Any] | None = None) -> Observation:
        """The primal step, then whatever the solver keeps from the step's observation; the observation (for the log line), with ``skipped`` set where it was dropped."""
        seen = self.take()
        if self.skip(seen):
            return seen
        self.optimizer.primal_step()
        if seen.means is not None and self.observe_step(seen):  # erm and penalty never say so; a schedule may still count steps there
            self.dual_step()
        return seen

    def step_after_primal(self) -> Observation:
        """The step's dual side alone, after a primal step another loop took; the observation."""
        seen = self.take()
        if self.skip(seen):
            return seen
        if seen.means is not None and self.observe_step(seen):
            self.dual_step()
        return seen

    def observe_step(self, seen: Observation) -> bool:
        """Record one step's observation for the dual update; True when a dual gradient is on the multipliers (``dual_step`` follows)."""
        if seen.tables:
            self.observe_groups(seen.tables)
        return self.observe(seen.means)

    def observe(self, means: torch.Tensor) -> bool:
        """Record one step's layer means for the dual update; True when multipliers moved."""
        return False

    def observe_groups(self, tables: Tables) -> None:
        """Record one step's per-group loss sums and row counts of the constraints held per level or per sample (called before ``observe``)."""

    def dual_step(self) -> None:
        """Step the multipliers from the gradient ``observe_step`` or ``end_epoch`` put on them (Cooper's dual step also projects lambda >= 0)."""
        self.optimizer.dual_step()

    def end_epoch(self) -> bool:
        """Epoch boundary; True when a dual gradient is on the multipliers (``dual_step`` follows)."""
        return False

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps beyond the optimizers (nothing, by default)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` saved."""


def _means(batch: Any) -> torch.Tensor:
    """L+1 layer means of a LayerBatch, of B x (L+1) per-sample losses, or the means themselves."""
    losses = getattr(batch, "losses", batch)
    if losses.dim() != 2:
        return losses
    return losses.mean(dim=0) if len(losses) else losses.new_zeros(losses.shape[1])  # a rank with no rows in this micro-batch adds 0


def _world() -> int:
    """How many data-parallel ranks share this step (1 without torch.distributed)."""
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _over_ranks(means: torch.Tensor, weight: float) -> torch.Tensor:
    """One micro-batch's layer means over every rank, each rank's weighted by its share (these means on one rank)."""
    if _world() == 1:
        return means
    import torch
    import torch.distributed as dist

    flat = torch.cat([means * weight, torch.tensor([float(weight)], dtype=means.dtype, device=means.device)])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    return flat[:-1] / flat[-1]


def _all_reduce(seen: Observation) -> None:
    """Average the step's means over ranks and sum its tables, in one all-reduce (each rank saw its own rows)."""
    import torch
    import torch.distributed as dist

    parts = [seen.means, *(t.to(seen.means.dtype).flatten() for sums, counts in seen.tables.values() for t in (sums, counts))]
    flat = torch.cat(parts)
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    width = seen.means.numel()
    seen.means = flat[:width] / dist.get_world_size()
    offset, tables = width, {}
    for name, (sums, counts) in seen.tables.items():
        sums_, offset = flat[offset : offset + sums.numel()].view_as(sums).to(sums.dtype), offset + sums.numel()
        counts_, offset = flat[offset : offset + counts.numel()].view_as(counts).to(counts.dtype), offset + counts.numel()
        tables[name] = (sums_, counts_)
    seen.tables = tables


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
    def primal_optimizer(cls, options: PrimalDualOptions, params: list, train: TrainConfig) -> torch.optim.Optimizer:
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
        from layerdescent.core.problem import add_tables

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
