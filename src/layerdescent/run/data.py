"""Batches of rows from a ``datasets.Dataset`` without paying Arrow's per-query cost each step."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import datasets
import torch

from layerdescent.errors import DataError


class Rows:
    """A split's columns held in memory once, indexed like ``dataset[indices]``.

    Arrow-backed indexing costs about a millisecond per batch, as much as a whole training step
    of a small model; reading the columns once makes batch access nearly free.
    """

    def __init__(self, dataset: datasets.Dataset) -> None:
        self.columns: dict[str, Any] = dataset[:]
        self.length = len(dataset)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: Sequence[int] | torch.Tensor | slice) -> dict[str, Any]:
        if isinstance(index, slice):
            return {name: column[index] for name, column in self.columns.items()}
        index = torch.as_tensor(index, dtype=torch.long)
        positions = index.tolist()
        return {
            name: column[index] if isinstance(column, torch.Tensor) else [column[i] for i in positions]
            for name, column in self.columns.items()
        }

    def check_finite(self, split: str) -> None:
        """Raise DataError naming the split, column and row of the first NaN or infinity."""
        for name, column in self.columns.items():
            if isinstance(column, torch.Tensor) and column.is_floating_point() and not bool(torch.isfinite(column).all()):
                row = int((~torch.isfinite(column.reshape(self.length, -1))).any(dim=1).nonzero()[0])
                raise DataError(f"split {split!r}, column {name!r}, row {row} holds a NaN or infinite value; clean or drop that row")
