"""The solver contract: what a registered solver implements, what one step observed, and the layer means reduced over ranks."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from layerdescent.core.divergence import why_not_finite
from layerdescent.options import NoOptions

if TYPE_CHECKING:  # the registry loads solvers without torch or cooper; their methods run in training
    import cooper
    import torch

    from layerdescent.core.constraints import ConstraintSpec
    from layerdescent.core.problem import LayerwiseProblem


class PrimalSettings(Protocol):
    """What a solver's primal optimizer reads of a run's [train] table (a ``TrainConfig``, or any object with these)."""

    optimizer: str
    lr: float
    momentum: float
    weight_decay: float


Tables = dict[str, tuple[Any, Any]]  # constraint name -> (per-group loss sums G x (L+1), per-group row counts G), tensors


@dataclass(frozen=True)
class Observation:
    """What one optimizer step saw, over its micro-batches and every rank: the layer means, each constraint's violation there, and per-group sums."""

    means: Any = None  # L+1 weighted means (NaN where a step read the last layer alone); None before any micro-batch
    violations: dict[str, Any] | None = (
        None  # each plain constraint's violation at ``means`` (constrained solvers); None when not computed, empty when ``means`` is not finite
    )
    tables: Tables = field(default_factory=dict)  # each grouped constraint's per-group loss sums and row counts
    micro: int = 0  # micro-batches counted
    every_layer: bool = True  # False: a micro-batch read the last layer alone (the other means are NaN and unchecked)
    skipped: str | None = None  # why the step was dropped, not taken: a mean or violation it would train on was not finite
    stop: str | None = None  # why the run must stop after the step: a multiplier not finite or above max_multiplier (set by the front)


@dataclass
class _Counted:
    """The step being counted, on this rank: its micro-batches' weighted means and per-group tables so far (the solver's own, never handed out)."""

    means: Any = None
    violations: dict[str, Any] | None = None  # the one micro-batch's, where they are those of ``means`` (weight 1)
    tables: Tables = field(default_factory=dict)
    micro: int = 0
    every_layer: bool = True
    observation: Observation | None = None  # the step over every rank, once asked for; the next micro-batch clears it


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
        self._seen = _Counted()  # this step's, so far

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

        from layerdescent.core.grouping import LayerBatch

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
        from layerdescent.core.grouping import add_tables

        seen = self._seen
        term = means if weight == 1.0 else means * weight  # times 1 is exact: one op less on the usual path
        # the one micro-batch's violations are those of the step's means (weight 1); a second makes them the sum's
        seen.violations = violations if seen.micro == 0 and weight == 1.0 else None
        seen.means = term if seen.means is None else seen.means + term
        if tables:
            seen.tables = add_tables(seen.tables, tables)
        seen.micro += 1
        seen.observation = None

    def observed(self) -> Observation:
        """This step's observation over every rank (one all-reduce of means and tables), with its violations; the same value until the step is taken."""
        seen = self._seen
        if seen.observation is not None:
            return seen.observation
        if seen.means is None:
            return Observation(every_layer=seen.every_layer)
        means, tables, violations = seen.means, seen.tables, seen.violations
        if (world := _ranks()) is not None:
            means, tables = _all_reduce(means, tables, world)
            violations = None  # this rank's alone
        if self.enforces_constraints and violations is None:
            import torch

            finite = bool(torch.isfinite(means).all())  # a last-layer-only read leaves the other layers NaN: no violations
            with torch.no_grad():
                violations = self.problem.violations(means) if finite else {}
        # a solver that enforces nothing leaves the violations to the log line, which takes them in one batch
        seen.observation = Observation(means, violations, tables, seen.micro, seen.every_layer)
        return seen.observation

    def discard(self) -> None:
        """Drop this step's observation and the model's gradients (a skipped step)."""
        self._seen = _Counted()
        self.zero_grad()

    def zero_grad(self) -> None:
        """Clear the model's gradients (each dual pass clears the multipliers' own before it writes them)."""
        for optimizer in self.optimizer.primal_optimizers:
            optimizer.zero_grad()

    def take(self) -> Observation:
        """This step's observation, over every rank; the next micro-batch starts a new one."""
        seen = self.observed()
        self._seen = _Counted()
        return seen

    def skip(self, seen: Observation) -> Observation | None:
        """The step dropped, where a mean or violation it would train on is not finite: ``seen`` with ``skipped`` saying why, the gradients cleared; else None.

        Every ``step`` calls it on the observation it takes first, before any primal or dual step,
        and returns what it gives instead of stepping.
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
        """The primal step, then whatever the solver keeps from the step's observation; the observation (for the log line), with ``skipped`` set where it was dropped."""
        seen = self.take()
        if (dropped := self.skip(seen)) is not None:
            return dropped
        self.optimizer.primal_step()
        if seen.means is not None and self.observe_step(seen):  # erm and penalty never say so; a schedule may still count steps there
            self.dual_step()
        return seen

    def step_after_primal(self) -> Observation:
        """The step's dual side alone, after a primal step another loop took; the observation."""
        seen = self.take()
        if (dropped := self.skip(seen)) is not None:
            return dropped
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


def _ranks() -> Any:
    """The ``World`` of the process group this process is in, whose ``sum`` is the one all-reduce; None on one process (the usual step asks nothing more)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return None
    from layerdescent.distributed import World

    return World.current()


def _over_ranks(means: torch.Tensor, weight: float) -> torch.Tensor:
    """One micro-batch's layer means over every rank, each rank's weighted by its share (these means on one rank)."""
    world = _ranks()
    if world is None:
        return means
    import torch

    flat = world.sum(torch.cat([means * weight, torch.tensor([float(weight)], dtype=means.dtype, device=means.device)]))
    return flat[:-1] / flat[-1]


def _all_reduce(means: torch.Tensor, tables: Tables, world: Any) -> tuple[torch.Tensor, Tables]:
    """The step's means averaged over the ranks of ``world`` and its tables summed, in one all-reduce (each rank saw its own rows)."""
    import torch

    parts = [means, *(t.to(means.dtype).flatten() for sums, counts in tables.values() for t in (sums, counts))]
    flat = world.sum(torch.cat(parts))
    width = means.numel()
    offset, reduced = width, {}
    for name, (sums, counts) in tables.items():
        sums_, offset = flat[offset : offset + sums.numel()].view_as(sums).to(sums.dtype), offset + sums.numel()
        counts_, offset = flat[offset : offset + counts.numel()].view_as(counts).to(counts.dtype), offset + counts.numel()
        reduced[name] = (sums_, counts_)
    return flat[:width] / world.size, reduced
