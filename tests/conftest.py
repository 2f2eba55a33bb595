"""Shared fixtures: tiny, fast configs on the bundled lista task, one torch thread."""

from __future__ import annotations

import copy

import pytest
import torch

torch.set_num_threads(1)

TINY = {
    "task": {
        "name": "lista",
        "layers": 4,
        "code_dim": 16,
        "measure_dim": 12,
        "sparsity": 2,
        "train_size": 512,
        "validation_size": 64,
        "test_size": 128,
    },
    "train": {"epochs": 2, "batch_size": 64, "lr": 0.01, "progress": False, "log_every": 4},
    "solver": {"name": "primal-dual", "dual_lr": 1.0},
    "constraints": [{"kind": "descent", "alpha": 0.05}],
    "eval": {"gammas": [0.0, 0.5]},
}


@pytest.fixture
def tiny() -> dict:
    """A config table that trains lista in about a second."""
    return copy.deepcopy(TINY)
