"""Shared fixtures: tiny, fast configs on the bundled lista task, one torch thread."""

from __future__ import annotations

import copy

import pytest
import torch

torch.set_num_threads(1)


def lista_task(
    layers: int = 4, code_dim: int = 16, measure_dim: int = 12, train_size: int = 512, validation_size: int = 64, test_size: int = 128
) -> dict:
    """The bundled lista task's table at a test's sizes (two nonzeros per code)."""
    return {
        "name": "lista",
        "layers": layers,
        "code_dim": code_dim,
        "measure_dim": measure_dim,
        "sparsity": 2,
        "train_size": train_size,
        "validation_size": validation_size,
        "test_size": test_size,
    }


# the smallest lista that still trains: 3 layers, 64 training rows
SMALL_LISTA_TASK = lista_task(layers=3, code_dim=8, measure_dim=6, train_size=64, validation_size=16, test_size=16)

TINY = {
    "task": lista_task(),
    "train": {"epochs": 2, "batch_size": 64, "lr": 0.01, "progress": False, "log_every": 4},
    "solver": {"name": "primal-dual", "dual_lr": 1.0},
    "constraints": [{"kind": "descent", "alpha": 0.05}],
    "eval": {"gammas": [0.0, 0.5]},
}


@pytest.fixture
def tiny() -> dict:
    """A config table that trains lista in about a second."""
    return copy.deepcopy(TINY)
