"""The model's optimizer from a run's [train] settings, and Cooper's extragradient ones: the one factory every front and bench builds it with."""

from __future__ import annotations

from typing import Protocol

import cooper
import torch

from layerdescent.errors import ConfigError


class PrimalSettings(Protocol):
    """What a solver's primal optimizer reads of a run's [train] table (a ``TrainConfig``, or any object with these)."""

    optimizer: str
    lr: float
    momentum: float
    weight_decay: float


# -- how the primal and dual steps interleave: the schemes ---------------------------------------


class ExtraSGD(cooper.optim.ExtraSGD):
    """Cooper's ExtraSGD, able to load a saved state (cooper-optim 1.0.1's ``__setstate__`` calls ``super(torch.optim.SGD, self)``, which fails)."""

    def __setstate__(self, state: dict) -> None:
        torch.optim.Optimizer.__setstate__(self, state)
        for group in self.param_groups:
            group.setdefault("nesterov", False)


def primal_optimizer(params: list, train: PrimalSettings, extragradient: bool = False) -> torch.optim.Optimizer:
    """The model's optimizer as ``train`` names it (sgd, adam, adamw); with ``extragradient``, Cooper's ExtraSGD or ExtraAdam."""
    if extragradient:
        if train.optimizer == "adamw":
            raise ConfigError(
                "solver.scheme = 'extrapolation' has no extragradient AdamW: set train.optimizer = 'adam' (or 'sgd') and train.weight_decay as L2"
            )
        if train.optimizer == "sgd":
            return ExtraSGD(params, lr=train.lr, momentum=train.momentum, weight_decay=train.weight_decay)
        return cooper.optim.ExtraAdam(params, lr=train.lr, weight_decay=train.weight_decay)
    if train.optimizer == "sgd":
        return torch.optim.SGD(params, lr=train.lr, momentum=train.momentum, weight_decay=train.weight_decay)
    cls = torch.optim.AdamW if train.optimizer == "adamw" else torch.optim.Adam
    return cls(params, lr=train.lr, weight_decay=train.weight_decay)
