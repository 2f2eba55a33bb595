"""When the multipliers step: the dual window of ``dual_every``, the optimizer steps one dual step reads and their sums."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from layerdescent.core.observation import Observation, Tables
from layerdescent.options import Choice

if TYPE_CHECKING:
    from layerdescent.core.problem import LayerwiseProblem

__all__ = ["DualEvery", "DualWindow"]


class DualEvery(Choice):
    """A dual window named rather than counted (``dual_every``): every step of an epoch."""

    EPOCH = "epoch"


class DualWindow:
    """The optimizer steps one dual step reads (``dual_every``: a count, or every step of an epoch) and their sums since the last one."""

    def __init__(self, steps: int | None, width: int) -> None:
        import torch

        self.steps = steps  # None: the end of each epoch closes the window
        self.means = torch.zeros(width)  # the sum of the steps' layer means
        self.count = 0
        self.violations: dict[str, Any] | None = None  # a one-step window's violations, computed in its pass
        self.tables: Tables = {}  # the steps' per-group sums and counts

    @classmethod
    def of(cls, every: int | DualEvery, width: int) -> DualWindow:
        """The window ``solver.dual_every`` names (a number of steps, or ``"epoch"``) over ``width`` layer means."""
        return cls(None if every == DualEvery.EPOCH else int(every), width)

    @property
    def per_epoch(self) -> bool:
        """Whether the dual step comes at the end of each epoch."""
        return self.steps is None

    def add(self, seen: Observation, problem: LayerwiseProblem) -> tuple[dict[str, Any], Tables] | None:
        """Count a taken step: the window's violations and per-group tables where this step fills it (the window starts again), else None."""
        if seen.tables:
            from layerdescent.core.grouping import add_tables

            self.tables = add_tables(self.tables, seen.tables)
        if self.steps == 1 and seen.violations and len(seen.violations) == len(problem.plain):
            tables, self.tables = self.tables, {}  # a one-step window: the step's own violations, from its pass
            return seen.violations, tables
        self.means += seen.means.detach().to(self.means)
        self.count += 1
        self.violations = seen.violations if self.count == 1 else None
        return self.close(problem) if self.steps is not None and self.count >= self.steps else None

    def close(self, problem: LayerwiseProblem) -> tuple[dict[str, Any], Tables]:
        """The window's violations and tables, and it starts again: its one step's violations where its pass computed them, else those at its mean layer losses."""
        # The window holds expectations E[l_k] over its batches; specs are functions of them.
        import torch

        violations = self.violations if self.count == 1 else None
        if violations is None or len(violations) < len(problem.plain):  # none known, or a non-finite step's
            with torch.no_grad():
                violations = problem.violations((self.means / self.count).to(problem.device))
        tables, self.tables = self.tables, {}
        self.means.zero_()
        self.count = 0
        self.violations = None
        return violations, tables

    def state_dict(self) -> dict[str, Any]:
        """The sums since the last dual step, for checkpoints."""
        state: dict[str, Any] = {"window": self.means.clone(), "count": self.count}
        if self.tables:  # only runs with constraints held per level or per sample have them
            state["group_window"] = {name: [sums.clone(), counts.clone()] for name, (sums, counts) in self.tables.items()}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` saved."""
        self.means = state["window"].clone()
        self.count = int(state["count"])
        self.violations = None
        self.tables = {name: (sums.clone(), counts.clone()) for name, (sums, counts) in state.get("group_window", {}).items()}
