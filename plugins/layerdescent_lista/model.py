"""The unrolled ISTA network: x_k = soft(W1_k y + W2_k x_{k-1}, theta_k), every layer's estimate returned."""

from __future__ import annotations

import torch
from torch import nn

from layerdescent.prox import soft_threshold


class LISTA(nn.Module):
    """Unrolled ISTA returning the estimate of every layer, B x (L + 1) x code_dim."""

    def __init__(
        self, A: torch.Tensor, layers: int, tied: bool = False, x0: str = "linear", weights: str = "random", threshold: float = 0.1
    ) -> None:
        super().__init__()
        measure_dim, code_dim = A.shape
        c = torch.linalg.matrix_norm(A, ord=2) ** 2
        copies = 1 if tied else layers
        if weights == "ista":
            w1 = (A.T / c).repeat(copies, 1, 1)
            w2 = (torch.eye(code_dim) - A.T @ A / c).repeat(copies, 1, 1)
        else:
            w1 = torch.randn(copies, code_dim, measure_dim) / measure_dim**0.5
            w2 = torch.randn(copies, code_dim, code_dim) / code_dim
        self.layers = layers
        self.x0 = nn.Parameter(A.T / c) if x0 == "linear" else None
        self.w1 = nn.Parameter(w1)
        self.w2 = nn.Parameter(w2)
        self.theta = nn.Parameter(torch.full((layers,), threshold / c.item()))

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        x = y @ self.x0.T if self.x0 is not None else y.new_zeros(y.shape[0], self.w2.shape[-1])
        estimates = [x]
        for k in range(self.layers):
            i = min(k, self.w1.shape[0] - 1)
            x = soft_threshold(y @ self.w1[i].T + x @ self.w2[i].T, self.theta[k])
            estimates.append(x)
        return torch.stack(estimates, dim=1)
