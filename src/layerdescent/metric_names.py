"""The names every front logs a training line's values under (the CLI's trackers, DescentTrainer, DescentModule, DescentCallback): one vocabulary, light to import."""

from __future__ import annotations

import re
from typing import Any


def metric_label(label: str) -> str:
    """A constraint entry's label in the characters every tracker takes (MLflow's: letters, digits, ``_ - . /``): ``l2<=l1@0.5`` -> ``l2_le_l1_at_0.5``."""
    return re.sub(r"[^A-Za-z0-9_./-]", "_", label.replace("<=", "_le_").replace("@", "_at_"))


def line_scalars(line: dict[str, Any], labels: dict[str, list[str]]) -> dict[str, float]:
    """A training log line (``LayerwiseUpdate.record()``, a metrics.jsonl ``train`` record) as named values: the one vocabulary of every front.

    ``train/loss/lK`` (layer K's mean loss), ``train/feasible``, ``train/lambda/NAME/LABEL``,
    ``train/violation/NAME/LABEL``, ``train/relaxation/NAME/LABEL``, ``train/penalty/NAME`` and
    ``train/binding_rows/NAME``; ``labels`` is each constraint's entry labels (``LayerwiseUpdate.labels``,
    results.json's ``constraints.NAME.labels``). A null (an entry no step saw) is left out.
    """
    out: dict[str, Any] = {f"train/loss/l{k}": v for k, v in enumerate(line.get("loss", []))}
    out["train/feasible"] = line.get("feasible")
    for kind in ("lambda", "violation", "relaxation"):
        for name, values in line.get(kind, {}).items():
            out.update({f"train/{kind}/{name}/{metric_label(label)}": v for label, v in zip(labels[name], values)})
    for kind in ("penalty", "binding_rows"):
        out.update({f"train/{kind}/{name}": v for name, v in line.get(kind, {}).items()})
    return {key: float(v) for key, v in out.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
