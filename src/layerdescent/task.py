"""What a task plugin provides: a model, its data splits, and a loss read out at every layer."""

from __future__ import annotations

import abc
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from layerdescent.errors import ConfigError

MAX_GAMMA = 1e6  # a perturbation level past this overflows float32 losses (inf, then NaN at the first step), whatever the learning rate
MAX_LAYERS = 1024  # deeper than any model the tasks train (an LLM's ~30 blocks); a config past it is a typo, and building it would not end

if TYPE_CHECKING:  # torch and friends load when a task is used, not when a plugin registers it
    import datasets
    import torch
    import torchmetrics


@dataclass
class LayerOutput:
    """One batch's per-sample loss at every layer, plus what the task's metrics consume."""

    losses: torch.Tensor  # B x (L + 1); column 0 is the input representation
    preds: Any = None
    target: Any = None
    extras: dict[str, Any] = field(default_factory=dict)
    # B x (L + 1) x ...: every layer's prediction, read like ``preds``; evaluation then records
    # each metric at every layer (results.json ``layer_metrics``), e.g. where the answer becomes right.
    layer_preds: Any = None

    def __post_init__(self) -> None:
        import torch

        if not isinstance(self.losses, torch.Tensor):
            raise TypeError(f"LayerOutput.losses must be a B x (L+1) tensor, got {type(self.losses).__name__}")
        if self.losses.dim() != 2:
            raise ValueError(f"LayerOutput.losses must be B x (L+1), got shape {tuple(self.losses.shape)}")


class Task(abc.ABC):
    """A learning problem whose model exposes a loss at every layer; it knows nothing of solvers.

    Subclasses set ``name`` and ``options`` (the config keys they accept with their defaults)
    and implement the abstract methods. ``self.options`` holds the resolved values.
    """

    name: ClassVar[str]
    options: ClassVar[dict[str, Any]] = {}
    # One line of meaning per option (allowed values included), for the configuration reference
    # (`layerdescent config --reference`) and the comments of `layerdescent config --defaults`.
    option_help: ClassVar[dict[str, str]] = {}
    perturbations: ClassVar[tuple[str, ...]] = ("gaussian",)
    # What gamma means under each perturbation, for plot titles and axis labels, e.g.
    # {"gaussian": "Gaussian embedding noise, std = γ × RMS"}; one not listed shows its name.
    perturbation_titles: ClassVar[dict[str, str]] = {}
    # The gammas each perturbation accepts, (low, high) inclusive, e.g. {"substitute": (0.0, 1.0)}
    # for a probability; eval.gammas and train.train_gamma outside it are refused. Unlisted: 0 to MAX_GAMMA.
    gamma_ranges: ClassVar[dict[str, tuple[float, float]]] = {}
    # Extra evaluation sets that share the task's labels (a real distribution shift), by name;
    # ``eval.domains`` picks among them and ``domain_dataset`` builds one.
    domains: ClassVar[tuple[str, ...]] = ()

    def __init__(self, **options: Any) -> None:
        self.options = {**type(self).options, **options}
        self.perturbation = str(self.options.get("perturbation", self.perturbations[0]))

    @property
    @abc.abstractmethod
    def num_layers(self) -> int:
        """L, the number of layer transitions; losses have L + 1 columns."""

    @abc.abstractmethod
    def build_model(self) -> torch.nn.Module:
        """A fresh model, initialised from the global torch RNG."""

    @abc.abstractmethod
    def build_datasets(self) -> dict[str, datasets.Dataset]:
        """The ``train``, ``validation`` and ``test`` splits."""

    @abc.abstractmethod
    def collate(self, rows: dict[str, Any]) -> Any:
        """Turn ``split[indices]`` (a dict of columns) into a model-ready batch."""

    def collate_rows(self, rows: list[dict[str, Any]]) -> Any:
        """``collate`` of a list of rows, as a ``DataLoader`` hands them: ``DataLoader(split, batch_size=32, collate_fn=task.collate_rows)``."""
        return self.collate(columns(rows))

    @abc.abstractmethod
    def layer_losses(self, model: torch.nn.Module, batch: Any, gamma: float = 0.0) -> LayerOutput:
        """Per-sample loss at every layer for ``batch`` perturbed at level ``gamma``."""

    def last_layer_losses(self, model: torch.nn.Module, batch: Any, gamma: float = 0.0) -> LayerOutput | None:
        """Per-sample loss of the last layer alone (B x 1) where that costs less than every layer's; None where not.

        erm trains on it between log lines (the first step of each still reads every layer for
        the log). Override it when reading the other layers is costly, like the logit lens.
        """
        return None

    def domain_dataset(self, name: str) -> datasets.Dataset:
        """The evaluation set of domain ``name`` (one of ``domains``), with the test split's columns and labels."""
        raise NotImplementedError(f"task {self.name!r} lists domain {name!r} but does not implement domain_dataset")

    def required_assets(self) -> tuple[str, ...]:
        """Names of the fetched assets these options read; ``layerdescent assets fetch`` gets them."""
        return ()

    def check_gammas(self, gammas: Iterable[float], key: str) -> None:
        """Raise ConfigError naming ``key`` if a gamma lies outside the range of this task's perturbation."""
        low, high = self.gamma_ranges.get(self.perturbation, (0.0, MAX_GAMMA))
        bad = [g for g in gammas if not low <= g <= high]
        if bad:
            meaning = self.perturbation_titles.get(self.perturbation)
            raise ConfigError(
                f"{key}: {', '.join(f'{g:g}' for g in bad)} outside [{low:g}, {high:g}], the range of task {self.name!r}'s "
                f"{self.perturbation!r} perturbation{f' ({meaning})' if meaning else ''}"
            )

    def check_choices(self, **choices: tuple[str, ...]) -> None:
        """Raise ConfigError naming the first option whose value is not one of its choices."""
        for key, allowed in choices.items():
            if self.options[key] not in allowed:
                raise ConfigError(f"task.{key} must be one of {', '.join(allowed)}; got {self.options[key]!r}")

    def check_sizes(self, **bounds: tuple[int, int]) -> None:
        """Raise ConfigError naming the first size option outside its (low, high) bounds, both inclusive, and the limit it passed."""
        for key, (low, high) in bounds.items():
            value = self.options[key]
            if value < low:
                raise ConfigError(f"task.{key} must be >= {low}, got {value}")
            if value > high:
                raise ConfigError(f"task.{key} = {value:,} is more than this task builds (at most {high:,}): lower it")

    def metrics(self) -> torchmetrics.MetricCollection:
        """Task metrics, updated with ``LayerOutput.preds`` and ``.target``; none by default."""
        import torchmetrics

        return torchmetrics.MetricCollection({})


def columns(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The dict of columns ``split[indices]`` gives, from that split's rows one by one (tensors stacked, other values listed)."""
    import torch

    if not isinstance(rows, list) or not all(isinstance(row, dict) for row in rows):
        raise TypeError(f"collate_rows takes a list of rows (dicts), as a DataLoader hands them; got {type(rows).__name__}")
    names = rows[0].keys() if rows else ()
    return {
        name: torch.stack([row[name] for row in rows]) if isinstance(rows[0][name], torch.Tensor) else [row[name] for row in rows]
        for name in names
    }
