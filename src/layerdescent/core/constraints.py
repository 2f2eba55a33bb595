"""Declarative constraints on the per-layer losses, each compiled to one Cooper constraint.

    [[constraints]]
    kind = "descent"        # E[l_k] <= (1 - alpha) E[l_{k-1}] for every chosen transition k
    alpha = 0.05
    reference = "detached"  # live | detached | anchored
    resilience = 0.0        # 0: hard; c > 0: relax with cost (c/2)||u||^2
    levels = "band"         # one multiplier per training level of train.train_gamma's band (or a list of them)
    per_sample = true       # one multiplier per training row and entry, relaxed by resilience

A new kind is a frozen dataclass subclassing :class:`ConstraintSpec`, registered by a plugin's
``register_constraints(register)`` hook, exactly as the built-ins below are.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Union

from layerdescent.errors import ConfigError
from layerdescent.hookspecs import hookimpl
from layerdescent.options import Choice

if TYPE_CHECKING:  # the registry loads the kinds without torch; their methods run in training
    import torch


class Reference(Choice):
    """How a descent constraint's gradient treats l_{k-1}: both sides live, a fixed (detached) target, or live with l_0 capped (anchored)."""

    LIVE = "live"
    DETACHED = "detached"
    ANCHORED = "anchored"


class Levels(Choice):
    """Where a constraint held per level holds, named rather than listed: every level of the training band."""

    BAND = "band"


@dataclass(frozen=True)
class ConstraintSpec(abc.ABC):
    """A constraint on the vector of layer means E[l_0..l_L]; one multiplier per entry."""

    kind: ClassVar[str]
    # True when ``violation`` broadcasts over leading dimensions (a G x (L+1) table of losses in,
    # G x entries out), so that one row's losses give that row's violation: ``per_sample`` needs it.
    per_row: ClassVar[bool] = False
    name: str = ""
    """Names its multipliers in logs and results (default: the kind); distinct per constraint."""
    resilience: float = 0.0
    """0: hard; c > 0 relaxes each entry by u >= 0 at cost (c/2)||u||^2."""
    # each level's multipliers are updated from the rows drawn at its level only
    levels: Union[Levels, tuple[float, ...], None] = None
    """`"band"`: hold at every level of `train.train_gamma`'s band, one multiplier per (level, entry); a list: at those levels."""
    per_sample: bool = False
    """One multiplier per (training row, entry), updated only for the rows in a batch."""

    def __post_init__(self) -> None:
        if not self.name:
            object.__setattr__(self, "name", self.kind)  # frozen: the default name is the kind
        if self.resilience < 0:
            raise ConfigError("resilience must be >= 0 (0 means a hard constraint)")
        if self.per_sample and not self.per_row:
            raise ConfigError(
                f"per_sample = true needs a violation taken per row, which constraint kind {self.kind!r} does not declare (ClassVar per_row = True)"
            )
        if isinstance(self.levels, tuple) and (not self.levels or len(set(self.levels)) != len(self.levels)):
            raise ConfigError('levels must name each level of the band once (or be "band" for all of them)')

    @property
    def grouped(self) -> bool:
        """Whether the multipliers are indexed by level or by row rather than one per entry."""
        return self.levels is not None or self.per_sample

    def held_levels(self, band: tuple[float, ...]) -> tuple[float, ...]:
        """The training levels it holds at, one multiplier block each: the whole band, the listed levels, or none (pooled)."""
        if self.levels is None:
            return ()
        return tuple(band) if self.levels == Levels.BAND else tuple(self.levels)

    @abc.abstractmethod
    def labels(self, num_layers: int) -> list[str]:
        """One label per violation entry, e.g. ``"l3<=l2"``; its length is the multiplier size."""

    @abc.abstractmethod
    def violation(self, means: torch.Tensor, state: dict[str, torch.Tensor]) -> torch.Tensor:
        """Violation vector (<= 0 when satisfied) from the layer means of one batch (G x entries from G x (L+1) where ``per_row``)."""

    def initial_state(self, means: torch.Tensor) -> dict[str, torch.Tensor]:
        """Tensors fixed at the first training batch (e.g. an anchor); saved in checkpoints."""
        return {}

    def check_layers(self, num_layers: int) -> None:
        """Raise ConfigError when the spec names a layer the model does not have."""


def _resolve_layer(index: int, num_layers: int, lowest: int, what: str) -> int:
    resolved = index + num_layers + 1 if index < 0 else index
    if not lowest <= resolved <= num_layers:
        raise ConfigError(
            f"{what} {index} is out of range: the model has layers 0..{num_layers}"
            f" (use {lowest}..{num_layers}, or a negative index from the end)"
        )
    return resolved


@dataclass(frozen=True)
class Descent(ConstraintSpec):
    """Every chosen layer must lower the mean loss by a factor (1 - alpha)."""

    kind: ClassVar[str] = "descent"
    per_row: ClassVar[bool] = True
    needs_nonnegative_losses: ClassVar[bool] = True  # the (1 - alpha) margin shrinks a loss towards 0; a negative one has no such margin
    alpha: float = 0.05
    """The margin: E[l_k] <= (1 - alpha) E[l_{k-1}]."""
    layers: tuple[int, ...] | None = None
    """The transitions k held (l_k against l_{k-1}), negative from the end; unset holds all 1..L."""
    reference: Reference = Reference.DETACHED
    """How gradients treat l_{k-1}: `live` (both sides), `detached` (a fixed target) or `anchored` (live, and l_0 capped)."""
    anchor: float | None = None
    """`anchored` only: the cap on l_0; unset takes its value on the first training batch."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 <= self.alpha < 1.0:
            raise ConfigError(f"alpha must be in [0, 1), got {self.alpha}")
        if self.reference not in tuple(Reference):
            raise ConfigError(f"reference must be one of {', '.join(Reference)}; got {self.reference!r}")
        object.__setattr__(self, "reference", Reference(self.reference))  # a string given here is parsed once
        if self.anchor is not None and self.reference is not Reference.ANCHORED:
            raise ConfigError("anchor is only used with reference = 'anchored'")
        if self.layers is not None and not self.layers:
            raise ConfigError("layers must name at least one transition, or be left out for all")

    def transitions(self, num_layers: int) -> list[int]:
        """The constrained transitions k (l_k against l_{k-1}), in 1..L."""
        if self.layers is None:
            return list(range(1, num_layers + 1))
        resolved = [_resolve_layer(k, num_layers, 1, "descent layer") for k in self.layers]
        if len(set(resolved)) != len(resolved):
            raise ConfigError(f"descent layers {list(self.layers)} name a transition twice")
        return resolved

    def check_layers(self, num_layers: int) -> None:
        self.transitions(num_layers)

    def labels(self, num_layers: int) -> list[str]:
        labels = [f"l{k}<=l{k - 1}" for k in self.transitions(num_layers)]
        return labels + (["l0<=anchor"] if self.reference is Reference.ANCHORED else [])

    def initial_state(self, means: torch.Tensor) -> dict[str, torch.Tensor]:
        if self.reference is not Reference.ANCHORED:
            return {}
        import torch

        value = means[0].detach() if self.anchor is None else torch.tensor(float(self.anchor))
        return {"anchor": value.clone().to(means.dtype)}

    def violation(self, means: torch.Tensor, state: dict[str, torch.Tensor]) -> torch.Tensor:
        import torch

        # A detached reference makes l_{k-1} a target: the gradient cannot lower the
        # violation by raising the previous layer's loss (the `live` form can be gamed).
        previous = means.detach() if self.reference is Reference.DETACHED else means
        if self.layers is None:  # every transition: slices, no index tensor on the hot path
            violation = means[..., 1:] - (1.0 - self.alpha) * previous[..., :-1]
        else:
            index = torch.tensor(self.transitions(means.shape[-1] - 1), device=means.device)
            violation = means[..., index] - (1.0 - self.alpha) * previous[..., index - 1]
        if self.reference is Reference.ANCHORED:
            violation = torch.cat([violation, means[..., :1] - state["anchor"]], dim=-1)
        return violation


@dataclass(frozen=True)
class Bound(ConstraintSpec):
    """The mean loss at one layer may not exceed a value: classic constrained learning."""

    kind: ClassVar[str] = "bound"
    per_row: ClassVar[bool] = True
    value: float = 0.0
    """The largest mean loss allowed."""
    layer: int = -1
    """The layer it holds at, negative from the end (-1: the last)."""

    def check_layers(self, num_layers: int) -> None:
        _resolve_layer(self.layer, num_layers, 0, "bound layer")

    def labels(self, num_layers: int) -> list[str]:
        return [f"l{_resolve_layer(self.layer, num_layers, 0, 'bound layer')}<={self.value:g}"]

    def violation(self, means: torch.Tensor, state: dict[str, torch.Tensor]) -> torch.Tensor:
        layer = _resolve_layer(self.layer, means.shape[-1] - 1, 0, "bound layer")
        return means[..., layer : layer + 1] - self.value


@hookimpl
def register_constraints(register) -> None:
    """The built-in kinds go through the same hook a third-party plugin uses."""
    register(Descent)
    register(Bound)
