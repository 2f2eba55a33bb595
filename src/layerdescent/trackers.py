"""Trackers: listeners on the lines a run writes to ``metrics.jsonl``, each registered by a plugin.

    [train]
    trackers = ["tensorboard", "mlflow"]

    trackers = open_trackers(config, run_dir, start_step, registry)   # in the trainer, once the log is open
    trackers.log(record)                                               # every record written to metrics.jsonl
    trackers.close(results, run_dir)                                   # once results.json is written

TensorBoard and MLflow are built in; a plugin's tracker subclasses :class:`Tracker` and is
registered by ``register_trackers``. The names and the packages they need are checked when a run
trains (``check_trackers``), not when a config is read, so a recorded run still reports and
evaluates where a tracker is missing. TensorBoard event files go to ``RUN_DIR/tensorboard``. MLflow logs one MLflow run per run, in
``$MLFLOW_TRACKING_URI`` when it is set, else in a local file store: ``OUT/mlruns`` for a bench
(one experiment named after the bench), ``RUN_DIR/mlruns`` for a single run. Both name a value
the same way (``scalars``): ``train/loss/l3``, ``train/lambda/descent/2``, ``val/accuracy``.
This module imports neither package until a tracker opens, so a config check stays light.
"""

from __future__ import annotations

import abc
import atexit
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, ClassVar

from layerdescent.errors import ConfigError
from layerdescent.hookspecs import hookimpl
from layerdescent.optional import check_installed, require
from layerdescent.rundir import flat_keys

# Set by a bench for its workers, so a bench's runs share one store and one experiment without a config key.
BENCH_ENV = "LAYERDESCENT_BENCH"
STORE_ENV = "LAYERDESCENT_MLFLOW_STORE"
STEP_TIME = "time/seconds_per_step"
RUN_DIR_TAG = "layerdescent.run_dir"


class Tracker(abc.ABC):
    """A listener on a run's metrics log: subclass it, register it with ``register_trackers``, name it in ``train.trackers``.

    Only rank 0 opens trackers. ``log`` gets every line the run writes to ``metrics.jsonl`` as named
    values (``scalars``), ``close`` the run's results once ``results.json`` is written.
    """

    name: ClassVar[str] = ""  # what train.trackers names
    requires: ClassVar[dict[str, str]] = {}  # module -> the pip requirement that installs it; checked before a run trains

    def __init__(self, config: Any, run_dir: Path, start_step: int) -> None:
        """Open for one run, once its metrics log is open; ``start_step`` is the checkpoint's step when it resumes (else 0)."""
        self.config, self.run_dir, self.start_step = config, run_dir, start_step

    @abc.abstractmethod
    def log(self, step: int, values: dict[str, float]) -> None:
        """Record the named values of one metrics.jsonl line, logged at optimizer step ``step``."""

    def close(self, results: dict[str, Any], run_dir: Path) -> None:
        """Take the finished run's results (results.json's content) and release what the tracker holds."""


def check_trackers(names: Iterable[str], registry: Any = None) -> None:
    """Raise one ConfigError for a tracker no plugin registers or whose package is missing (before a run trains)."""
    from layerdescent.registry import closest, get_registry

    table = (registry or get_registry()).trackers
    for i, name in enumerate(names):
        cls = table.get(name)
        if cls is None:
            raise ConfigError(
                f"train.trackers[{i}] = {name!r} is not a registered tracker{closest(name, table)} (known: {', '.join(sorted(table))}; see `layerdescent list`)"
            )
        check_installed(cls.requires, f"train.trackers: {name!r}")


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """The named values a tracker logs for one ``metrics.jsonl`` record (none for a skipped step)."""
    out: dict[str, float] = {}
    if record.get("event") == "train":
        out.update({f"train/loss/l{k}": v for k, v in enumerate(record["loss"])})
        out["train/feasible"] = record["feasible"]
        for part in ("violation", "lambda", "relaxation"):
            for name, values in record.get(part, {}).items():
                out.update({f"train/{part}/{name}/{i}": v for i, v in enumerate(values)})
    elif record.get("event") == "epoch":
        out.update({f"val/loss/l{k}": v for k, v in enumerate(record["val_loss"])})
        out.update({f"val/{name}": v for name, v in (record.get("val_metrics") or {}).items()})
    return {key: float(value) for key, value in out.items() if isinstance(value, (int, float)) and not isinstance(value, bool)}


def _test_scalars(results: dict[str, Any]) -> dict[str, float]:
    """The final evaluation's per-layer loss and metrics at every gamma, for comparing finished runs."""
    out: dict[str, float] = {}
    for record in results.get("gammas", []):
        prefix = f"test/gamma_{record['gamma']:g}"
        out.update({f"{prefix}/loss/l{k}": v for k, v in enumerate(record["layer_loss"])})
        out.update({f"{prefix}/{name}": v for name, v in record.get("metrics", {}).items() if isinstance(v, (int, float))})
    return out


class _TensorBoard(Tracker):
    """TensorBoard event files in RUN_DIR/tensorboard; a resumed run purges what was logged after its checkpoint."""

    name = "tensorboard"
    requires: ClassVar[dict[str, str]] = {"tensorboard": "layerdescent[tensorboard]"}

    def __init__(self, config: Any, run_dir: Path, start_step: int) -> None:
        super().__init__(config, run_dir, start_step)
        require("tensorboard", "tensorboard", "train.trackers 'tensorboard'")
        from torch.utils.tensorboard import SummaryWriter

        # metrics.jsonl is cut back to the checkpoint on resume; purge_step hides the same steps here.
        self.writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"), purge_step=start_step + 1 if start_step else None)

    def log(self, step: int, values: dict[str, float]) -> None:
        for key, value in values.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()  # a killed run keeps every line it logged, as metrics.jsonl does

    def close(self, results: dict[str, Any], run_dir: Path) -> None:
        step = results["train"]["steps"]
        for key, value in _test_scalars(results).items():
            self.writer.add_scalar(key, value, step)
        self.writer.close()


class _MLflow(Tracker):
    """One MLflow run per run, in a local file store or at $MLFLOW_TRACKING_URI; a resumed run continues it."""

    name = "mlflow"
    requires: ClassVar[dict[str, str]] = {"mlflow": "layerdescent[mlflow]"}

    def __init__(self, config: Any, run_dir: Path, start_step: int) -> None:
        super().__init__(config, run_dir, start_step)
        require("mlflow", "mlflow", "train.trackers 'mlflow'")
        from mlflow.tracking import MlflowClient

        uri = os.environ.get("MLFLOW_TRACKING_URI") or Path(os.environ.get(STORE_ENV) or run_dir / "mlruns").resolve().as_uri()
        if uri.startswith("file:"):
            # MLflow 3 refuses a file store unless asked; it is the one store that needs no server and no database.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = client = MlflowClient(tracking_uri=uri)
        bench = os.environ.get(BENCH_ENV, "")
        experiment = self._experiment(os.environ.get("MLFLOW_EXPERIMENT_NAME") or bench or "layerdescent")
        key = str(run_dir.resolve())
        found = [r for r in self._runs(experiment, key) if r.data.tags.get(RUN_DIR_TAG) == key]
        if found:
            self.run_id = found[0].info.run_id
            client.update_run(self.run_id, status="RUNNING")
        else:
            tags = {
                RUN_DIR_TAG: key,
                "variant": config.name,
                "seed": str(config.seed),
                "task": config.task.name,
                "solver": config.solver.name,
            }
            if bench:
                tags["bench"] = bench
            self.run_id = client.create_run(experiment, tags=tags, run_name=f"{config.name}/seed-{config.seed}").info.run_id
            self._params(config)
        self._closed = False
        atexit.register(self._fail)

    def _experiment(self, name: str) -> str:
        from mlflow.exceptions import MlflowException

        found = self.client.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        try:
            return self.client.create_experiment(name)
        except MlflowException:  # another run of the bench created it first
            return self.client.get_experiment_by_name(name).experiment_id

    def _runs(self, experiment: str, key: str) -> list[Any]:
        if "'" in key:  # a quote cannot be escaped in a filter: compare every run's tag instead
            return self.client.search_runs([experiment], max_results=50_000)
        return self.client.search_runs([experiment], filter_string=f"tags.`{RUN_DIR_TAG}` = '{key}'")

    def _params(self, config: Any) -> None:
        from mlflow.entities import Param

        flat = flat_keys(config.as_dict())
        params = [Param(key, str(value)[:6000]) for key, value in flat.items()]
        for start in range(0, len(params), 100):  # MLflow takes at most 100 params a call
            self.client.log_batch(self.run_id, params=params[start : start + 100])

    def log(self, step: int, values: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(_mlflow_key(key), value, now, step) for key, value in values.items()]
        for start in range(0, len(metrics), 1000):
            self.client.log_batch(self.run_id, metrics=metrics[start : start + 1000])

    def close(self, results: dict[str, Any], run_dir: Path) -> None:
        from layerdescent.report import write_report

        self.log(results["train"]["steps"], _test_scalars(results))
        self.client.log_artifact(self.run_id, str(run_dir / "results.json"))
        self.client.log_artifact(self.run_id, str(run_dir / "config.toml"))
        with tempfile.TemporaryDirectory() as tmp:
            # The run alone, copied out, so its own summary never reads a results.json the store holds.
            source = Path(tmp) / "run"
            source.mkdir()
            for name in ("results.json", "config.toml"):
                shutil.copy(run_dir / name, source / name)
            write_report(source, Path(tmp) / "plots", title=f"Run {results['label']} seed {results['seed']}")
            self.client.log_artifacts(self.run_id, str(Path(tmp) / "plots"), "plots")
        self.client.set_terminated(self.run_id, "FINISHED")
        self._closed = True
        atexit.unregister(self._fail)

    def _fail(self) -> None:
        if not self._closed:
            self.client.set_terminated(self.run_id, "FAILED")


def _mlflow_key(key: str) -> str:
    """``key`` in the characters MLflow allows in a metric name (a constraint's name may hold others)."""
    return re.sub(r"[^\w\-. :/]", "_", key)


class Trackers:
    """The trackers of one run: each gets every record the run logs, and its results at the end."""

    def __init__(self, trackers: list[Tracker], start_step: int = 0) -> None:
        self.trackers = trackers
        # step time as wall time between training log lines, so validation never counts as training
        self._since, self._since_step = time.perf_counter(), start_step

    def log(self, record: dict[str, Any]) -> None:
        """Send one metrics.jsonl record to every tracker."""
        if not self.trackers:
            return
        values, step, now = scalars(record), int(record.get("step", 0)), time.perf_counter()
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


def open_trackers(config: Any, run_dir: str | Path, start_step: int = 0, registry: Any = None) -> Trackers:
    """The trackers ``config.train.trackers`` names, from ``registry``, logging from ``start_step`` (only rank 0 logs)."""
    if int(os.environ.get("RANK", "0")) != 0:
        return Trackers([])
    from layerdescent.registry import get_registry

    registry = registry or get_registry()
    return Trackers([registry.tracker(name)(config, Path(run_dir), start_step) for name in config.train.trackers], start_step)


@hookimpl
def register_trackers(register) -> None:
    """The built-in trackers go through the same hook a third-party plugin uses."""
    register(_TensorBoard)
    register(_MLflow)
