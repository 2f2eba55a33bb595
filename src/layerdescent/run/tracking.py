"""Trackers: listeners on the lines a run writes to ``metrics.jsonl``; the contract and the fan-out the trainer calls.

    trackers = open_trackers(config, run_dir, start_step, registry)   # in the trainer, once the log is open
    trackers.log(record)                                               # every record written to metrics.jsonl
    trackers.close(results, run_dir)                                   # once results.json is written

The built-in trackers (TensorBoard, MLflow, Weights & Biases) live in :mod:`layerdescent.bench.trackers` and reach
the trainer only through the registry, as a plugin's do.
"""

from __future__ import annotations

import abc
import os
import time
from pathlib import Path
from typing import Any, ClassVar

from layerdescent.errors import ConfigError, closest
from layerdescent.metric_names import line_scalars
from layerdescent.optional import check_installed
from layerdescent.options import NoOptions, build_dataclass
from layerdescent.registry import get_registry

STEP_TIME = "time/seconds_per_step"


class Tracker(abc.ABC):
    """A listener on a run's metrics log: subclass it, register it with ``register_trackers``, name it in ``train.trackers``.

    Only rank 0 opens trackers. ``log`` gets every line the run writes to ``metrics.jsonl`` as named
    values (``scalars``), ``close`` the run's results once ``results.json`` is written.
    """

    name: ClassVar[str] = ""  # what train.trackers names
    requires: ClassVar[dict[str, str]] = {}  # module -> the pip requirement that installs it; checked before a run trains
    Options: ClassVar[type] = NoOptions  # its keys under [train.trackers.NAME]

    def __init__(self, config: Any, run_dir: Path, start_step: int) -> None:
        """Open for one run, once its metrics log is open; ``start_step`` is the checkpoint's step when it resumes (else 0).

        ``self.options`` holds its ``[train.trackers.NAME]`` table as ``Options``. On resume the run's
        ``metrics.jsonl`` is cut back to the checkpoint and ``log`` is called again from ``start_step + 1``:
        a tracker that keeps records of its own drops those past ``start_step`` here, so that an
        interrupted run ends with the records of one that never stopped.
        """
        self.config, self.run_dir, self.start_step = config, Path(run_dir), start_step
        self.options = tracker_options(type(self), config.train.tracker_tables.get(self.name, {}))

    @abc.abstractmethod
    def log(self, step: int, values: dict[str, float]) -> None:
        """Record the named values of one metrics.jsonl line, logged at optimizer step ``step``."""

    def close(self, results: dict[str, Any], run_dir: Path) -> None:
        """Take the finished run's results (results.json's content) and release what the tracker holds."""


def tracker_options(cls: type[Tracker], table: dict[str, Any]) -> Any:
    """``cls.Options`` from its ``[train.trackers.NAME]`` table, or one ConfigError line per mistake."""
    return build_dataclass(cls.Options, table, f"train.trackers.{cls.name}")


def check_trackers(train: Any, registry: Any = None) -> None:
    """Raise one ConfigError for a tracker of ``train`` (a TrainConfig) no plugin registers, whose package is missing, or whose options are wrong."""
    table = (registry or get_registry()).trackers
    listed = not isinstance(train.trackers, dict)  # a list names each tracker by position, a table by name
    for i, (name, options) in enumerate(train.tracker_tables.items()):
        key = f"train.trackers[{i}] = {name!r}" if listed else f"train.trackers.{name}"
        cls = table.get(name)
        if cls is None:
            raise ConfigError(
                f"{key} is not a registered tracker{closest(name, table)} (known: {', '.join(sorted(table))}; see `layerdescent list`)"
            )
        tracker_options(cls, options)
        check_installed(cls.requires, f"train.trackers: {name!r}")


def scalars(record: dict[str, Any], labels: dict[str, list[str]]) -> dict[str, float]:
    """The named values a tracker logs for one ``metrics.jsonl`` record, in the vocabulary every front shares (``line_scalars``).

    ``labels`` is each constraint's entry labels (the update's, or results.json's ``constraints.NAME.labels``).
    """
    if record.get("event") == "train":
        return line_scalars(record, labels)
    out: dict[str, Any] = {}
    if record.get("event") == "epoch":
        out.update({f"val/loss/l{k}": v for k, v in enumerate(record["val_loss"])})
        out.update({f"val/{name}": v for name, v in (record.get("val_metrics") or {}).items()})
    return {key: float(value) for key, value in out.items() if isinstance(value, (int, float)) and not isinstance(value, bool)}


def result_labels(results: dict[str, Any]) -> dict[str, list[str]]:
    """Each constraint's entry labels, as a finished run's results.json records them."""
    return {name: table["labels"] for name, table in results.get("constraints", {}).items()}


class Trackers:
    """The trackers of one run: each gets every record the run logs, and its results at the end."""

    def __init__(self, trackers: list[Tracker], start_step: int = 0, labels: dict[str, list[str]] | None = None) -> None:
        self.trackers = trackers
        self.labels = labels or {}  # each constraint's entry labels, which name its values
        # step time as wall time between training log lines, so validation never counts as training
        self._since, self._since_step = time.perf_counter(), start_step

    def log(self, record: dict[str, Any]) -> None:
        """Send one metrics.jsonl record to every tracker."""
        if not self.trackers:
            return
        values, step, now = scalars(record, self.labels), int(record.get("step", 0)), time.perf_counter()
        if record.get("event") == "train" and step > self._since_step:
            values[STEP_TIME] = (now - self._since) / (step - self._since_step)
        if record.get("event") in ("train", "epoch"):
            self._since, self._since_step = now, step
        if values:
            for tracker in self.trackers:
                tracker.log(step, values)

    def close(self, results: dict[str, Any], run_dir: str | Path) -> None:
        """Hand every tracker the final results (and, for MLflow, the run's files), then close it."""
        for tracker in self.trackers:
            tracker.close(results, Path(run_dir))


def open_trackers(
    config: Any, run_dir: str | Path, start_step: int = 0, registry: Any = None, labels: dict[str, list[str]] | None = None
) -> Trackers:
    """The trackers ``config.train.trackers`` names, from ``registry``, logging from ``start_step`` (only rank 0 logs); ``labels`` names each constraint's values."""
    if int(os.environ.get("RANK", "0")) != 0:
        return Trackers([])
    registry = registry or get_registry()
    trackers = [registry.tracker(name)(config, Path(run_dir), start_step) for name in config.train.trackers]
    return Trackers(trackers, start_step, labels)
