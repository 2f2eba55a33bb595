"""Deep supervision (``penalty``): a fixed convex combination of the layer losses, its weights a family and its parameters, or a list."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Union

from layerdescent.core.solver import Solver
from layerdescent.errors import ConfigError

if TYPE_CHECKING:  # the registry loads solvers without torch or cooper; their methods run in training
    import torch


# Deep supervision's weight families: readout k = 0..L is layer n = k + 1, as torchtune's early-exit loss counts
# its layers (uniform, linear, sum, sqrt, inv, inv_sqrt); geometric weighs layer k by rho^(L - k).
WEIGHT_FAMILIES: dict[str, Callable[[int, int, float], float]] = {
    "uniform": lambda n, last, rho: 1.0,
    "geometric": lambda n, last, rho: rho ** (last - n),
    "linear": lambda n, last, rho: float(n),
    "sum": lambda n, last, rho: n * (n + 1) / 2,
    "sqrt": lambda n, last, rho: math.sqrt(n),
    "inv": lambda n, last, rho: 1.0 / n,
    "inv_sqrt": lambda n, last, rho: 1.0 / math.sqrt(n),
}


def layer_weights(family: str, num_layers: int, rho: float = 0.5, scale: float = 1.0) -> tuple[float, ...]:
    """The weight of each layer 0..L under ``family``, every layer's but the last's times ``scale``, summing to 1."""
    last = num_layers + 1
    raw = [WEIGHT_FAMILIES[family](k + 1, last, rho) * (scale if k < num_layers else 1.0) for k in range(num_layers + 1)]
    total = sum(raw)
    return tuple(w / total for w in raw)


@dataclass(frozen=True)
class PenaltyOptions:
    """``penalty``'s keys: the layer weights, as a family and its parameters or as a list (all equal by default)."""

    weights: Literal["uniform", "geometric", "linear", "sum", "sqrt", "inv", "inv_sqrt"] = "uniform"
    """The family of the layer weights: torchtune's early-exit scales (layer k counted as k + 1), or `geometric`."""
    rho: float = 0.5
    """`geometric`'s ratio: layer k weighs rho^(L-k), so the last layer weighs most when rho < 1."""
    scale: float = 1.0
    """Every layer's weight but the last's times this (torchtune's `e_scale`)."""
    penalty_weights: Union[tuple[float, ...], None] = None
    """A weight per layer 0..L, instead of a family; unset weighs by `weights`."""

    def __post_init__(self) -> None:
        if self.penalty_weights is not None:
            if not all(w >= 0 for w in self.penalty_weights):
                raise ConfigError("solver.penalty_weights must all be >= 0")
            if sum(self.penalty_weights) <= 0:
                raise ConfigError("solver.penalty_weights must not all be 0")
            if (self.weights, self.rho, self.scale) != ("uniform", 0.5, 1.0):
                raise ConfigError(
                    "solver.penalty_weights lists the weights, solver.weights, rho and scale make them: give one or the other"
                )
        if not self.rho > 0:
            raise ConfigError(f"solver.rho must be > 0, got {self.rho}")
        if not self.scale >= 0:
            raise ConfigError(f"solver.scale must be >= 0, got {self.scale}")


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
        options = self.options
        weights = options.penalty_weights
        if weights is None and (options.weights, options.scale) == ("uniform", 1.0):
            return means.mean()
        import torch

        weights = weights or layer_weights(options.weights, len(means) - 1, options.rho, options.scale)
        w = torch.tensor(weights, dtype=means.dtype, device=means.device)
        return (w * means).sum() / w.sum()
