"""The run's constraint specs compiled into one Cooper CMP, with multipliers and penalties, and the micro-batches of a step counted through it.

Cooper's sharp edges stay here: constraints register by attribute after ``super().__init__()``,
each spec gets a ``DenseMultiplier`` sized to its violation vector, the dual optimizer has
``maximize=True`` and its parameters in registration order, and resilience (a quadratic
relaxation cost (c/2)||u||^2) is the dual weight decay 1/c, its exact closed form (u = lambda / c).

A spec held per level or per sample (``levels``, ``per_sample``) gets an ``IndexedMultiplier``
over its groups x entries instead: a group is a level of the band, a training row, or a
(row, level) pair. Only the groups a batch holds enter its Lagrangian and its dual step, so a
multiplier moves only when its level was drawn or its row was in the batch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import cooper
import torch

from layerdescent.core.constraints import ConstraintSpec
from layerdescent.core.grouping import Grouping, LayerBatch, add_tables, grouped_violation
from layerdescent.core.observation import Observation, Tables
from layerdescent.errors import ConfigError, PluginError


def layer_means(batch: Any) -> torch.Tensor:
    """L+1 layer means of a LayerBatch, of B x (L+1) per-sample losses, or the means themselves: the one place they are taken."""
    losses = getattr(batch, "losses", batch)
    if losses.dim() != 2:
        return losses
    return losses.mean(dim=0) if len(losses) else losses.new_zeros(losses.shape[1])  # a rank with no rows in this micro-batch adds 0


class LayerwiseCMP(cooper.ConstrainedMinimizationProblem):
    """The layerwise problem as a Cooper CMP: a micro-batch's layer losses in, the objective and every constraint's violation out, for Cooper's ``roll()`` as for the trainer."""

    def __init__(self, problem: LayerwiseProblem) -> None:
        super().__init__()
        self._problem = problem

    def compute_cmp_state(self, layer_losses: Any, primal: bool = True, dual: bool = True) -> cooper.CMPState:
        """The CMPState of B x (L+1) layer losses, their L+1 means, a LayerBatch (or a callable returning one, as ``roll()`` passes) or a dual window's Observation.

        The loss is the solver's objective; ``primal = False`` (a dual pass) leaves it out and
        ``dual = False`` leaves the dual update to a step of its own (the window of ``dual_every``).
        Every kind of constraint is observed here: pooled ones from the layer means, those held per
        level or per sample from a LayerBatch, which says where its rows come from, or from a
        window's per-group tables. ``misc`` holds what the step's observation and the log line
        take: ``means`` and ``violations`` (detached) and ``tables``, each grouped constraint's
        per-group loss sums and row counts.
        """
        problem = self._problem
        batch = layer_losses() if callable(layer_losses) else layer_losses
        if isinstance(batch, Observation):  # a dual window: its plain violations are known, its grouped ones are in its tables
            means, violations, tables, rows = batch.means, batch.violations or {}, batch.tables, None
        else:
            means = layer_means(batch)
            violations = problem._plain_violations(means)
            tables, rows = {}, None
            if isinstance(batch, LayerBatch) and problem.groupings:
                tables = {name: grouping.sums(batch, detach=False) for name, grouping in problem.groupings.items()}
                rows = batch.losses.shape[0]
        observed = {
            problem.constraints[spec.name]: cooper.ConstraintState(
                violation=violations[spec.name], contributes_to_primal_update=primal, contributes_to_dual_update=dual
            )
            for spec in problem.plain
        }
        for spec in problem.grouped:
            if spec.name in tables and bool((tables[spec.name][1] > 0).any()):
                observed[problem.constraints[spec.name]] = problem._grouped_state(spec, *tables[spec.name], rows, primal, dual)
        misc = {
            "means": None if means is None else means.detach(),
            "violations": {name: value.detach() for name, value in violations.items()},
            "tables": {name: (sums.detach(), counts) for name, (sums, counts) in tables.items()},
        }
        return cooper.CMPState(loss=problem.objective(means) if primal else None, observed_constraints=observed, misc=misc)


class LayerwiseProblem:
    """Constraints on the per-layer mean losses, as one Cooper CMP."""

    def __init__(
        self,
        specs: tuple[ConstraintSpec, ...],
        num_layers: int,
        augmented: bool = False,
        rho: float = 1.0,
        growth: float = 1.0,
        tolerance: float = 1e-4,
        band: tuple[float, ...] = (),
        rows: int | None = None,
    ) -> None:
        self.specs = specs
        self.augmented = augmented  # Cooper's augmented Lagrangian, with a penalty rho per entry
        self.plain = tuple(spec for spec in specs if not spec.grouped)  # one multiplier per entry, observed from the layer means
        self.grouped = tuple(spec for spec in specs if spec.grouped)  # held per level or per sample: multipliers per group
        self.needs_nonnegative = tuple(
            spec for spec in specs if getattr(spec, "needs_nonnegative_losses", False)
        )  # descent's (1 - alpha) margin assumes losses >= 0
        self.num_layers = num_layers
        self.cmp = LayerwiseCMP(self)
        self.labels: dict[str, list[str]] = {}
        self.groupings: dict[str, Grouping] = {}  # the specs held per level or per sample
        for spec in specs:
            self.labels[spec.name] = spec.labels(num_layers)
            size = len(self.labels[spec.name])
            if spec.grouped:
                if augmented:
                    raise ConfigError(
                        f"constraint {spec.name!r} is held per level or per sample, which the augmented Lagrangian's per-entry penalty does not scale to: use solver.formulation = 'lagrangian'"
                    )
                grouping = self.groupings[spec.name] = Grouping.of(spec, size, tuple(band), rows)
                self.labels[spec.name] = grouping.labels(self.labels[spec.name])
                setattr(
                    self.cmp,
                    spec.name,
                    cooper.Constraint(
                        cooper.ConstraintType.INEQUALITY, multiplier=cooper.multipliers.IndexedMultiplier(num_constraints=grouping.size)
                    ),
                )
                continue
            multiplier = cooper.multipliers.DenseMultiplier(num_constraints=size)
            extra: dict[str, Any] = {}
            if augmented:  # Cooper's augmented Lagrangian: a penalty rho per entry beside lambda
                extra = {
                    "formulation_type": cooper.formulations.AugmentedLagrangian,
                    "penalty_coefficient": cooper.penalty_coefficients.DensePenaltyCoefficient(torch.full((size,), rho)),
                }
            setattr(self.cmp, spec.name, cooper.Constraint(cooper.ConstraintType.INEQUALITY, multiplier=multiplier, **extra))
        self.constraints: dict[str, cooper.Constraint] = {spec.name: getattr(self.cmp, spec.name) for spec in specs}
        self.growth = (  # the augmented Lagrangian's rho updater, where rho grows
            cooper.penalty_coefficients.MultiplicativePenaltyCoefficientUpdater(growth, tolerance, has_restart=False)
            if augmented and growth > 1
            else None
        )
        self.state: dict[str, dict[str, torch.Tensor]] | None = None
        # the last layer's mean, or a solver's own objective
        self.objective: Callable[[torch.Tensor], torch.Tensor] = lambda means: means[-1]
        self.enforced = False  # whether the constraints enter the primal loss (the solver's enforces_constraints)
        self.before_primal: Callable[[], None] | None = None  # a scheme's dual step between a pass and its primal loss (alternating)
        self.seen: Observation | None = None  # the step's micro-batches so far, on this rank; the solver takes it at the step

    def dual_groups(self) -> list[dict[str, Any]]:
        """The multipliers as a dual optimizer's parameter groups, in registration order; a resilient spec's weight decay is 1/c."""
        # A grouped spec's relaxation cost enters its (sparse) dual gradient instead: weight decay would shrink every row's lambda.
        return [
            {
                "params": [self.constraints[spec.name].multiplier.weight],
                "weight_decay": 1.0 / spec.resilience if spec.resilience and not spec.grouped else 0.0,
            }
            for spec in self.specs
        ]

    def forward(self, batch: torch.Tensor | LayerBatch, weight: float = 1.0) -> torch.Tensor | None:
        """Count one micro-batch toward the step (``weight``: its share) and return its primal loss, unweighted; None under ``torch.no_grad()``, a pass that only counts.

        ``batch`` is a LayerBatch, B x (L+1) per-row losses, their L+1 means, or the last layer's
        mean alone (a read of the last layer only: the other layers count as NaN, left out of the
        checks and the log line's means). Its violations are computed once, here, and serve the
        primal Lagrangian, the non-finite check, the dual step and the log line.
        """
        if not (self.enforced and torch.is_grad_enabled()):
            means = layer_means(batch)
            every_layer = len(means) == self.num_layers + 1
            if not every_layer:
                means = batch = torch.cat([means.new_full((self.num_layers,), float("nan")), means])
            if self.state is None:
                self._anchor(means, weight)
            tables = self._group_tables(batch) if self.groupings and isinstance(batch, LayerBatch) else {}
            self._count(means.detach(), weight, None, tables, every_layer)
            return self.objective(means) if torch.is_grad_enabled() else None
        if self.state is None:
            self._anchor(layer_means(batch), weight)
        state = self.cmp.compute_cmp_state(batch, dual=False)
        self._count(state.misc["means"], weight, state.misc["violations"], state.misc["tables"])
        if self.before_primal is not None:
            self.before_primal()
        return state.compute_primal_lagrangian().lagrangian

    def _count(
        self,
        means: torch.Tensor,
        weight: float = 1.0,
        violations: dict[str, torch.Tensor] | None = None,
        tables: dict[str, tuple[torch.Tensor, torch.Tensor]] | None = None,
        every_layer: bool = True,
    ) -> None:
        """Add detached layer means (times ``weight``), their violations and per-group tables to the step's observation (``seen``): the one accumulation."""
        seen = self.seen
        term = means if weight == 1.0 else means * weight  # times 1 is exact: one op less on the usual path
        if seen is None:  # the one micro-batch's violations are those of the step's means (weight 1); a second makes them the sum's
            self.seen = Observation(term, violations if weight == 1.0 else None, tables or {}, 1, every_layer)
            return
        if tables:
            tables = add_tables(seen.tables, tables)
        self.seen = Observation(seen.means + term, None, tables or seen.tables, seen.micro + 1, seen.every_layer and every_layer)

    def _grouped_state(
        self, spec: ConstraintSpec, sums: torch.Tensor, counts: torch.Tensor, rows: int | None, primal: bool, dual: bool
    ) -> cooper.ConstraintState:
        """A grouped spec's ConstraintState from its per-group loss sums and row counts: each group present, weighted by its share of the batch's ``rows`` (None: a dual window's, unweighted).

        Its strict violation, which the dual Lagrangian reads, is that of the relaxed constraint g - u
        (u = lambda / c) where the spec is resilient: the gradient of lambda.g - ||lambda||^2 / 2c.
        """
        grouping = self.groupings[spec.name]
        present = counts.nonzero().flatten()
        counts = counts[present]
        violation = grouped_violation(spec, (sums[present] / counts[:, None]).to(self.device), self.state[spec.name])
        index = grouping.indices(present.to(self.device))
        strict = violation.flatten()
        if spec.resilience:
            strict = strict.detach() - self.constraints[spec.name].multiplier.weight.detach()[index, 0] / spec.resilience
        # Each group's term is weighted by its share of the batch's rows, so that the per-sample
        # Lagrangian is the mean of lambda_i g_i over the rows, and a level's is E over the band.
        weighted = violation if rows is None else (counts / rows)[:, None] * violation
        return cooper.ConstraintState(
            violation=weighted.flatten(),
            constraint_features=index,
            strict_violation=strict,
            contributes_to_primal_update=primal,
            contributes_to_dual_update=dual,
        )

    def _group_tables(self, batch: LayerBatch) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """Per-group loss sums and row counts of one micro-batch, for each grouped spec (empty when there is none)."""
        return {name: grouping.sums(batch) for name, grouping in self.groupings.items()}

    def _anchor(self, means: torch.Tensor, weight: float) -> None:
        """Fix the constraints' anchors from the run's first micro-batch (its layer means, ``weight`` its share), over every rank."""
        from layerdescent.distributed import World

        self._start(World.current().weighted_mean(means.detach(), weight))

    def _start(self, means: torch.Tensor) -> None:
        """Fix what specs take from the first training batch (anchors), once per run."""
        if self.state is None:
            self.state = {spec.name: spec.initial_state(means.detach()) for spec in self.specs}

    def violations(self, means: torch.Tensor | None = None, tables: Tables | None = None) -> dict[str, torch.Tensor]:
        """Each constraint's violation: a plain one's at these layer means (differentiable; S x entries at S rows of means), a grouped one's per group of these per-group tables (G x block, NaN where a group saw no row)."""
        out = {} if means is None else self._plain_violations(means)
        for spec in self.grouped if tables else ():
            if spec.name in tables:
                grouping, (sums, counts) = self.groupings[spec.name], tables[spec.name]
                group_means = sums / counts[:, None]  # NaN where no row: 0 / 0
                violation = grouped_violation(spec, group_means.to(self.device), self.state[spec.name])
                out[spec.name] = violation.reshape(max(grouping.rows, 1), grouping.block)
        return out

    def _plain_violations(self, means: torch.Tensor) -> dict[str, torch.Tensor]:
        """Each plain spec's violation vector at L+1 layer means, or S x entries at S rows of them (one call where the kind broadcasts over rows)."""
        if means.dim() == 2:
            self._start(means[0])
            return {spec.name: grouped_violation(spec, means, self.state[spec.name]) for spec in self.plain}
        self._start(means)
        out = {}
        for spec in self.plain:  # the grouped are observed per group, from a LayerBatch
            violation = spec.violation(means, self.state[spec.name])
            # Cooper would silently broadcast a multiplier over a violation of another size.
            if violation.shape != (len(self.labels[spec.name]),):
                raise PluginError(
                    f"constraint {spec.name!r} ({spec.kind}) returned a violation of shape {tuple(violation.shape)}; "
                    f"its labels() promise {len(self.labels[spec.name])} entries"
                )
            out[spec.name] = violation
        return out

    def multipliers(self) -> dict[str, torch.Tensor]:
        """Current lambda of each spec: one per label, or a rows x labels table for a per-sample spec."""
        out = {}
        for spec in self.specs:
            weight = self.constraints[spec.name].multiplier.weight.detach()
            out[spec.name] = (
                weight.reshape(-1, self.groupings[spec.name].block)
                if spec.per_sample
                else weight.flatten()
                if spec.name in self.groupings
                else weight
            )
        return out

    def state_dict(self) -> dict[str, Any]:
        """Multipliers and per-spec state, for checkpoints."""
        return {"cmp": self.cmp.state_dict(), "state": self.state}

    @property
    def device(self) -> torch.device:
        """Where the multipliers live."""
        return next((m.device for m in self.cmp.multipliers()), torch.device("cpu"))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` saved."""
        self.cmp.load_state_dict(state["cmp"])
        saved = state["state"]
        self.state = (
            None if saved is None else {name: {k: v.to(self.device) for k, v in tensors.items()} for name, tensors in saved.items()}
        )
