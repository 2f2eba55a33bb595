"""What one optimizer step observed: its layer means, each constraint's violation there, and the per-group sums of the grouped constraints."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

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
