"""The model's optimizer from a run's [train] settings, and Cooper's extragradient ones: the one factory every front and bench builds it with."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from layerdescent.errors import ConfigError
from layerdescent.options import Choice

if TYPE_CHECKING:  # a config names the optimizer without loading torch (`layerdescent config`); it loads when one is built
    import torch


class OptimizerName(Choice):
    """The model's optimizer a run names (``train.optimizer``)."""

    ADAM = "adam"
    ADAMW = "adamw"
    SGD = "sgd"


class PrimalSettings(Protocol):
    """What a solver's primal optimizer reads of a run's [train] table (a ``TrainConfig``, or any object with these)."""

    optimizer: str
    lr: float
    momentum: float
    weight_decay: float


def primal_optimizer(params: list, train: PrimalSettings, extragradient: bool = False) -> torch.optim.Optimizer:
    """The model's optimizer as ``train`` names it (sgd, adam, adamw); with ``extragradient``, Cooper's ExtraSGD or ExtraAdam."""
    import torch  # here, not at the top: see TYPE_CHECKING above

    if extragradient:
        if train.optimizer == OptimizerName.ADAMW:
            raise ConfigError(
                "solver.scheme = 'extrapolation' has no extragradient AdamW: set train.optimizer = 'adam' (or 'sgd') and train.weight_decay as L2"
            )
        import cooper

        from layerdescent.core.extragradient import ExtraSGD

        if train.optimizer == OptimizerName.SGD:
            return ExtraSGD(params, lr=train.lr, momentum=train.momentum, weight_decay=train.weight_decay)
        return cooper.optim.ExtraAdam(params, lr=train.lr, weight_decay=train.weight_decay)
    if train.optimizer == OptimizerName.SGD:
        return torch.optim.SGD(params, lr=train.lr, momentum=train.momentum, weight_decay=train.weight_decay)
    cls = torch.optim.AdamW if train.optimizer == OptimizerName.ADAMW else torch.optim.Adam
    return cls(params, lr=train.lr, weight_decay=train.weight_decay)
