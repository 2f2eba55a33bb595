"""The constrained update for any training loop: layer losses in, the loss to backward out, then the steps.

    update = LayerwiseUpdate([Descent(alpha=0.05)], num_layers=4, optimizer=optimizer, dual_lr=0.5)
    for x, y in batches:
        update.zero_grad()
        update.backward(layer_losses(model, x, y))      # B x (L+1) per-sample losses
        update.step()                                   # the primal step, then the multipliers

The trainer drives runs through this same object, so there is one implementation of the update.
Under gradient accumulation call ``backward`` once per micro-batch (``weight`` = its share of
the batch) and ``step`` once; under ``torch.distributed`` the layer means are averaged over ranks
before the dual step. Schemes that evaluate the batch twice (``alternating-primal-dual``,
``extrapolation``) need ``step(closure)``, a closure that calls ``backward`` on the same batch again.

A constraint held per level or per sample needs to know where each row came from:
``LayerwiseUpdate(..., band=[0.0, 0.8, 1.6], rows=len(train_set))`` and
``backward(losses, rows=indices, levels=band_indices)``.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist

from layerdescent.constraints import ConstraintSpec
from layerdescent.errors import ConfigError
from layerdescent.problem import LayerBatch, LayerwiseProblem, add_tables
from layerdescent.registry import Registry, get_registry
from layerdescent.solvers import Solver


class LayerwiseUpdate:
    """Descent constraints on a model's per-layer losses, solved by a registered solver through Cooper."""

    def __init__(
        self,
        constraints: Sequence[ConstraintSpec],
        num_layers: int,
        optimizer: torch.optim.Optimizer,
        solver: str = "primal-dual",
        sync: bool = True,
        registry: Registry | None = None,
        band: Sequence[float] = (),
        rows: int | None = None,
        **options: Any,
    ) -> None:
        from layerdescent.config import build_solver_options  # config imports this module's neighbours

        solver_cls = (registry or get_registry()).solver(solver)
        settings = build_solver_options(solver_cls, options)
        problems = solver_cls.check(settings, num_layers, tuple(constraints))
        if problems:
            raise ConfigError("\n".join(problems))
        self.problem = _problem(tuple(constraints), num_layers, settings, tuple(band), rows)
        self.solver: Solver = solver_cls(settings, self.problem)
        if self.problem.groupings and solver_cls.enforces_constraints and solver_cls.observe_groups is Solver.observe_groups:
            raise ConfigError(f"solver {solver_cls.name!r} does not update multipliers held per level or per sample (it does not override Solver.observe_groups); drop levels and per_sample")
        self.optimizer = self.solver.cooper_optimizer(optimizer)
        self.sync = sync  # False when the caller averages the means over ranks itself (the trainer does)
        self._pending: torch.Tensor | None = None  # this step's weighted layer means, so far
        self._tables: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}  # this step's per-group loss sums and counts, so far
        self.last_tables: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}  # the last step's, over all ranks
        self._taken: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self._passes = 0  # backward calls since the last step (alternating allows one)

    @property
    def labels(self) -> dict[str, list[str]]:
        """Each constraint's entry labels (``l1<=l0``, ...)."""
        return self.problem.labels

    def zero_grad(self) -> None:
        """Clear the model's gradients (each dual pass clears the multipliers' own before it writes them)."""
        for optimizer in self.optimizer.primal_optimizers:
            optimizer.zero_grad()

    def loss(self, losses: torch.Tensor, rows: torch.Tensor | None = None, levels: torch.Tensor | None = None) -> torch.Tensor:
        """The primal loss (objective plus multiplier-weighted violations) of B x (L+1) per-sample losses or L+1 means.

        ``rows`` and ``levels`` say where each row came from, for constraints held per sample or per level.
        """
        if self.problem.groupings and self.solver.enforces_constraints and losses.dim() == 2:
            return self.solver.primal_loss(LayerBatch(losses, rows, levels))
        return self.solver.primal_loss(_means(losses))

    def observe(self, means: torch.Tensor, weight: float = 1.0) -> None:
        """Count these layer means (detached) with ``weight`` toward this step's dual update."""
        term = means.detach() * weight
        self._pending = term if self._pending is None else self._pending + term

    def observe_rows(self, losses: torch.Tensor, rows: torch.Tensor | None = None, levels: torch.Tensor | None = None) -> None:
        """Count B x (L+1) per-row losses toward this step's dual update of the constraints held per level or per sample (``backward`` does this itself)."""
        if not self.problem.groupings:
            return
        if losses.dim() != 2:
            raise ConfigError("constraints held per level or per sample need the B x (L+1) per-row losses, not their means")
        self._tables = add_tables(self._tables, self.problem.group_tables(LayerBatch(losses, rows, levels)))

    def backward(self, losses: torch.Tensor, weight: float = 1.0, observe: bool = True, rows: torch.Tensor | None = None, levels: torch.Tensor | None = None) -> torch.Tensor:
        """Backpropagate ``weight`` x the primal loss of these layer losses and count their means; return the means.

        ``observe = False`` leaves the counting of the means to the caller (``observe``), as the
        trainer does with the means it averaged over ranks itself. ``rows`` (each row's index in the
        training split) and ``levels`` (its level's index in the band) feed the constraints held per
        sample or per level, whose per-group sums are always counted here and summed over ranks.
        """
        self.observe_rows(losses, rows, levels)
        means = _means(losses)
        if observe:
            self.observe(means, weight)
        if self._alternating() and torch.is_grad_enabled():
            if self._passes:
                raise ConfigError("solver.scheme = 'alternating' steps lambda from the whole batch before its primal step: accumulate no micro-batches (train.accumulate = 1)")
            self._dual(self._take())  # Cooper's dual-then-primal: lambda first, from this batch
        self._passes += 1
        if torch.is_grad_enabled() and means.requires_grad:
            (self.loss(losses, rows, levels) * weight).backward()
        return means.detach()

    def step(self, closure: Callable[[], Any] | None = None) -> None:
        """The primal step and the multipliers' step of the scheme; ``closure`` re-runs the batch's ``backward`` calls."""
        self._passes = 0
        evaluations = self.solver.gradient_evaluations
        if evaluations == 2:  # extragradient: step to the midpoint, re-evaluate there, step from the start
            self._require(closure, "extrapolation")
            self._dual_gradient(self._take())
            self.optimizer.primal_extrapolation_step()
            self.optimizer.dual_extrapolation_step()
            self.zero_grad()
            closure()
            self._passes = 0
            self._dual_gradient(self._take())
            self.optimizer.primal_step()
            self.optimizer.dual_step()
            return
        self.optimizer.primal_step()
        if self._alternating():
            self._take()  # its dual step came before the primal one, in backward()
            return
        if self.solver.enforces_constraints and getattr(self.solver.options, "scheme", "") == "alternating-primal-dual":
            self._require(closure, "alternating-primal-dual")
            self._take()
            with torch.no_grad():  # lambda follows the updated model: only the means are needed
                closure()
            self._passes = 0
        self._after_primal()

    def dual_step(self) -> None:
        """The multipliers' step alone, for a loop whose own code took the primal step (a Hugging Face ``Trainer``)."""
        scheme = getattr(self.solver.options, "scheme", "simultaneous")
        if self.solver.gradient_evaluations != 1 or (self.solver.enforces_constraints and scheme != "simultaneous"):
            raise ConfigError(f"dual_step() follows a primal step taken elsewhere, which only scheme = 'simultaneous' allows (got {scheme!r}): use step() for it")
        self._passes = 0
        self._after_primal()

    def end_epoch(self) -> None:
        """Epoch boundary: the dual step of ``dual_every = "epoch"``."""
        if self.solver.end_epoch():
            self.optimizer.dual_step()

    def multipliers(self) -> dict[str, torch.Tensor]:
        """Current lambda of each constraint."""
        return self.problem.multipliers()

    def relaxations(self) -> dict[str, torch.Tensor]:
        """The optimal relaxation u = lambda / c of each resilient constraint."""
        return self.problem.relaxations()

    def violations(self, means: torch.Tensor) -> dict[str, torch.Tensor]:
        """Each constraint's violation at these layer means (positive: violated)."""
        with torch.no_grad():
            return self.problem.violations(means)

    def record(self) -> dict[str, Any]:
        """What a log line reports of the dual side: for constrained solvers, multipliers, relaxations and penalties.

        A per-sample constraint reports each entry's mean over the rows, and ``binding_rows``, the
        share of rows with a positive multiplier.
        """
        out: dict[str, Any] = {}
        if self.solver.enforces_constraints:
            out["lambda"] = {k: _per_entry(v).tolist() for k, v in self.multipliers().items()}
            out["relaxation"] = {k: _per_entry(v).tolist() for k, v in self.relaxations().items()}
            if penalties := self.problem.penalties():
                out["penalty"] = {k: v.tolist() for k, v in penalties.items()}
            if binding := {k: float((v > 0).any(dim=1).double().mean()) for k, v in self.multipliers().items() if v.dim() == 2}:
                out["binding_rows"] = binding
        return out

    def grouped_violations(self) -> dict[str, torch.Tensor]:
        """The last step's violation of each constraint held per level or per sample, per entry (mean over its rows), NaN where unseen."""
        with torch.no_grad():
            violations = self.problem.group_violations(self.last_tables)
        return {name: _per_entry(v, nan_safe=True) for name, v in violations.items()}

    def state_dict(self) -> dict[str, Any]:
        """Optimizer, multiplier and solver state, for checkpoints."""
        return {"solver": {"optimizer": self.optimizer.state_dict(), **self.solver.state_dict()}, "problem": self.problem.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` saved."""
        self.optimizer.load_state_dict(state["solver"]["optimizer"])
        self.solver.load_state_dict(state["solver"])
        self.problem.load_state_dict(state["problem"])

    def _after_primal(self) -> None:
        """The dual side of a step once its primal step is taken: lambda from this step's means."""
        means = self._take()
        if not self.solver.enforces_constraints:
            if means is not None:
                self.solver.observe(means)  # no multipliers to step: a solver may still keep a schedule
            return
        self._dual(means)

    def _alternating(self) -> bool:
        return self.solver.enforces_constraints and getattr(self.solver.options, "scheme", "") == "alternating"

    def _take(self) -> torch.Tensor | None:
        """This step's layer means, averaged over ranks when asked, and its group tables, summed over ranks; the count starts again."""
        means, self._pending = self._pending, None
        distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
        if means is not None and self.sync and distributed:
            means = means.clone()
            dist.all_reduce(means, op=dist.ReduceOp.SUM)
            means /= dist.get_world_size()
        tables, self._tables = self._tables, {}
        if tables and distributed:  # sums and counts add up over ranks: each rank saw its own rows
            for sums, counts in tables.values():
                dist.all_reduce(sums, op=dist.ReduceOp.SUM)
                dist.all_reduce(counts, op=dist.ReduceOp.SUM)
        self._taken = tables  # for the dual step that may follow; a discarded pass is replaced by the next take
        if tables:
            self.last_tables = tables
        return means

    def _dual_gradient(self, means: torch.Tensor | None) -> bool:
        if means is None:
            return False
        if self._taken:
            self.solver.observe_groups(self._taken)
            self._taken = {}
        return self.solver.observe(means)

    def _dual(self, means: torch.Tensor | None) -> None:
        if self._dual_gradient(means):
            self.optimizer.dual_step()  # also projects lambda >= 0 (multiplier.post_step_)

    def _require(self, closure: Callable[[], Any] | None, scheme: str) -> None:
        if closure is None:
            raise TypeError(f"solver.scheme = {scheme!r} evaluates each batch twice: pass step(closure), a function that calls backward() on the batch again")


def _means(losses: torch.Tensor) -> torch.Tensor:
    """L+1 layer means from B x (L+1) per-sample losses (or the means themselves)."""
    return losses.mean(dim=0) if losses.dim() == 2 else losses


def _per_entry(value: torch.Tensor, nan_safe: bool = False) -> torch.Tensor:
    """One value per label: a per-sample table's mean over its rows (over the rows seen, with ``nan_safe``)."""
    if value.dim() != 2:
        return value
    return value.nanmean(dim=0) if nan_safe else value.mean(dim=0)


def _problem(constraints: tuple[ConstraintSpec, ...], num_layers: int, options: Any, band: tuple[float, ...] = (), rows: int | None = None) -> LayerwiseProblem:
    """The CMP of these constraints in the formulation ``options`` name (a plain Lagrangian without one)."""
    if getattr(options, "formulation", "lagrangian") != "augmented-lagrangian":
        return LayerwiseProblem(constraints, num_layers, band=band, rows=rows)
    return LayerwiseProblem(constraints, num_layers, augmented=True, rho=options.penalty_coefficient, growth=options.penalty_growth, tolerance=options.penalty_tolerance, band=band, rows=rows)
