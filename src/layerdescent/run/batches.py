"""The order a run reads its training rows in: each epoch's shuffle, each micro-batch's level in the band, the steps they make.

    session = layerdescent.build_session(config)     # seeded as `layerdescent run` seeds
    for epoch in range(config.train.epochs):
        for step in layerdescent.batches(session, epoch):
            ...                                      # each step: its micro-batches, as the trainer reads them

The trainer reads its batches from here too, so a loop of one's own that follows these steps takes
the run's steps in the run's order (docs/own-loop.md has the loop that reproduces a run).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from layerdescent.run.config import RunConfig
    from layerdescent.run.session import Session


def epoch_order(config: RunConfig, epoch: int, samples: int) -> tuple[torch.Tensor, ...]:
    """The micro-batches of ``epoch`` as training-row indices: a shuffle drawn from the seed and the epoch alone, so a resumed run draws it again."""
    order = torch.randperm(samples, generator=torch.Generator().manual_seed(config.seed * 100_003 + epoch))
    return order.split(config.train.batch_size)


def epoch_levels(config: RunConfig, epoch: int, micro_batches: int) -> list[int]:
    """Each micro-batch's level in the training band this epoch (-1: every level, gamma_sampling = 'all').

    Drawn from the seed and the epoch alone, so a resumed run draws the same levels, and every
    solver trained with the same seed sees the same level at the same step.
    """
    train = config.train
    if train.gamma_sampling == "all":
        return [-1] * micro_batches
    if len(train.band) == 1:
        return [0] * micro_batches
    generator = torch.Generator().manual_seed(config.seed * 100_003 + epoch + 7_919_000)
    return torch.randint(len(train.band), (micro_batches,), generator=generator).tolist()


@dataclass(frozen=True)
class MicroBatch:
    """One micro-batch of a training step as ``layerdescent run`` reads it: the collated rows, the levels they are read at, their share of the step."""

    batch: Any
    """``task.collate`` of the rows."""
    rows: torch.Tensor
    """Each loss row's index in the training split (the indices repeat once per gamma)."""
    gammas: tuple[float, ...]
    """The perturbation levels to read it at, in order: one, or the whole band under ``gamma_sampling = "all"``."""
    levels: torch.Tensor
    """Each loss row's level, an index into the band."""
    weight: float
    """Its share of the step, for ``LayerwiseUpdate.backward(losses, weight)``."""


def batches(session: Session, epoch: int) -> Iterator[list[MicroBatch]]:
    """The optimizer steps of ``epoch`` in the order ``layerdescent run`` takes them, each a list of ``train.accumulate`` micro-batches (fewer at the epoch's end).

    Stack each micro-batch's losses as ``torch.cat([task.layer_losses(model, m.batch, gamma=g).losses for g in m.gammas])``:
    row i of that is ``m.rows[i]`` at band level ``m.levels[i]``.
    """
    config, task, train_set = session.config, session.task, session.rows["train"]
    band, accumulate = config.train.band, config.train.accumulate
    micro = epoch_order(config, epoch, len(train_set))
    levels = epoch_levels(config, epoch, len(micro))
    for start in range(0, len(micro), accumulate):
        group, group_levels = micro[start : start + accumulate], levels[start : start + accumulate]
        total = sum(len(idx) for idx in group)
        step = []
        for idx, level in zip(group, group_levels):
            at = range(len(band)) if level < 0 else [level]
            step.append(
                MicroBatch(
                    batch=task.collate(train_set[idx]),
                    rows=idx.repeat(len(at)),
                    gammas=tuple(band[k] for k in at),
                    levels=torch.tensor(list(at)).repeat_interleave(len(idx)),
                    weight=len(idx) / total,
                )
            )
        yield step
