"""Token perplexity: exp of the mean next-token loss over every target token of a split."""

from __future__ import annotations

from typing import Any

import torch
import torchmetrics


class TokenPerplexity(torchmetrics.Metric):
    """exp of the mean next-token loss over all target tokens, fed per-sample loss sums and token counts."""

    higher_is_better = False
    full_state_update = False

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_state("nll", torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("tokens", torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, nll_sums: torch.Tensor, counts: torch.Tensor) -> None:
        self.nll += nll_sums.double().sum()
        self.tokens += counts.double().sum()

    def compute(self) -> torch.Tensor:
        return torch.exp(self.nll / self.tokens)
