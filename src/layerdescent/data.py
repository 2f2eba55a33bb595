"""Batches of rows from a ``datasets.Dataset`` without paying Arrow's per-query cost each step."""

from __future__ import annotations

from typing import Any, Iterator, Sequence

import datasets
import torch


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

    def batches(self, batch_size: int) -> Iterator[dict[str, Any]]:
        """Consecutive batches of rows, in order."""
        for start in range(0, self.length, batch_size):
            yield self[start : start + batch_size]
