"""The results.json schema as a reader checks it: every value a summary uses has its type, is finite and fits the layer count.

    data = read_results(path)   # parsed and checked; LayerdescentError naming the file if it is damaged
    check(data, path)           # LayerdescentError naming the field, e.g. "gammas[1].layer_loss[2] is 'x', not a number"

:func:`layerdescent.run.finish.results_table` is what a run writes; this is what a reader trusts.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from layerdescent.errors import LayerdescentError
from layerdescent.readback import read_json

RESULTS_SCHEMA = 1  # the version of results.json a run writes (run.finish.results_table) and this module checks


class _Bad(Exception):
    """One field of results.json that is not what the schema says."""


def _number(value: Any, where: str, low: float | None = None, high: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _Bad(f"{where} is {value!r}, not a number")
    if not math.isfinite(value):
        raise _Bad(f"{where} is {value}, not a finite number")
    if (low is not None and value < low) or (high is not None and value > high):
        raise _Bad(f"{where} is {value}, outside {low if low is not None else '-inf'}..{high if high is not None else 'inf'}")
    return float(value)


def _integer(value: Any, where: str, low: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise _Bad(f"{where} is {value!r}, not an integer >= {low}")
    return value


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise _Bad(f"{where} is {value!r}, not a string")
    return value


def _numbers(value: Any, where: str, length: int | None, low: float | None = None, high: float | None = None) -> None:
    if not isinstance(value, list):
        raise _Bad(f"{where} is {value!r}, not a list of numbers")
    if length is not None and len(value) != length:
        raise _Bad(f"{where} has {len(value)} entries, but num_layers = {length - 1 if length else 0} needs {length}")
    for i, item in enumerate(value):
        _number(item, f"{where}[{i}]", low, high)


def _record(record: Any, where: str, layers: int) -> None:
    """One gamma record: the level, a loss per layer 0..L, a descent rate per transition, metrics."""
    if not isinstance(record, dict):
        raise _Bad(f"{where} is {record!r}, not a gamma record")
    _number(record.get("gamma"), f"{where}.gamma", low=0)
    _numbers(record.get("layer_loss"), f"{where}.layer_loss", layers + 1)
    _numbers(record.get("descent_rate"), f"{where}.descent_rate", layers, 0, 1)
    metrics = record.get("metrics", {})
    if not isinstance(metrics, dict):
        raise _Bad(f"{where}.metrics is {metrics!r}, not a table of numbers")
    for name, value in metrics.items():
        _number(value, f"{where}.metrics.{name}")
    if "samples" in record:
        _integer(record["samples"], f"{where}.samples", low=1)
    per_layer = record.get("layer_metrics", {})
    if not isinstance(per_layer, dict):
        raise _Bad(f"{where}.layer_metrics is {per_layer!r}, not a table of lists")
    for name, values in per_layer.items():
        _numbers(values, f"{where}.layer_metrics.{name}", layers + 1)


def record_problem(record: Any, where: str, layers: int) -> str | None:
    """What is wrong with one gamma record (a type, a range, a count that does not fit ``layers``), or None when it fits the schema."""
    try:
        _record(record, where, layers)
    except _Bad as exc:
        return str(exc)
    return None


def _check(data: dict[str, Any]) -> None:
    for key in ("label", "task", "solver"):
        _text(data.get(key), key)
    for key in ("split", "perturbation"):  # absent from the oldest runs
        if key in data:
            _text(data[key], key)
    _integer(data.get("seed"), "seed")
    layers = _integer(data.get("num_layers"), "num_layers", low=1)
    for i, record in enumerate(data.get("gammas") or []):
        _record(record, f"gammas[{i}]", layers)
    domains = data.get("domains", {})
    if not isinstance(domains, dict):
        raise _Bad(f"domains is {domains!r}, not a table of gamma records")
    for name, records in domains.items():
        if not isinstance(records, list):
            raise _Bad(f"domains.{name} is {records!r}, not a list of gamma records")
        for i, record in enumerate(records):
            _record(record, f"domains.{name}[{i}]", layers)
    train = data.get("train", {})
    if not isinstance(train, dict):
        raise _Bad(f"train is {train!r}, not a table")
    if train.get("step_time_median") is not None:
        _number(train["step_time_median"], "train.step_time_median", low=0)
    for key in ("steps", "epochs", "skipped_steps"):  # counts a summary and the cost table read
        if key in train:
            _integer(train[key], f"train.{key}")
    if "eval_seconds" in data:  # absent from runs before evaluations were timed
        _number(data["eval_seconds"], "eval_seconds", low=0)
    work = data.get("eval_workload", {})
    if not isinstance(work, dict):
        raise _Bad(f"eval_workload is {work!r}, not a table")
    for key in ("gammas", "records", "forward_rows"):
        if key in work:
            _integer(work[key], f"eval_workload.{key}")
    rows = work.get("rows", {})
    if not isinstance(rows, dict):
        raise _Bad(f"eval_workload.rows is {rows!r}, not a table of row counts")
    for name, count in rows.items():
        _integer(count, f"eval_workload.rows.{name}")
    constraints = data.get("constraints", {})
    if not isinstance(constraints, dict):
        raise _Bad(f"constraints is {constraints!r}, not a table")
    for name, table in constraints.items():
        if not isinstance(table, dict):
            raise _Bad(f"constraints.{name} is {table!r}, not a table")
        for key in ("lambda", "relaxation"):
            if key in table:
                _numbers(table[key], f"constraints.{name}.{key}", None, low=0 if key == "lambda" else None)


def check(data: dict[str, Any], path: Path) -> None:
    """Raise LayerdescentError naming ``path`` and the first field of ``data`` (a parsed results.json) that breaks the schema."""
    try:
        _check(data)
    except _Bad as bad:
        raise LayerdescentError(f"{path}: {bad}; the file is damaged or was edited: re-run or re-evaluate that run") from None


# What a summary reads from each results.json, and of each gamma record.
RESULT_KEYS = ("label", "task", "solver", "seed", "num_layers", "gammas")
GAMMA_KEYS = ("gamma", "layer_loss", "descent_rate")


def read_results(path: Path) -> dict:
    """One results.json, checked for what a summary reads; LayerdescentError naming the file if it is damaged."""
    path = Path(path)
    data = read_json(path, fix="re-run or re-evaluate that run")  # bounded: a huge or deeply nested file is one line
    if not isinstance(data, dict):
        raise LayerdescentError(f"{path} holds a JSON {type(data).__name__}, not a results object; re-run or re-evaluate that run")
    missing = [k for k in RESULT_KEYS if k not in data]
    if missing:
        raise LayerdescentError(f"{path} lacks {', '.join(map(repr, missing))}; it is not a layerdescent results.json (or is damaged)")
    records = [data["gammas"], *(data.get("domains") or {}).values()]
    for record in (r for rs in records for r in (rs if isinstance(rs, list) else [None])):
        if not isinstance(record, dict) or any(k not in record for k in GAMMA_KEYS) or not isinstance(record.get("metrics", {}), dict):
            raise LayerdescentError(f"{path}: every gamma record needs {', '.join(GAMMA_KEYS)} and a metrics table; the file is damaged")
    if not data["gammas"]:
        raise LayerdescentError(f"{path} records no gamma; re-run or re-evaluate that run")
    data.setdefault("train", {})
    for record in (r for rs in records for r in rs):
        record.setdefault("metrics", {})
    check(data, path)  # types, finiteness and the layer count of every value a summary reads
    return data
