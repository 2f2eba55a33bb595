"""A micro-batch's rows with where they came from, and how per-level and per-sample constraints group them: a level, a row or both."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from layerdescent.core.constraints import ConstraintSpec
from layerdescent.errors import ConfigError


@dataclass
class LayerBatch:
    """One micro-batch's per-row layer losses and where each row came from, for per-level and per-sample constraints."""

    losses: torch.Tensor  # B x (L+1)
    rows: torch.Tensor | None = None  # each row's index in the training split
    levels: torch.Tensor | None = None  # each row's perturbation level, as an index into the band

    @classmethod
    def of(cls, losses: torch.Tensor, rows: torch.Tensor | None = None, levels: torch.Tensor | None = None) -> LayerBatch:
        """B x (L+1) per-row losses with each row's index in the training split and level in the band: the one place a micro-batch's rows are named."""
        if losses.dim() != 2:
            raise ConfigError("constraints held per level or per sample need the B x (L+1) per-row losses, not their means")
        return cls(losses, rows, levels)


@dataclass(frozen=True)
class Grouping:
    """How a per-level or per-sample spec's multipliers are indexed: group x entry, a group being a level, a row or a (row, level)."""

    levels: tuple[int, ...]  # the band indices of the levels it holds at; empty: pooled over levels
    band: tuple[float, ...]
    rows: int  # training rows when per sample, else 0
    entries: int  # violation entries per level

    @classmethod
    def of(cls, spec: ConstraintSpec, entries: int, band: tuple[float, ...], rows: int | None) -> Grouping:
        """The grouping of ``spec`` over this band and training split; a ConfigError when it needs what the run lacks."""
        held: tuple[int, ...] = ()
        if spec.levels is not None:
            wanted = spec.held_levels(band)
            if len(band) < 2 or any(g not in band for g in wanted):
                raise ConfigError(
                    f"constraint {spec.name!r}: levels {spec.levels!r} need a training band holding them (train.train_gamma = [...], or LayerwiseUpdate(band=...)); the band is {list(band)}"
                )
            held = tuple(band.index(g) for g in wanted)
        if spec.per_sample and not rows:
            raise ConfigError(
                f"constraint {spec.name!r}: per_sample = true needs the training rows' count and each row's index (LayerwiseUpdate(rows=len(train_set)), backward(losses, rows=indices))"
            )
        return cls(held, band, (rows or 0) if spec.per_sample else 0, entries)

    @property
    def block(self) -> int:
        """Entries per row: one per (level, entry)."""
        return max(len(self.levels), 1) * self.entries

    @property
    def size(self) -> int:
        """Multipliers in all: groups x entries."""
        return max(self.rows, 1) * self.block

    def labels(self, entry_labels: list[str]) -> list[str]:
        """One label per entry of a row's block (``l3<=l2@0.8`` per level)."""
        if not self.levels:
            return list(entry_labels)
        return [f"{label}@{self.band[j]:g}" for j in self.levels for label in entry_labels]

    def groups(self, batch: LayerBatch) -> torch.Tensor:
        """Each row's group id, -1 where its level is not held."""
        n = batch.losses.shape[0]
        device = batch.losses.device
        slot = torch.zeros(n, dtype=torch.long, device=device)
        valid = torch.ones(n, dtype=torch.bool, device=device)
        if self.levels:
            if batch.levels is None:
                raise ConfigError("a constraint held per level needs each row's level: backward(losses, levels=band indices)")
            lookup = torch.full((len(self.band),), -1, dtype=torch.long, device=device)
            lookup[list(self.levels)] = torch.arange(len(self.levels), device=device)
            slot = lookup[batch.levels.to(device)]
            valid = slot >= 0
        if self.rows:
            if batch.rows is None:
                raise ConfigError("a per-sample constraint needs each row's index: backward(losses, rows=indices into the training split)")
            rows = batch.rows.to(device)
            if bool(((rows < 0) | (rows >= self.rows)).any()):
                raise ConfigError(
                    f"a per-sample constraint got a row index outside 0..{self.rows - 1}: rows must index the training split it was built for"
                )
            slot = rows * max(len(self.levels), 1) + slot.clamp(min=0)
        return torch.where(valid, slot, -1)

    def sums(self, batch: LayerBatch, detach: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-group sums of the layer losses (detached unless asked) and per-group row counts, as tables over every group."""
        ids = self.groups(batch)
        keep = ids >= 0
        groups = self.size // self.entries
        losses = batch.losses.detach() if detach else batch.losses
        sums = torch.zeros(groups, losses.shape[1], dtype=losses.dtype, device=losses.device).index_add_(0, ids[keep], losses[keep])
        counts = torch.zeros(groups, dtype=losses.dtype, device=losses.device).index_add_(
            0, ids[keep], torch.ones_like(ids[keep], dtype=losses.dtype)
        )
        return sums, counts

    def indices(self, groups: torch.Tensor) -> torch.Tensor:
        """The flat multiplier indices of these groups' entries, group-major."""
        return (groups[:, None] * self.entries + torch.arange(self.entries, device=groups.device)).flatten()


def add_tables(
    total: dict[str, tuple[torch.Tensor, torch.Tensor]], tables: dict[str, tuple[torch.Tensor, torch.Tensor]]
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Per-group loss sums and row counts added up, constraint by constraint (new tensors: neither input changes)."""
    out = dict(total)
    for name, (sums, counts) in tables.items():
        out[name] = (sums, counts) if name not in out else (out[name][0] + sums, out[name][1] + counts)
    return out


def grouped_violation(spec: ConstraintSpec, means: torch.Tensor, state: dict[str, torch.Tensor]) -> torch.Tensor:
    """G x entries violations of G rows of layer means (a loop over rows where the kind does not broadcast)."""
    if spec.per_row:
        return spec.violation(means, state)
    return torch.stack([spec.violation(row, state) for row in means])
