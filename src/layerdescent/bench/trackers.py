"""The built-in trackers, TensorBoard, MLflow and Weights & Biases: listeners on a run's ``metrics.jsonl``, registered like a plugin's.

    [train]
    trackers = ["tensorboard", "mlflow", "wandb"]

A plugin's tracker subclasses :class:`~layerdescent.run.tracking.Tracker` and is
registered by ``register_trackers``. The names and the packages they need are checked when a run
trains (``check_trackers``), not when a config is read, so a recorded run still reports and
evaluates where a tracker is missing. TensorBoard event files go to ``RUN_DIR/tensorboard``. MLflow logs one MLflow run per run, in
``$MLFLOW_TRACKING_URI`` when it is set, else in a local file store: ``OUT/mlruns`` for a bench
(one experiment named after the bench), ``RUN_DIR/mlruns`` for a single run. W&B logs one W&B run
per run, its files in ``RUN_DIR/wandb``: offline by default (``wandb sync`` uploads them later),
online with ``mode = "online"``; a resumed run continues the same W&B run. All three name a value
the same way (``scalars``): ``train/loss/l3``, ``train/lambda/descent/l3_le_l2``, ``val/accuracy``.
This module imports none of their packages until a tracker opens, so a config check stays light.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import secrets
import shutil
import string
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal, Union

from layerdescent.errors import ConfigError
from layerdescent.hookspecs import hookimpl
from layerdescent.optional import require
from layerdescent.options import flat_keys
from layerdescent.readback import read_json
from layerdescent.run.files import refuse_links, write_atomic
from layerdescent.run.tracking import Tracker

# Set by a bench for its workers, so a bench's runs share one store and one experiment without a config key.
BENCH_ENV = "LAYERDESCENT_BENCH"
STORE_ENV = "LAYERDESCENT_MLFLOW_STORE"
RUN_DIR_TAG = "layerdescent.run_dir"
# The W&B tracker's own record in RUN_DIR/wandb: the W&B run's id and the last step it was given.
WANDB_STATE = "layerdescent-run.json"
WANDB_FORBIDDEN = "/\\#?%:"  # characters W&B refuses in a project name; in an entity they would break its URLs


def _test_scalars(results: dict[str, Any]) -> dict[str, float]:
    """The final evaluation's per-layer loss and metrics at every gamma, for comparing finished runs."""
    out: dict[str, float] = {}
    for record in results.get("gammas", []):
        prefix = f"test/gamma_{record['gamma']:g}"
        out.update({f"{prefix}/loss/l{k}": v for k, v in enumerate(record["layer_loss"])})
        out.update({f"{prefix}/{name}": v for name, v in record.get("metrics", {}).items() if isinstance(v, (int, float))})
    return out


@dataclass(frozen=True)
class TensorBoardOptions:
    """The TensorBoard tracker's [train.trackers.tensorboard] keys."""

    folder: str = "tensorboard"
    """The folder of the event files, inside the run directory."""

    def __post_init__(self) -> None:
        if not self.folder or self.folder in (".", "..") or "/" in self.folder or "\\" in self.folder:
            raise ConfigError(f"train.trackers.tensorboard.folder = {self.folder!r} must be one folder name inside the run directory")


@dataclass(frozen=True)
class MLflowOptions:
    """The MLflow tracker's [train.trackers.mlflow] keys."""

    experiment: Union[str, None] = None
    """The MLflow experiment; unset: $MLFLOW_EXPERIMENT_NAME, else the bench file's name, else `layerdescent`."""
    tracking_uri: Union[str, None] = None
    """Where the runs are logged; unset: $MLFLOW_TRACKING_URI, else a local file store (OUT/mlruns for a bench, RUN_DIR/mlruns for a run)."""
    run_name: Union[str, None] = None
    """The MLflow run's name; unset: VARIANT/seed-N."""


@dataclass(frozen=True)
class WandbOptions:
    """The Weights & Biases tracker's [train.trackers.wandb] keys."""

    mode: Union[Literal["offline", "online"], None] = None
    """`offline` writes RUN_DIR/wandb for `wandb sync`; `online` logs as the run trains (needs `wandb login` or $WANDB_API_KEY); unset: $WANDB_MODE, else offline."""
    project: Union[str, None] = None
    """The W&B project; unset: $WANDB_PROJECT, else `layerdescent`. A bench's runs share it, grouped by the bench file's name."""
    entity: Union[str, None] = None
    """The W&B user or team that owns the project; unset: $WANDB_ENTITY, else the login's default."""
    run_name: Union[str, None] = None
    """The W&B run's name; unset: VARIANT/seed-N."""

    def __post_init__(self) -> None:
        for key in ("project", "entity"):
            value = getattr(self, key)
            if value is not None and (not value or len(value) > 128 or any(c in value for c in WANDB_FORBIDDEN)):
                raise ConfigError(
                    f"train.trackers.wandb.{key} = {value!r} must be 1 to 128 characters without any of {' '.join(WANDB_FORBIDDEN)} (W&B refuses them)"
                )


class _TensorBoard(Tracker):
    """TensorBoard event files in RUN_DIR/tensorboard (its `folder`); a resumed run purges what was logged after its checkpoint."""

    name = "tensorboard"
    requires: ClassVar[dict[str, str]] = {"tensorboard": "layerdescent[tensorboard]"}
    Options = TensorBoardOptions

    def __init__(self, config: Any, run_dir: Path, start_step: int) -> None:
        super().__init__(config, run_dir, start_step)
        require("tensorboard", "tensorboard", "train.trackers 'tensorboard'")
        from torch.utils.tensorboard import SummaryWriter

        # metrics.jsonl is cut back to the checkpoint on resume; purge_step hides the same steps here.
        refuse_links(self.run_dir, (), folders=(self.options.folder,))  # the event files stay inside the run directory
        self.writer = SummaryWriter(log_dir=str(self.run_dir / self.options.folder), purge_step=start_step + 1 if start_step else None)

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
    Options = MLflowOptions

    def __init__(self, config: Any, run_dir: Path, start_step: int) -> None:
        super().__init__(config, run_dir, start_step)
        require("mlflow", "mlflow", "train.trackers 'mlflow'")
        from mlflow.tracking import MlflowClient

        options = self.options
        uri = (
            options.tracking_uri
            or os.environ.get("MLFLOW_TRACKING_URI")
            or Path(os.environ.get(STORE_ENV) or run_dir / "mlruns").resolve().as_uri()
        )
        if uri.startswith("file:"):
            # MLflow 3 refuses a file store unless asked; it is the one store that needs no server and no database.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = client = MlflowClient(tracking_uri=uri)
        bench = os.environ.get(BENCH_ENV, "")
        experiment = self._experiment(options.experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME") or bench or "layerdescent")
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
            self.run_id = client.create_run(
                experiment, tags=tags, run_name=options.run_name or f"{config.name}/seed-{config.seed}"
            ).info.run_id
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
        from layerdescent.analysis.report import write_report

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


# W&B's folders (its settings, caches, staged artifacts and service logs), which default to $HOME;
# WANDB_DIR is where a run's own files go.
WANDB_FOLDERS = {
    "WANDB_DIR": "",
    "WANDB_CONFIG_DIR": "config",
    "WANDB_CACHE_DIR": "cache",
    "WANDB_DATA_DIR": "data",
    "WANDB_ARTIFACT_DIR": "artifacts",
}


@contextlib.contextmanager
def _wandb_folders(folder: Path) -> Iterator[None]:
    """Point each of W&B's folders the user did not set at ``folder`` (RUN_DIR/wandb) while a run starts, so W&B writes nothing in $HOME.

    W&B reads them when a run starts (its service, started with the first run, keeps them); they
    are put back after, so that a user's own W&B runs in the same process go where they would have.
    """
    ours = {
        name: str(folder.parent if name == "WANDB_DIR" else folder / sub) for name, sub in WANDB_FOLDERS.items() if name not in os.environ
    }
    os.environ.update(ours)
    try:
        yield
    finally:
        for name in ours:
            os.environ.pop(name, None)


# The W&B runs this process opened and has not finished, by id: a run stopped by an error or an
# interrupt leaves its W&B run open until the process exits, and W&B opens one run per id at a time.
_WANDB_OPEN: dict[str, Any] = {}


class _Wandb(Tracker):
    """One Weights & Biases run per run, its files in RUN_DIR/wandb (offline unless `mode = "online"`); a resumed run continues it."""

    name = "wandb"
    requires: ClassVar[dict[str, str]] = {"wandb": "layerdescent[wandb]"}
    Options = WandbOptions

    def __init__(self, config: Any, run_dir: Path, start_step: int) -> None:
        super().__init__(config, run_dir, start_step)
        wandb = require("wandb", "wandb", "train.trackers 'wandb'")
        options = self.options
        mode = options.mode or os.environ.get("WANDB_MODE") or "offline"
        refuse_links(self.run_dir, (), folders=("wandb",))  # W&B's files stay inside the run directory
        try:
            (self.run_dir / "wandb").mkdir(exist_ok=True)
        except FileExistsError:
            raise ConfigError(
                f"{self.run_dir / 'wandb'} is a file, where the W&B tracker keeps its run: move it away, or --out another directory"
            ) from None
        self.state = self.run_dir / "wandb" / WANDB_STATE
        # A resumed run logs to the W&B run it logged to before; one that starts over (it stopped
        # before its first checkpoint, or trains again) gets a new W&B run.
        previous = self._read_state() if start_step else None
        self.run_id = previous["id"] if previous else "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))
        # W&B cannot delete a logged step and refuses one it holds, so the steps it got before the
        # interrupt stay and are not sent again; a resume retraces them exactly, to the same values.
        self.held = self.step = previous["step"] if previous else -1
        stale = _WANDB_OPEN.pop(self.run_id, None)
        if stale is not None:  # interrupted in this process, which W&B would finish only at exit
            stale.finish(exit_code=1)
        if mode == "offline":
            os.environ.setdefault("WANDB_ERROR_REPORTING", "false")  # else W&B's service sends its diagnostics over the network
        bench = os.environ.get(BENCH_ENV, "")
        with _wandb_folders(self.run_dir / "wandb"):
            try:
                self.run = wandb.init(
                    id=self.run_id,
                    resume="allow" if previous else None,
                    project=options.project or os.environ.get("WANDB_PROJECT") or "layerdescent",
                    entity=options.entity,
                    name=options.run_name or f"{config.name}/seed-{config.seed}",
                    group=bench or None,
                    config=flat_keys(config.as_dict()),
                    dir=str(self.run_dir),
                    mode=mode,
                    reinit="create_new",  # a bench trains its runs one after another in one process
                    settings=wandb.Settings(console="off", silent=True),  # the run's own output and progress bar stay as they are
                )
            except wandb.errors.Error as exc:
                raise ConfigError(
                    f"train.trackers.wandb: W&B could not start the run: {exc} (mode = 'offline' logs to RUN_DIR/wandb for `wandb sync` later)"
                ) from None
        _WANDB_OPEN[self.run_id] = self.run
        self._write_state()

    def _read_state(self) -> Union[dict[str, Any], None]:
        """The W&B run id and last step this run's tracker recorded before it stopped, or None when it recorded none."""
        fix = "remove it to log the rest of the run to a new W&B run"
        state = read_json(self.state, limit=4096, fix=fix, optional=True)
        if state is None:
            return None
        try:
            valid = re.fullmatch(r"[a-z0-9]{1,64}", state["id"]) is not None and isinstance(state["step"], int)
        except (KeyError, TypeError):
            valid = False
        if not valid:
            raise ConfigError(
                f"{self.state} is not the W&B tracker's record of its run: remove it to log the rest of the run to a new W&B run"
            )
        return state

    def _write_state(self) -> None:
        write_atomic(self.state, json.dumps({"id": self.run_id, "step": self.step}) + "\n")

    def log(self, step: int, values: dict[str, float]) -> None:
        if step <= self.held:
            return  # W&B holds this step from before the interrupt
        self.run.log(values, step=step)  # a train and an epoch line of one step make one W&B row
        if step > self.step:
            self.step = step
            self._write_state()  # so that a resume knows which steps W&B holds

    def close(self, results: dict[str, Any], run_dir: Path) -> None:
        if self.run is None:
            return
        tests = _test_scalars(results)
        self.log(results["train"]["steps"], tests)
        self.run.summary.update(tests)  # also where W&B held the last step already: an evaluation resumed after training
        self.run.finish()
        _WANDB_OPEN.pop(self.run_id, None)
        self.run = None


@hookimpl
def register_trackers(register) -> None:
    """The built-in trackers go through the same hook a third-party plugin uses."""
    register(_TensorBoard)
    register(_MLflow)
    register(_Wandb)
