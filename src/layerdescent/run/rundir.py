"""The run directory: what it may already hold, its recorded config, its log, a failure, and an interrupted evaluation's records.

    prepare(run_dir, config, registry, resume)  # record the config; a resume must ask for the recorded one
    config_difference(recorded_table, config)   # "train.lr (recorded 0.003, asked 0.01)" or None
    partial_evaluation(run_dir, key)            # an interrupted evaluation's records, where ``key`` (model and eval config) matches

The names of its files are :mod:`layerdescent.run.layout`'s, its lock :mod:`layerdescent.run.lock`'s,
how each file is written :mod:`layerdescent.run.files`'s, and the results.json it ends with
:mod:`layerdescent.run.finish`'s.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from layerdescent.errors import CheckpointError, ConfigError, LayerdescentError
from layerdescent.options import flat_keys
from layerdescent.readback import ReadbackError, parse_json, read_bytes, read_json, read_json_object
from layerdescent.results import record_problem
from layerdescent.run.config import config_from_dict
from layerdescent.run.config_file import read_toml
from layerdescent.run.files import open_own, write_atomic
from layerdescent.run.layout import EVALUATION_PARTIAL, EXECUTION_KEYS, FAILURE, MODEL_FILE, TRACKER_STORES, WRITES


def result_files(root: Path) -> list[Path]:
    """Every run's results.json under ``root``, without the copies a tracker's store holds."""
    root = Path(root)
    return sorted(p for p in root.rglob("results.json") if not set(p.relative_to(root).parts[:-1]) & set(TRACKER_STORES))


def save_failure(run_dir: Path, epoch: int, step: int, exc: BaseException, stage: str) -> None:
    """Record in ``run_dir`` that its run failed at ``step`` of ``stage`` (training or its final evaluation), and why."""

    record = {"epoch": epoch, "step": step, "stage": stage, "error": f"{type(exc).__name__}: {exc}"}
    try:
        write_atomic(run_dir / FAILURE, json.dumps(record) + "\n")
    except OSError:
        pass  # a full disk, say: the run's own error is the one to raise


def failure(run_dir: Path) -> dict[str, Any] | None:
    """The failure ``run_dir``'s run ended with (epoch, step, stage, error), or None (a damaged record says nothing)."""
    try:
        record = read_json(run_dir / FAILURE, optional=True)
    except ReadbackError:
        return None
    return record if isinstance(record, dict) else None


def last_record(run_dir: Path, tail: int = 1 << 20) -> dict[str, Any] | None:
    """The last whole record of the run's metrics.jsonl that names a step (from its last ``tail`` bytes), or None."""
    path = run_dir / "metrics.jsonl"
    try:
        lines = (read_bytes(path, limit=tail, tail=True, optional=True) or b"").splitlines()
    except ReadbackError:
        return None
    for line in reversed(lines):  # the last may be half written
        try:
            record = parse_json(line, path)
        except ReadbackError:
            continue
        if isinstance(record, dict) and isinstance(record.get("step"), int):
            return record
    return None


def config_difference(recorded: dict[str, Any], wanted: Any, registry: Any = None) -> str | None:
    """The first key on which a recorded config table differs from RunConfig ``wanted`` (defaults filled in), or None.

    Both sides go through the same validation, so a run recorded before an option existed, whose
    table lacks the key, compares equal to a config that leaves the option at its default.
    """
    try:
        resolved = config_from_dict(recorded, registry).as_dict()
    except LayerdescentError as exc:
        return f"the recorded config no longer loads ({(str(exc).splitlines() or [''])[0]})"
    have, want = flat_keys(resolved), flat_keys(wanted.as_dict())
    missing = object()
    for key in dict.fromkeys([*want, *have]):
        if any(key == name or key.startswith(f"{name}.") for name in EXECUTION_KEYS):
            continue  # a tracker's options, train.trackers.NAME.KEY, are how the run is watched too
        a, b = have.get(key, missing), want.get(key, missing)
        if a != b:
            show = lambda v: "unset" if v is missing else repr(v)
            return f"{key} (recorded {show(a)}, asked {show(b)})"
    return None


def prepare(run_dir: Path, config: Any, registry: Any, resume: bool, write: bool = True) -> None:
    """Check that ``run_dir`` may take this run (new, or resumed under the same config) and record its config."""
    import tomli_w

    config_file, checkpoint = run_dir / "config.toml", run_dir / "checkpoint.pt"
    finished = (run_dir / "results.json").exists()
    if resume:
        if config_file.exists():
            difference = config_difference(read_toml(config_file), config, registry)
            if difference:
                raise ConfigError(
                    f"--resume: the config differs from the one recorded in {config_file} at {difference}; resume with the same config"
                )
        if finished and not checkpoint.exists():
            raise ConfigError(
                f"{run_dir} holds a finished run and no checkpoint.pt: nothing to resume (train.keep_checkpoint = true keeps it); --out a new directory"
            )
    elif checkpoint.exists() or finished:
        raise ConfigError(f"{run_dir} already holds a run; pass --resume to continue it or --out a new directory")
    if not write:
        return
    for name in WRITES:
        for stale in run_dir.glob(f".{name}.*"):
            stale.unlink()  # a write cut short by a kill
    (run_dir / FAILURE).unlink(missing_ok=True)  # it trains again: the old failure no longer says how it ended
    write_atomic(config_file, tomli_w.dumps(config.as_dict()))
    if not (resume and checkpoint.exists()):
        write_atomic(run_dir / "metrics.jsonl", "")  # nothing to continue: start the log over


def rewind_log(metrics_file: Path, checkpoint: Path, offset: int) -> None:
    """Cut metrics.jsonl back to what it held when ``checkpoint`` was written, or CheckpointError when it cannot be the same log."""

    if not metrics_file.exists():
        raise CheckpointError(
            f"{metrics_file} is missing, so the run's log cannot continue: restore it, or start the run again in a new --out"
        )
    fd = open_own(metrics_file, os.O_RDWR)
    with os.fdopen(fd, "r+b") as handle:
        size = os.fstat(fd).st_size
        if offset > size:
            raise CheckpointError(
                f"checkpoint {checkpoint} says metrics.jsonl held {offset} bytes, but it holds {size}: "
                f"the log is not the one this checkpoint wrote; restore it, or start the run again in a new --out"
            )
        problem = _log_problem(handle.read(offset))
        if problem:
            raise CheckpointError(
                f"{metrics_file}{problem}, before the point checkpoint {checkpoint} continues from: the log was damaged; restore it, or start the run again in a new --out"
            )
        handle.truncate(offset)  # drop what was logged after the checkpoint


def _log_problem(kept: bytes) -> str | None:
    """Why the part of a log a resume keeps is not whole JSON records, one a line (``:LINE ...``), or None."""
    if kept and not kept.endswith(b"\n"):
        return " does not end a line where the checkpoint says it does"
    for number, line in enumerate(kept.splitlines(), 1):
        try:
            record = parse_json(line, "metrics.jsonl")
        except ReadbackError:  # not UTF-8, not JSON, or nested past what a log line holds
            return f":{number} is not a JSON record"
        if not isinstance(record, dict) or not isinstance(record.get("event"), str):
            return f":{number} is not a log record"
    return None


def partial_evaluation(
    run_dir: Path, key: dict[str, Any], gammas: Sequence[float], domains: Sequence[str], layers: int
) -> tuple[dict[str, Any] | None, str | None]:
    """The records an interrupted evaluation of the same model under the same eval config saved, checked as strictly as results.json, and a line saying what was dropped.

    Each set keeps its records up to the first that does not fit: a type or range the schema
    refuses, another gamma than ``gammas`` asks for at that place, or a set not asked for. Those are
    evaluated again. A file without the checksum it was written with (missing, or not its records')
    is not believed at all: the evaluation starts again. None where there is nothing to resume (no
    file, another model's or another eval config's).
    """
    path = run_dir / EVALUATION_PARTIAL
    try:
        saved = read_json(path, optional=True, fix="the evaluation starts again")
    except ReadbackError as exc:
        return None, str(exc)
    if not isinstance(saved, dict) or saved.get("key") != key:
        return None, None
    evaluation = saved.get("evaluation")
    if not isinstance(evaluation, dict):
        return None, f"{path} holds no table of records: the evaluation starts again"
    if saved.get("sha256") != _digest(evaluation):
        what = "has no checksum" if "sha256" not in saved else "was changed since it was written (its checksum differs)"
        return None, f"{path} {what}, so its records are not used: the evaluation starts again"
    dropped: list[str] = []
    kept: dict[str, Any] = {"gammas": _fitting(evaluation.get("gammas"), gammas, layers, "gammas", dropped)}
    recorded = evaluation.get("domains", {})
    if not isinstance(recorded, dict):
        dropped.append(f"domains is {type(recorded).__name__}, not a table of records")
        recorded = {}
    for name, records in recorded.items():
        if name not in domains:
            dropped.append(f"domain {name!r} was not asked for (eval.domains)")
            continue
        if fitting := _fitting(records, gammas, layers, f"domains.{name}", dropped):
            kept.setdefault("domains", {})[name] = fitting
    seconds = evaluation.get("eval_seconds", 0.0)
    fits = isinstance(seconds, (int, float)) and not isinstance(seconds, bool) and math.isfinite(seconds) and seconds >= 0
    kept["eval_seconds"] = float(seconds) if fits else 0.0
    if not fits:
        dropped.append(f"eval_seconds is {seconds!r}, not a time")
    if not dropped:
        return kept, None
    more = f" ({len(dropped) - 1} more like it)" if len(dropped) > 1 else ""
    return kept, f"{path}: {dropped[0]}; what does not fit is evaluated again{more}"


def _fitting(records: Any, gammas: Sequence[float], layers: int, where: str, dropped: list[str]) -> list[dict[str, Any]]:
    """The leading records of one set that fit the schema and the gammas asked for, in order; the first that does not is noted in ``dropped``."""
    if records is None:
        return []
    if not isinstance(records, list):
        dropped.append(f"{where} is {type(records).__name__}, not a list of records")
        return []
    kept = []
    for i, record in enumerate(records):
        problem = record_problem(record, f"{where}[{i}]", layers)
        if problem is None and i >= len(gammas):
            problem = f"{where}[{i}] is a record for gamma {record['gamma']:g}, which eval.gammas does not ask for"
        elif problem is None and record["gamma"] != gammas[i]:
            problem = f"{where}[{i}] is a record for gamma {record['gamma']:g}, where eval.gammas[{i}] is {gammas[i]:g}"
        if problem is not None:
            dropped.append(problem)
            break
        kept.append(record)
    return kept


def _digest(evaluation: dict[str, Any]) -> str:
    """The checksum a partial evaluation is saved with, so that an edit is seen."""

    return hashlib.sha256(json.dumps(evaluation, sort_keys=True).encode()).hexdigest()


def save_partial_evaluation(run_dir: Path, key: dict[str, Any], evaluation: dict[str, Any]) -> None:
    """Record the evaluation's records so far under ``key``, with their checksum, replacing the file whole."""

    write_atomic(run_dir / EVALUATION_PARTIAL, json.dumps({"key": key, "evaluation": evaluation, "sha256": _digest(evaluation)}) + "\n")


def final_model_file(run_dir: Path, config: Any) -> Path:
    """The file holding a finished run's tested model: model.safetensors, or in runs from before it best.pt / checkpoint.pt."""
    for name in (MODEL_FILE, "best.pt" if config.train.early_stopping else "checkpoint.pt"):
        if (run_dir / name).exists():
            return run_dir / name
    raise ConfigError(f"{run_dir} has neither {MODEL_FILE} nor a checkpoint, so its model is gone: re-run it to evaluate it again")


def json_object(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``, or an empty one where it holds none (a damaged file is then no match for anything)."""
    try:
        return read_json_object(path, optional=True) or {}
    except ReadbackError:
        return {}


def conflict(run_dir: Path, config: Any, registry: Any = None) -> str | None:
    """How a run already in ``run_dir`` differs from ``config`` ("finished under another config, first at ..."), or None."""
    recorded = run_dir / "config.toml"
    finished = (run_dir / "results.json").exists()
    if recorded.exists() and (finished or (run_dir / "checkpoint.pt").exists()):
        difference = config_difference(read_toml(recorded), config, registry)
        if difference:
            return f"{'finished' if finished else 'started'} under another config, first at {difference}"
    return None
