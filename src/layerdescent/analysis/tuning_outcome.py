"""A tuning trial's outcome: its criterion read from its seeds' results, whether a seed failed, whether it qualifies.

A trial's criterion is the mean over its seeds, and a trial with a failed seed qualifies for nothing.
"""

from __future__ import annotations

import math
from pathlib import Path

from layerdescent.analysis.tuning_search import BEST_VAL_LOSS, Search, Trial
from layerdescent.results import read_results
from layerdescent.run import rundir


def _criterion(search: Search, results: dict) -> float | None:
    """The trial's criterion at ``search.gamma``; None where the run did not record it."""
    if search.criterion == BEST_VAL_LOSS:  # its trials validate at gamma during training (see the bench's plan)
        value = (results.get("train", {}).get("best_val_loss") or [None])[-1]
        return float(value) if value is not None and math.isfinite(value) else None
    record = next((r for r in results.get("gammas", []) if float(r["gamma"]) == search.gamma), None)
    if record is None:
        return None
    value = record["layer_loss"][-1] if search.criterion == "loss" else record.get("metrics", {}).get(search.criterion)
    return float(value) if value is not None and math.isfinite(value) else None


def _binds(results: dict) -> bool:
    return any(x > 0 for table in results.get("constraints", {}).values() for x in table.get("lambda", []))


def trial_outcome(search: Search, out: Path, name: str, trial: Trial) -> dict | None:
    """A trial's record: its criterion (the mean over its seeds), whether a seed failed, whether it qualifies; None while a seed is still to run."""
    values, failed, binds = {}, False, True
    for seed, run_dir in zip(search.seeds, search.run_dirs(out, name)):
        if rundir.failure(run_dir) is not None:
            failed = True
            continue
        if not (run_dir / "results.json").exists():
            return None
        results = read_results(run_dir / "results.json")
        values[seed] = _criterion(search, results)
        binds = binds and _binds(results)
    known = not failed and all(v is not None for v in values.values())
    value = math.fsum(values.values()) / len(values) if known else None
    qualifies = value is not None and (search.qualify == "any" or binds)
    record = {"run": name, "settings": dict(trial), "value": value, "failed": failed, "qualifies": qualifies}
    if len(search.seeds) > 1:  # a one-seed search's record stays as committed benches wrote it
        record["values"] = {str(seed): values.get(seed) for seed in search.seeds}
    return record
