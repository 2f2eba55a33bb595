"""Cooper's ExtraSGD made to load a saved state: the extrapolation scheme's multipliers and its SGD primal step use it."""

from __future__ import annotations

import cooper
import torch


class ExtraSGD(cooper.optim.ExtraSGD):
    """Cooper's ExtraSGD, able to load a saved state (cooper-optim 1.0.1's ``__setstate__`` calls ``super(torch.optim.SGD, self)``, which fails)."""

    def __setstate__(self, state: dict) -> None:
        torch.optim.Optimizer.__setstate__(self, state)
        for group in self.param_groups:
            group.setdefault("nesterov", False)
