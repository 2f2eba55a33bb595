"""Per-layer loss, descent rate and task metrics at every perturbation level gamma."""

from __future__ import annotations

from typing import Any, Iterable

import datasets
import torch

from layerdescent.data import Rows
from layerdescent.task import Task


@torch.no_grad()
def evaluate(task: Task, model: torch.nn.Module, dataset: datasets.Dataset | Rows, gammas: Iterable[float], batch_size: int = 256, seed: int = 1234) -> list[dict[str, Any]]:
    """One record per gamma: ``layer_loss`` (L+1), ``descent_rate`` (L), ``metrics``, ``samples``.

    Each gamma draws its perturbations from a torch RNG seeded with ``seed``, so the numbers do
    not depend on what ran before, and the caller's RNG is left as it was.
    """
    rows = dataset if isinstance(dataset, Rows) else Rows(dataset)
    was_training = model.training
    model.eval()
    records = []
    try:
        for gamma in gammas:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                metrics = task.metrics()
                loss_sum = descents = None
                count = 0
                for rows_batch in rows.batches(batch_size):
                    out = task.layer_losses(model, task.collate(rows_batch), gamma=float(gamma))
                    losses = out.losses.detach().double()
                    loss_sum = losses.sum(0) if loss_sum is None else loss_sum + losses.sum(0)
                    falls = (losses[:, 1:] < losses[:, :-1]).sum(0)
                    descents = falls if descents is None else descents + falls
                    count += losses.shape[0]
                    if out.preds is not None:
                        metrics.update(out.preds, out.target)
                if count == 0:
                    raise ValueError("cannot evaluate on an empty dataset")
                computed = metrics.compute() if len(metrics) else {}
                records.append(
                    {
                        "gamma": float(gamma),
                        "layer_loss": (loss_sum / count).tolist(),
                        "descent_rate": (descents.double() / count).tolist(),
                        "metrics": {name: float(value) for name, value in computed.items()},
                        "samples": count,
                    }
                )
    finally:
        model.train(was_training)
    return records
