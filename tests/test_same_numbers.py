"""A refactor must not move the numbers: each built-in solver's results.json equals the one recorded before the solver redesign.

The recorded files in ``tests/data/same_numbers/`` were written by main at dfa1fff (before solvers
became plugins) with ``LAYERDESCENT_RECORD=1 python -m pytest tests/test_same_numbers.py``, on
the CPU with one torch thread. Timings and the package version are the only keys left out.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest

import layerdescent as ld
from conftest import TINY

RECORDED = Path(__file__).parent / "data" / "same_numbers"
TIMING_KEYS = ("step_time_median", "layerdescent")

TEXT = {
    "task": {"name": "text-classification", "model_path": "tiny", "dataset": "synthetic", "synthetic_size": 200, "max_length": 16},
    "train": {"epochs": 1, "batch_size": 32, "lr": 1e-3, "progress": False, "log_every": 2, "threads": 1, "train_gamma": 0.5},
    "solver": {"name": "primal-dual", "dual_lr": 1.0},
    "constraints": [{"kind": "descent", "alpha": 0.05}],
    "eval": {"gammas": [0.0, 1.0], "batch_size": 64},
}


def _config(base: dict, solver: dict) -> dict:
    table = copy.deepcopy(base)
    table["solver"] = solver
    return table


CASES = {
    "lista-erm": _config(TINY, {"name": "erm"}),
    "lista-penalty": _config(TINY, {"name": "penalty"}),
    "lista-primal-dual": _config(TINY, {"name": "primal-dual", "dual_lr": 1.0}),
    "lista-primal-dual-nupi-every-3": _config(TINY, {"name": "primal-dual", "dual_lr": 0.5, "dual_optimizer": "nupi", "dual_every": 3}),
    "text-erm": _config(TEXT, {"name": "erm"}),
    "text-penalty": _config(TEXT, {"name": "penalty"}),
    "text-primal-dual": _config(TEXT, {"name": "primal-dual", "dual_lr": 1.0}),
}


def _without_timings(value):
    if isinstance(value, dict):
        return {k: _without_timings(v) for k, v in value.items() if k not in TIMING_KEYS}
    if isinstance(value, list):
        return [_without_timings(v) for v in value]
    return value


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_solver_gives_the_results_recorded_before_the_redesign(case, tmp_path):
    if case.startswith("text"):
        pytest.importorskip("transformers")
    results = ld.train(ld.config_from_dict(CASES[case]), tmp_path / "run")
    got = _without_timings(json.loads(json.dumps(results)))  # as results.json holds it
    path = RECORDED / f"{case}.json"
    if os.environ.get("LAYERDESCENT_RECORD"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    assert got == json.loads(path.read_text())  # exact floats: the same operations in the same order
