"""Proximal operators, the nonlinearities of unrolled optimization networks (ISTA, DUST, l1-l1)."""

from __future__ import annotations

import torch


def soft_threshold(v: torch.Tensor, threshold: torch.Tensor | float) -> torch.Tensor:
    """The proximal operator of the l1 norm, sign(v) max(|v| - threshold, 0), differentiable in both."""
    return torch.sign(v) * torch.relu(v.abs() - threshold)
