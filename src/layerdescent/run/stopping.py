"""When a run must stop between epochs: early stopping, and a final evaluation that is not finite (a step's own reasons: core.divergence)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from layerdescent.errors import DataError

if TYPE_CHECKING:
    from layerdescent.run.config import TrainConfig
    from layerdescent.run.trainer import Position


def check_finite_results(evaluation: dict[str, Any], who: str) -> None:
    """Raise DataError when the final evaluation holds a NaN or infinite loss, before results.json is written."""
    where = [("test", evaluation["gammas"]), *((f"domain {name!r}", records) for name, records in evaluation.get("domains", {}).items())]
    for what, records in where:
        for record in records:
            for key in ("layer_loss", "descent_rate"):
                bad = [k for k, v in enumerate(record[key]) if not math.isfinite(v)]
                if bad:
                    raise DataError(
                        f"{who}: layer_losses gave a non-finite evaluation loss on the {what} set at gamma {record['gamma']:g}, "
                        f"l{bad[0]} = {record[key][bad[0]]}; results.json was not written (check the perturbation at that level)"
                    )


def patience_spent(train: TrainConfig, position: Position) -> bool:
    """Whether early stopping has seen ``train.early_stopping`` epochs without a better validation loss."""
    return bool(train.early_stopping) and position.epoch - 1 - position.best_epoch >= train.early_stopping


def improved(train: TrainConfig, position: Position, val_loss: list[float]) -> bool:
    """Record a new best last-layer validation loss in ``position``; True when it is one (early stopping keeps its model)."""
    if not train.early_stopping or val_loss[-1] >= position.best_loss:
        return False
    position.best_loss, position.best_epoch = val_loss[-1], position.epoch
    position.best_val_loss = val_loss  # every layer's, for tuning and the reports
    return True
