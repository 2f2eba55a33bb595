"""The constrained update for any training loop: layer losses in, the loss to backward out, then the steps.

    update = LayerwiseUpdate([Descent(alpha=0.05)], num_layers=4, optimizer=optimizer, dual_lr=0.5)
    for x, y in batches:
        update.zero_grad()
        update.backward(layer_losses(model, x, y))      # B x (L+1) per-sample losses
        update.step()                                   # the primal step, then the multipliers

``solver`` is a Solver subclass (``layerdescent.PrimalDual``, a plugin's class) with its options
as keywords, or a name: the core's own (``erm``, ``penalty``, ``primal-dual``), or a plugin's with
the registry that holds it (``registry=layerdescent.get_registry()``).

This is the front every loop calls the same way: the project's trainer, ``DescentTrainer`` and a
user's own loop. The solver behind it is the method (its formulation, scheme and dual update),
its scheme (``update.scheme``) takes the steps; this object holds the log line. Under gradient accumulation call ``backward`` once per
micro-batch (``weight`` = its share of the batch) and ``step`` once; under ``torch.distributed``
the layer means are averaged over ranks, once per step, before anything reads them. Schemes that
evaluate the batch twice (``alternating-primal-dual``, ``extrapolation``) need ``step(closure)``,
a closure that calls ``backward`` on the same batch again. docs/solvers.md has the call order.

A constraint held per level or per sample needs to know where each row came from:
``LayerwiseUpdate(..., band=[0.0, 0.8, 1.6], rows=len(train_set))`` and
``backward(losses, rows=indices, levels=band_indices)``.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from layerdescent.core.constraints import ConstraintSpec
from layerdescent.core.divergence import multiplier_problem
from layerdescent.core.grouping import LayerBatch
from layerdescent.core.observation import Observation
from layerdescent.core.penalty import Penalty
from layerdescent.core.problem import LayerwiseProblem
from layerdescent.core.solver import Solver
from layerdescent.core.solvers import ERM, PrimalDual
from layerdescent.errors import ConfigError, closest
from layerdescent.metric_names import line_scalars
from layerdescent.options import build_solver_options

if TYPE_CHECKING:  # a front above the core passes the registry; the core names its own solvers
    from layerdescent.registry import Registry

BUILT_IN: dict[str, type[Solver]] = {cls.name: cls for cls in (ERM, Penalty, PrimalDual)}


def checked_solver(
    constraints: Sequence[ConstraintSpec],
    num_layers: int,
    solver: str | type[Solver],
    registry: Registry | None = None,
    options: dict[str, Any] | None = None,
) -> tuple[type[Solver], Any]:
    """The solver's class and settings, once the constraints, the depth and the solver's options are checked: the one early check every front makes (a ConfigError, one line per problem).

    ``solver`` is a Solver subclass, or the name of a built-in one or of one in ``registry``.
    """
    for spec in constraints:
        if not isinstance(spec, ConstraintSpec):
            raise ConfigError(f"constraints must be ConstraintSpec objects such as layerdescent.Descent(alpha=0.05), got {spec!r}")
        spec.check_layers(num_layers)
    known = registry.solvers if registry is not None else BUILT_IN
    if isinstance(solver, type) and issubclass(solver, Solver):
        solver_cls = solver
    elif registry is not None:
        solver_cls = registry.solver(solver)
    elif solver in BUILT_IN:
        solver_cls = BUILT_IN[solver]
    else:
        raise ConfigError(
            f"solver {solver!r} is not built in ({', '.join(BUILT_IN)}){closest(str(solver), BUILT_IN)}: pass its class (solver=MySolver) or the registry that has it (registry=layerdescent.get_registry())"
        )
    settings = build_solver_options(solver_cls, options or {}, known.values())
    problems = solver_cls.check(settings, num_layers, tuple(constraints))
    if problems:
        raise ConfigError("\n".join(problems))
    return solver_cls, settings


class LayerwiseUpdate:
    """Descent constraints on a model's per-layer losses, solved by a registered solver through Cooper."""

    def __init__(
        self,
        constraints: Sequence[ConstraintSpec],
        num_layers: int,
        optimizer: torch.optim.Optimizer,
        solver: str | type[Solver] = "primal-dual",
        registry: Registry | None = None,
        band: Sequence[float] = (),
        rows: int | None = None,
        **options: Any,
    ) -> None:
        solver_cls, settings = checked_solver(constraints, num_layers, solver, registry, options)
        problem = solver_cls.build_problem(settings, tuple(constraints), num_layers, tuple(band), rows)
        self.solver: Solver = solver_cls(settings, problem)
        if (
            problem.groupings
            and solver_cls.enforces_constraints
            and self.solver.dual_window is None
            and solver_cls.observe is Solver.observe
        ):
            raise ConfigError(
                f"solver {solver_cls.name!r} does not update multipliers held per level or per sample (it has no dual window and does not override Solver.observe); drop levels and per_sample"
            )
        self.scheme = solver_cls.scheme_of(settings)(self.solver, optimizer)  # how a step runs: the primal and dual steps in order
        self.problem: LayerwiseProblem = problem  # the constraints' Cooper problem (multipliers, labels, groupings)
        self.optimizer = self.scheme.optimizer  # Cooper's optimizer of the scheme (the model's optimizer is its primal_optimizers[0])
        self.labels: dict[str, list[str]] = problem.labels  # each constraint's entry labels (l1<=l0, ...)
        self.line = LogLine(problem)  # the log line record() returns (its steps: those counted since the last)
        self._bound = self.solver.max_multiplier if self.solver.max_multiplier is not None else sys.float_info.max

    def to(self, device: torch.device | str) -> LayerwiseUpdate:
        """Move the multipliers (and penalties) to ``device``, where the losses are; returns self."""
        self.problem.cmp.to(device)
        return self

    def zero_grad(self) -> None:
        """Clear the model's gradients (each dual pass writes the multipliers' own afresh)."""
        self.scheme.zero_grad()

    def forward(
        self, losses: torch.Tensor, weight: float = 1.0, rows: torch.Tensor | None = None, levels: torch.Tensor | None = None
    ) -> torch.Tensor | None:
        """Count one micro-batch's losses (B x (L+1), or L+1 means) toward this step (``weight``: its share) and return its primal loss, for a loop that runs ``backward`` itself (a Hugging Face ``Trainer``, a loss scaler); under ``torch.no_grad()`` it only counts (a pass whose gradient is taken elsewhere) and returns None."""
        return self.problem.forward(self._batch(losses, rows, levels), weight)

    def backward(
        self, losses: torch.Tensor, weight: float = 1.0, rows: torch.Tensor | None = None, levels: torch.Tensor | None = None
    ) -> None:
        """Backpropagate ``weight`` x the primal loss of these layer losses and count them toward this step (``record()`` has their means).

        ``rows`` (each row's index in the training split) and ``levels`` (its level's index in the
        band) feed the constraints held per sample or per level.
        """
        loss = self.problem.forward(self._batch(losses, rows, levels), weight)
        if loss is not None and loss.requires_grad:
            (loss if weight == 1.0 else loss * weight).backward()  # times 1 changes no gradient: one node less

    def discard(self) -> None:
        """Drop this step: its counted losses and the model's gradients (a step a loop's own code refused, e.g. one fp16's scaler skipped)."""
        self.scheme.discard()

    def step(self, closure: Callable[[], Any] | None = None) -> Observation:
        """The primal step and the multipliers' step of the solver's scheme; ``closure`` re-runs the batch's ``backward`` calls.

        Returns what the step observed. A step whose layer means or violations are not finite is
        dropped, not taken (``skipped`` says why; the gradients are cleared); ``stop`` says when a
        multiplier left the finite range or passed ``max_multiplier`` (a loop should stop there).
        """
        return self._log(self.scheme.step(closure))

    def dual_step(self) -> Observation:
        """The multipliers' step alone, for a loop whose own code took the primal step (a Hugging Face ``Trainer``); what it observed, as ``step`` returns it."""
        return self._log(self.scheme.dual_step())

    def end_epoch(self) -> str | None:
        """Epoch boundary: the dual step of ``dual_every = "epoch"``; why a multiplier must stop the run after it (as ``stop``), or None."""
        return self._stop() if self.scheme.end_epoch() else None

    def multipliers(self) -> dict[str, torch.Tensor]:
        """Current lambda of each constraint."""
        return self.problem.multipliers()

    def record(self) -> dict[str, Any]:
        """The log line since the last call: layer losses, share of feasible steps, violations, and for constrained solvers multipliers, relaxations and penalties.

        ``loss`` and ``violation`` are means over the steps since the last record (a layer a step
        did not read, or a level it did not draw, is left out of its mean; null where no step saw it).
        A per-sample constraint reports each entry's mean over the rows, and ``binding_rows``, the
        share of rows with a positive multiplier.
        """
        out: dict[str, Any] = self.line.record() if self.line.steps else {}
        if self.solver.enforces_constraints:
            multipliers = self.multipliers()
            out["lambda"] = {k: _per_entry(v).tolist() for k, v in multipliers.items()}
            out["relaxation"] = {k: _per_entry(v).tolist() for k, v in relaxations(self.problem.specs, multipliers).items()}
            penalties = [(name, c.penalty_coefficient) for name, c in self.problem.constraints.items() if c.penalty_coefficient is not None]
            if penalties:  # the augmented Lagrangian's rho of each entry
                out["penalty"] = {name: rho.value.detach().tolist() for name, rho in penalties}
            if binding := {k: float((v > 0).any(dim=1).double().mean()) for k, v in multipliers.items() if v.dim() == 2}:
                out["binding_rows"] = binding
        return out

    def scalars(self) -> dict[str, float]:
        """``record()`` as the named values every front logs (``line_scalars``): ``train/lambda/NAME/LABEL``, ``train/loss/lK``, ...

        An entry no step of the line saw (a level not drawn) is left out.
        """
        line = self.record()
        # a solver that enforces nothing (erm) logs its multipliers too, at zero, so that runs compare column for column
        line.setdefault("lambda", {name: _per_entry(v).tolist() for name, v in self.multipliers().items()})
        return line_scalars(line, self.labels)

    def state_dict(self, primal: bool = True) -> dict[str, Any]:
        """Optimizer, multiplier and solver state, for checkpoints; ``primal=False`` leaves out the model's optimizer, for a loop whose own checkpoints hold it (Lightning's)."""
        optimizer = self.optimizer.state_dict()
        if not primal:
            optimizer = {"dual_optimizer_states": optimizer["dual_optimizer_states"]}
        return {"solver": {"optimizer": optimizer, **self.solver.state_dict()}, "problem": self.problem.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` saved (without the model's optimizer where it left it out)."""
        optimizer = state["solver"]["optimizer"]
        if "primal_optimizer_states" in optimizer:
            self.optimizer.load_state_dict(optimizer)
        else:  # the model's optimizer is restored by the loop that saved it
            for dual, saved in zip(self.optimizer.dual_optimizers or [], optimizer["dual_optimizer_states"] or []):
                dual.load_state_dict(saved)
        self.solver.load_state_dict(state["solver"])
        self.problem.load_state_dict(state["problem"])

    def _batch(self, losses: torch.Tensor, rows: torch.Tensor | None, levels: torch.Tensor | None) -> torch.Tensor | LayerBatch:
        """What the solver reads of one micro-batch: a LayerBatch where grouped constraints need each row, else the losses."""
        if not self.problem.groupings:
            return losses
        return LayerBatch.of(losses, rows, levels)

    def _stop(self) -> str | None:
        """Why the multipliers must stop the run (one not finite, or above the solver's ``max_multiplier``), or None."""
        if not self.solver.enforces_constraints:  # its multipliers never move
            return None
        # the tensors the dual optimizer steps in place, checked after each step against the solver's bound (none: finiteness alone)
        if not bool(torch.stack([c.multiplier.weight.detach().max() for c in self.problem.constraints.values()]).le(self._bound).all()):
            return multiplier_problem(self.problem, self.solver.max_multiplier)  # one test per step; NaN fails it too
        return None

    def _log(self, seen: Observation) -> Observation:
        """Count a taken step in the log line (its means, its violations where it brought them, its grouped constraints' per entry) and say whether a multiplier must stop the run."""
        if seen.means is None or seen.skipped:
            return seen
        if (stop := self._stop()) is not None:  # rare: the usual step hands on the solver's observation as it is
            seen = dataclasses.replace(seen, stop=stop)
        grouped = {}
        if seen.tables and bool(torch.isfinite(seen.means).all()):  # from the step's tables, summed over ranks
            with torch.no_grad():
                grouped = {name: _per_entry(v, nan_safe=True) for name, v in self.problem.violations(tables=seen.tables).items()}
        self.line.add(seen.means, seen.violations, grouped)
        return seen


def relaxations(specs: Sequence[ConstraintSpec], multipliers: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The optimal relaxation u = lambda / c of each resilient constraint, from its multipliers."""
    return {spec.name: multipliers[spec.name] / spec.resilience for spec in specs if spec.resilience}


def _per_entry(value: torch.Tensor, nan_safe: bool = False) -> torch.Tensor:
    """One value per label: a per-sample table's mean over its rows (over the rows seen, with ``nan_safe``)."""
    if value.dim() != 2:
        return value
    return value.nanmean(dim=0) if nan_safe else value.mean(dim=0)


def _seen_mean(total: Any, seen: Any) -> list[float | None]:
    """Sums over the steps that saw each entry, divided by their count; null for an entry no step saw."""
    return [value if count else None for value, count in zip((total / seen.clamp(min=1)).tolist(), seen.tolist())]


class LogLine:
    """What one log line reports, over the steps since the last line: each step is kept as it came and folded in batches, off the step's path."""

    FOLD = 64  # steps kept before they are folded into the sums (bounds memory where no line is ever asked for)

    def __init__(self, problem: LayerwiseProblem) -> None:
        self.problem = problem  # a step that brings no violations (a solver that enforces nothing) has them computed here, in one batch
        self.reset()

    def reset(self) -> None:
        """Start a new log line."""
        self.steps = 0
        self.full = 0  # steps that read every layer, so whose violations are known
        self.feasible = 0
        self.loss: Any = None
        self.counts: Any = None
        self.violation: dict[str, Any] = {}
        self.seen: dict[str, Any] = {}  # per entry, the steps that observed it (a level not drawn is NaN)
        self._kept: list[tuple[torch.Tensor, dict[str, torch.Tensor] | None, dict[str, torch.Tensor]]] = []

    def add(self, means: torch.Tensor, violations: dict[str, torch.Tensor] | None, grouped: dict[str, torch.Tensor] | None = None) -> None:
        """Count one step's layer means and violations (None: compute them from the means when the line is made)."""
        self.steps += 1
        self._kept.append((means, violations, grouped or {}))
        if len(self._kept) >= self.FOLD:
            self._fold()

    def _fold(self) -> None:
        """Add the kept steps to the sums."""
        if not self._kept:
            return
        means = torch.stack([m for m, _, _ in self._kept])
        read = ~torch.isnan(means)  # a step that read the last layer alone leaves the others NaN
        self.loss = _plus(self.loss, means.nan_to_num().sum(dim=0))
        self.counts = _plus(self.counts, read.float().sum(dim=0))
        full = read.all(dim=1).nonzero().flatten().tolist()
        if full:
            steps = [self._kept[i] for i in full]
            if all(v is not None and len(v) == len(self.problem.plain) for _, v, _ in steps):
                plain = {name: torch.stack([v[name] for _, v, _ in steps]) for name in (steps[0][1] or {})}
            else:
                with torch.no_grad():
                    plain = self.problem.violations(means[full])
            tables = {name: torch.stack([g[name] for _, _, g in steps]) for name in steps[0][2]}
            violations = {**plain, **tables}
            self.full += len(full)
            ok = torch.ones(len(full), dtype=torch.bool, device=means.device)
            for name, value in violations.items():
                ok &= ((value <= 0) | value.isnan()).all(dim=1)
                self.violation[name] = _plus(self.violation.get(name), value.nan_to_num().sum(dim=0))
                self.seen[name] = _plus(self.seen.get(name), (~value.isnan()).float().sum(dim=0))
            self.feasible += int(ok.sum())
        self._kept = []

    def record(self) -> dict[str, Any]:
        """The line's layer losses, share of feasible steps and violations, after which it starts again."""
        self._fold()
        full = max(self.full, 1)
        record: dict[str, Any] = {
            "loss": _seen_mean(self.loss, self.counts),  # null for a layer no step read (the last layer read alone)
            "feasible": self.feasible / full,
            # an entry no step of the line observed (a level not drawn) logs null; the others their mean over the steps that saw them
            "violation": {k: _seen_mean(v, self.seen[k]) for k, v in self.violation.items()},
        }
        self.reset()
        return record


def _plus(total: torch.Tensor | None, value: torch.Tensor) -> torch.Tensor:
    return value if total is None else total + value
