"""Unrolled ISTA (LISTA) on synthetic sparse coding: the smallest task plugin, and the one to copy.

Measurements y = A x* + noise of sparse codes x* (``sparsity`` non-zeros out of ``code_dim``).
Layer 0 is a learned linear estimate x_0 = B y (``x0 = "linear"``, so its loss is trainable and
the ``live`` descent reference can be seen gaming it) or x_0 = 0 (``x0 = "zero"``). Layer k is
one unrolled ISTA step with learned weights (Gregor & LeCun 2010; Hadou et al., arXiv 2312.15788):

    x_k = soft(W1_k y + W2_k x_{k-1}, theta_k),   soft(v, t) = sign(v) max(|v| - t, 0)

``weights = "random"`` (the default) starts from random W1, W2, so nothing makes intermediate
layers descend unless the training asks; ``"ista"`` starts at ISTA itself (W1 = A^T / c,
W2 = I - A^T A / c, c = ||A||^2), which already descends. The loss at layer k is
the per-sample mean squared error ||x_k - x*||^2 / code_dim. Perturbations act on y:
``gaussian`` adds gamma * rms(y) * N(0, I); ``impulse`` replaces each entry with probability
gamma by +-3 rms(y).

Two evaluation domains shift the data itself, with the same dictionary: ``denser`` codes (twice
the non-zeros) and ``noisier`` measurements (ten times the noise), each ``test_size`` samples.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import layerdescent
from layerdescent import LayerOutput, Task
from layerdescent.task import MAX_LAYERS

# torch, datasets and torchmetrics load inside the methods that use them: registering the task
# (`layerdescent list`) must not pay for them. The network itself is in layerdescent_lista.model.
if TYPE_CHECKING:
    import datasets
    import torch
    import torchmetrics
    from torch import nn


class SparseCoding(Task):
    """Recover sparse codes from noisy linear measurements with unrolled ISTA."""

    name = "lista"
    perturbations = ("gaussian", "impulse")
    perturbation_titles = {
        "gaussian": "Gaussian measurement noise, std = γ × RMS(y)",
        "impulse": "impulse noise: each measurement set to ±3 RMS(y) with probability γ",
    }
    gamma_ranges = {"impulse": (0.0, 1.0)}
    domains = ("denser", "noisier")
    options = {
        "layers": 8,
        "code_dim": 64,
        "measure_dim": 32,
        "sparsity": 4,
        "noise": 0.01,
        "tied": False,
        "x0": "linear",
        "weights": "random",
        "train_size": 4000,
        "validation_size": 500,
        "test_size": 1000,
        "data_seed": 0,
    }
    option_help = {
        "layers": "L, the unrolled ISTA steps; >= 1.",
        "code_dim": "Entries of the sparse code x*; >= 1.",
        "measure_dim": "Entries of the measurement y = A x* + noise; >= 1.",
        "sparsity": "Non-zeros per code; 1..code_dim.",
        "noise": "Standard deviation of the measurement noise.",
        "tied": "Share one set of step weights across all layers.",
        "x0": "Layer 0's estimate: `linear` (learned, x_0 = B y) or `zero`.",
        "weights": "Start the steps at `random` weights or at ISTA itself (`ista`, which already descends).",
        "train_size": "Training samples; >= 1.",
        "validation_size": "Validation samples; >= 1.",
        "test_size": "Test samples (and samples per domain); >= 1.",
        "data_seed": "Seeds the dictionary and the data, independent of the run's seed.",
    }

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        o = self.options
        self.check_choices(x0=("linear", "zero"), weights=("random", "ista"))
        # bounds past which a config is a typo: the dictionary and the splits are built in memory
        self.check_sizes(layers=(1, MAX_LAYERS), code_dim=(1, 16_384), measure_dim=(1, 16_384), sparsity=(1, 16_384))
        self.check_sizes(train_size=(1, 10**7), validation_size=(1, 10**7), test_size=(1, 10**7))
        if o["sparsity"] > o["code_dim"]:
            raise layerdescent.ConfigError("task.sparsity cannot exceed task.code_dim")
        import torch

        generator = torch.Generator().manual_seed(o["data_seed"])
        A = torch.randn(o["measure_dim"], o["code_dim"], generator=generator)
        self.dictionary = A / A.norm(dim=0, keepdim=True)
        self._generator = generator

    @property
    def num_layers(self) -> int:
        return self.options["layers"]

    def build_model(self) -> nn.Module:
        from layerdescent_lista.model import LISTA

        return LISTA(self.dictionary, self.num_layers, self.options["tied"], self.options["x0"], self.options["weights"])

    def _samples(self, n: int, sparsity: int, noise: float, generator: torch.Generator) -> datasets.Dataset:
        """``n`` sparse codes with ``sparsity`` non-zeros and their measurements at ``noise``."""
        import datasets
        import torch

        code_dim = self.options["code_dim"]
        support = torch.rand(n, code_dim, generator=generator).argsort(dim=1)[:, :sparsity]
        x = torch.zeros(n, code_dim).scatter_(1, support, torch.randn(n, sparsity, generator=generator))
        y = x @ self.dictionary.T + noise * torch.randn(n, self.options["measure_dim"], generator=generator)
        return datasets.Dataset.from_dict({"y": y.numpy(), "x": x.numpy()}).with_format("torch")

    def build_datasets(self) -> dict[str, datasets.Dataset]:
        import torch

        o = self.options
        generator = torch.Generator().manual_seed(o["data_seed"] + 1)
        return {split: self._samples(o[f"{split}_size"], o["sparsity"], o["noise"], generator) for split in ("train", "validation", "test")}

    def domain_dataset(self, name: str) -> datasets.Dataset:
        import torch

        o = self.options
        generator = torch.Generator().manual_seed(o["data_seed"] + 2 + self.domains.index(name))
        if name == "denser":
            return self._samples(o["test_size"], min(2 * o["sparsity"], o["code_dim"]), o["noise"], generator)
        return self._samples(o["test_size"], o["sparsity"], 10 * o["noise"], generator)

    def collate(self, rows: dict[str, Any]) -> dict[str, torch.Tensor]:
        return {"y": rows["y"], "x": rows["x"]}

    def perturb(self, y: torch.Tensor, gamma: float) -> torch.Tensor:
        """Measurements at perturbation level ``gamma``."""
        if gamma == 0:
            return y
        import torch

        rms = y.pow(2).mean().sqrt()
        if self.perturbation == "impulse":
            hit = torch.rand_like(y) < gamma
            return torch.where(hit, 3 * rms * torch.sign(torch.randn_like(y)), y)
        return y + gamma * rms * torch.randn_like(y)

    def layer_losses(self, model: nn.Module, batch: dict[str, torch.Tensor], gamma: float = 0.0) -> LayerOutput:
        estimates = model(self.perturb(batch["y"], gamma))
        losses = (estimates - batch["x"].unsqueeze(1)).pow(2).mean(dim=-1)
        return LayerOutput(losses, preds=estimates[:, -1].contiguous(), target=batch["x"])

    def metrics(self) -> torchmetrics.MetricCollection:
        import torchmetrics
        from torchmetrics.audio import SignalNoiseRatio

        return torchmetrics.MetricCollection({"mse": torchmetrics.MeanSquaredError(), "snr_db": SignalNoiseRatio()})


@layerdescent.hookimpl
def register_tasks(register) -> None:
    """Make ``lista`` available to configs."""
    register(SparseCoding)
