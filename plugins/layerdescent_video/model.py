"""The video denoisers: two unrolled sparse-coding networks and a plain transformer, read out at every layer.

Every model maps a noisy clip y (B x T x P: T frames of P pixels) to an estimate of the clean clip
at every layer, B x (L + 1) x T x P. D (P x N) is a learned dictionary shared by all layers,
soft(v, t) = sign(v) max(|v| - t, 0) is the proximal operator of t ||.||_1, and thresholds are
clamped at 0 so that it stays one. Layer 0 is a learned linear estimate z_0 = V y_t (V starts at
D^T / c, c = ||D||_2^2), so its loss is trainable too.

``dust``, after DUST (De Weerdt, Eldar, Deligiannis, IEEE TSP 2024): layer k = 1..L is one
proximal-gradient step on the codes Z (B x T x N) of all frames, with attention across the frames:

    Z_k = soft(Z_{k-1} W_k^T + y U_k^T + MHA_k(Z_{k-1}, Z_{k-1}, Z_{k-1}), theta_k),   x_k = Z_k D^T

where MHA_k is ``torch.nn.MultiheadAttention`` (``heads`` heads, query, key and value all Z_{k-1},
every frame attending to every frame). With MHA_k = 0, W_k = I - D^T D / c, U_k = D^T / c and
theta_k = lambda / c this is one ISTA step for min_z ||y_t - D z||^2 / 2 + lambda ||z||_1.

``l1l1``, after the l1-l1 RNN (Le, Van Luong, Deligiannis, ICIP 2019): frames are coded in order,
and the last layer's code of frame t - 1 is side information for frame t through the proximal
operator of lambda1 |v| + lambda2 |v - s|:

    z_{t,k} = prox_l1l1(W_k z_{t,k-1} + U_k y_t; lambda1_k, lambda2_k, s_t),   s_t = G z_{t-1,L},  s_1 = 0,
    x_{t,k} = D z_{t,k}

which unrolls proximal gradient on ||y_t - D z||^2 / 2 + lambda1 ||z||_1 + lambda2 ||z - G z_{t-1}||_1.

``transformer``: frames are tokens; h_0 = E y_t + p_t (learned position p), h_k is
``torch.nn.TransformerEncoderLayer`` (pre-norm, batch_first, no dropout) applied to h_{k-1}, and
one shared readout x_k = R(LayerNorm(h_k)) decodes every layer.
"""

from __future__ import annotations

import torch
from torch import nn

from layerdescent.prox import soft_threshold


def prox_l1l1(u: torch.Tensor, lam1: torch.Tensor, lam2: torch.Tensor, side: torch.Tensor) -> torch.Tensor:
    """The proximal operator of lam1 |v| + lam2 |v - side|, elementwise (lam1, lam2 >= 0)."""
    # Two kinks a <= b with weights wa, wb: linear pieces outside them, a clamp between them.
    at_zero_first = side >= 0
    a, b = torch.minimum(side, torch.zeros_like(side)), torch.maximum(side, torch.zeros_like(side))
    wa, wb = torch.where(at_zero_first, lam1, lam2), torch.where(at_zero_first, lam2, lam1)
    total = wa + wb
    middle = torch.minimum(torch.maximum(u - wa + wb, a), b)
    return torch.where(u < a - total, u + total, torch.where(u > b + total, u - total, middle))


def _dictionary(pixels: int, code_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A random dictionary with unit-norm atoms and its ISTA step constant c = ||D||_2^2."""
    D = torch.randn(pixels, code_dim)
    D = D / D.norm(dim=0, keepdim=True)
    return D, torch.linalg.matrix_norm(D, ord=2) ** 2


def _step_weights(D: torch.Tensor, c: torch.Tensor, layers: int, weights: str) -> tuple[torch.Tensor, torch.Tensor]:
    """W (L x N x N) and U (L x N x P): ISTA's own, or random at the same scale as lista's."""
    pixels, code_dim = D.shape
    if weights == "ista":
        return (torch.eye(code_dim) - D.T @ D / c).repeat(layers, 1, 1), (D.T / c).repeat(layers, 1, 1)
    return torch.randn(layers, code_dim, code_dim) / code_dim, torch.randn(layers, code_dim, pixels) / pixels**0.5


class DUST(nn.Module):
    """Unrolled proximal gradient with attention across frames; every layer's estimate, B x (L + 1) x T x P."""

    def __init__(self, pixels: int, code_dim: int, layers: int, heads: int, weights: str = "random", threshold: float = 0.02) -> None:
        super().__init__()
        D, c = _dictionary(pixels, code_dim)
        w, u = _step_weights(D, c, layers, weights)
        self.dictionary = nn.Parameter(D)
        self.v = nn.Parameter(D.T / c)
        self.w = nn.Parameter(w)
        self.u = nn.Parameter(u)
        self.theta = nn.Parameter(torch.full((layers, code_dim), threshold / c.item()))
        self.attention = nn.ModuleList(nn.MultiheadAttention(code_dim, heads, batch_first=True) for _ in range(layers))
        if weights == "ista":
            for attention in self.attention:  # so that the untrained network is ISTA itself
                nn.init.zeros_(attention.out_proj.weight)
                nn.init.zeros_(attention.out_proj.bias)

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        z = y @ self.v.T
        estimates = [z @ self.dictionary.T]
        for k, attention in enumerate(self.attention):
            mixed = attention(z, z, z, need_weights=False)[0]
            z = soft_threshold(z @ self.w[k].T + y @ self.u[k].T + mixed, self.theta[k].clamp(min=0))
            estimates.append(z @ self.dictionary.T)
        return torch.stack(estimates, dim=1)


class L1L1RNN(nn.Module):
    """The unrolled l1-l1 recurrent network: frames in order, each coded with the last one's code as prior."""

    def __init__(self, pixels: int, code_dim: int, layers: int, weights: str = "random", threshold: float = 0.02) -> None:
        super().__init__()
        D, c = _dictionary(pixels, code_dim)
        w, u = _step_weights(D, c, layers, weights)
        self.dictionary = nn.Parameter(D)
        self.v = nn.Parameter(D.T / c)
        self.w = nn.Parameter(w)
        self.u = nn.Parameter(u)
        # Consecutive frames look alike, so the prior starts as "same code as before".
        self.g = nn.Parameter(
            torch.eye(code_dim) if weights == "ista" else torch.eye(code_dim) + torch.randn(code_dim, code_dim) / code_dim
        )
        self.lam1 = nn.Parameter(torch.full((layers, code_dim), threshold / c.item()))
        self.lam2 = nn.Parameter(torch.full((layers, code_dim), threshold / c.item()))

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        frames, layers = y.shape[1], self.w.shape[0]
        codes: list[list[torch.Tensor]] = [[] for _ in range(layers + 1)]
        last = y.new_zeros(y.shape[0], self.w.shape[-1])
        for t in range(frames):
            side = last @ self.g.T
            z = y[:, t] @ self.v.T
            codes[0].append(z)
            for k in range(layers):
                z = prox_l1l1(z @ self.w[k].T + y[:, t] @ self.u[k].T, self.lam1[k].clamp(min=0), self.lam2[k].clamp(min=0), side)
                codes[k + 1].append(z)
            last = z
        return torch.stack([torch.stack(layer, dim=1) for layer in codes], dim=1) @ self.dictionary.T


class FrameTransformer(nn.Module):
    """A transformer encoder over frame tokens with one shared linear readout of every layer."""

    def __init__(self, pixels: int, frames: int, d_model: int, layers: int, heads: int) -> None:
        super().__init__()
        self.embed = nn.Linear(pixels, d_model)
        self.position = nn.Parameter(0.02 * torch.randn(frames, d_model))
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(d_model, heads, dim_feedforward=2 * d_model, dropout=0.0, batch_first=True, norm_first=True)
            for _ in range(layers)
        )
        self.norm = nn.LayerNorm(d_model)
        self.readout = nn.Linear(d_model, pixels)

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        h = self.embed(y) + self.position
        estimates = [self.readout(self.norm(h))]
        for block in self.blocks:
            h = block(h)
            estimates.append(self.readout(self.norm(h)))
        return torch.stack(estimates, dim=1)
