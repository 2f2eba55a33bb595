"""TensorBoard, MLflow and W&B receive what metrics.jsonl holds, read back through their own readers (W&B's: its transaction log)."""

from __future__ import annotations

import importlib.util
import json
import os
import struct
import subprocess
from pathlib import Path
from typing import ClassVar

import pytest
from conftest import LAYERDESCENT
from helpers import cli, config_file, interrupt_at_step

import layerdescent as ld
from layerdescent.bench import trackers
from layerdescent.registry import Registry
from layerdescent.run import tracking
from layerdescent.run.config import config_from_dict
from layerdescent.run.trainer import train


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def expected(run_dir: Path) -> dict[tuple[str, int], float]:
    """Every (name, step) a tracker must hold, with its value in metrics.jsonl."""
    labels = tracking.result_labels(json.loads((run_dir / "results.json").read_text()))
    return {(name, record["step"]): value for record in records(run_dir) for name, value in tracking.scalars(record, labels).items()}


def tracked(tiny: dict, names: list[str]) -> dict:
    tiny["train"]["trackers"] = names
    return tiny


def test_tensorboard_holds_every_logged_value_of_the_run(tiny, tmp_path):
    pytest.importorskip("tensorboard", reason="the tensorboard tracker needs pip install 'layerdescent[tensorboard]'")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = tmp_path / "run"
    results = train(config_from_dict(tracked(tiny, ["tensorboard"])), run_dir)
    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    want = expected(run_dir)
    assert {"train/loss/l0", "train/lambda/descent/l1_le_l0", "train/violation/descent/l4_le_l3", "val/loss/l4", tracking.STEP_TIME} <= set(
        events.Tags()["scalars"]
    )
    got = {(tag, e.step): e.value for tag in events.Tags()["scalars"] for e in events.Scalars(tag)}
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=1e-6, abs=1e-12), key  # TensorBoard stores float32
    assert all(e.value > 0 for e in events.Scalars(tracking.STEP_TIME))
    last = results["train"]["steps"]
    assert got[("test/gamma_0.5/loss/l4", last)] == pytest.approx(results["gammas"][1]["layer_loss"][4], rel=1e-6)


def test_a_resumed_run_shows_in_tensorboard_what_metrics_jsonl_holds(tiny, tmp_path, monkeypatch):
    pytest.importorskip("tensorboard", reason="the tensorboard tracker needs pip install 'layerdescent[tensorboard]'")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = tmp_path / "run"
    tiny["train"].update(log_every=2, checkpoint_every=3)
    config = config_from_dict(tracked(tiny, ["tensorboard"]))
    restore = interrupt_at_step(monkeypatch, 12)  # after the checkpoint at step 9 and the log line at step 10
    with pytest.raises(KeyboardInterrupt):
        train(config, run_dir)
    restore()
    train(config, run_dir, resume=True)
    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    for (tag, step), value in expected(run_dir).items():
        logged = [e.value for e in events.Scalars(tag) if e.step == step]
        assert logged == [pytest.approx(value, rel=1e-6, abs=1e-12)], (tag, step)


def test_mlflow_holds_the_config_the_metrics_and_the_files_of_the_run(tiny, tmp_path, monkeypatch):
    pytest.importorskip("mlflow", reason="the mlflow tracker needs pip install 'layerdescent[mlflow]'")
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    run_dir = tmp_path / "run"
    config = config_from_dict(tracked(tiny, ["mlflow"]))
    train(config, run_dir)
    client = MlflowClient(tracking_uri=(run_dir / "mlruns").as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("layerdescent").experiment_id])
    assert run.info.status == "FINISHED"
    assert (
        run.data.params["train.lr"] == "0.01" and run.data.params["constraints.0.alpha"] == "0.05" and run.data.params["task.layers"] == "4"
    )
    for (name, step), value in expected(run_dir).items():
        assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, name) if m.step == step] == [(step, value)], name
    files = {f.path for f in client.list_artifacts(run.info.run_id)} | {f.path for f in client.list_artifacts(run.info.run_id, "plots")}
    assert {"results.json", "config.toml", "plots/loss_vs_layer.png", "plots/summary.md"} <= files
    local = Path(client.download_artifacts(run.info.run_id, "results.json", str(tmp_path)))
    assert json.loads(local.read_text()) == json.loads((run_dir / "results.json").read_text())
    assert cli("report", str(run_dir))[0] == 0  # the store's copy of results.json is not taken for a second run


def test_a_config_without_trackers_records_no_trackers_key(tiny, tmp_path):
    train(config_from_dict(tiny), tmp_path / "run")
    assert "trackers" not in (tmp_path / "run" / "config.toml").read_text()


def test_an_unknown_tracker_is_one_line_with_the_closest_name(tiny, tmp_path):
    code, lines = cli("run", str(config_file(tmp_path, tracked(tiny, ["tensorbord"]))), "--out", str(tmp_path / "out"))
    assert code == 2 and len(lines) == 1, lines
    assert (
        "train.trackers[0] = 'tensorbord' is not a registered tracker; did you mean 'tensorboard'? (known: mlflow, tensorboard, wandb;"
        in lines[0]
    )
    assert not os.path.exists(tmp_path / "out")


@pytest.mark.parametrize("name", ["tensorboard", "mlflow", "wandb"])
def test_a_missing_tracker_package_names_its_extra(tiny, tmp_path, monkeypatch, name):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda module, *a: None if module == name else real(module, *a))
    code, lines = cli("run", str(config_file(tmp_path, tracked(tiny, [name]))), "--out", str(tmp_path / "out"))
    assert (code, lines) == (
        2,
        [f"layerdescent: error: train.trackers: {name!r} needs the {name} package: pip install 'layerdescent[{name}]'"],
    )
    assert not os.path.exists(tmp_path / "out")


def test_a_recorded_run_naming_a_tracker_whose_package_is_missing_still_reports_and_evaluates(tiny, tmp_path, monkeypatch):
    pytest.importorskip("tensorboard", reason="recording the run needs pip install 'layerdescent[tensorboard]'")
    tiny["train"]["epochs"] = 1
    run_dir = tmp_path / "run"
    train(config_from_dict(tracked(tiny, ["tensorboard"])), run_dir)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda module, *a: None if module == "tensorboard" else real(module, *a))
    assert cli("report", str(run_dir))[0] == 0
    assert cli("evaluate", str(run_dir), "--out", str(tmp_path / "again"))[0] == 0
    assert (tmp_path / "again" / "results.json").exists()
    assert cli("run", str(run_dir / "config.toml"), "--out", str(tmp_path / "new"))[0] == 2  # training it again still needs the package


def test_a_bench_groups_its_runs_in_one_mlflow_experiment_named_after_it(tiny, tmp_path, monkeypatch):
    pytest.importorskip("mlflow", reason="the mlflow tracker needs pip install 'layerdescent[mlflow]'")
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    tiny["train"]["epochs"] = 1
    bench = {**tracked(tiny, ["mlflow"]), "bench": {"seeds": [0, 1], "variants": {"erm": {"solver": {"name": "erm"}}}}}
    out = tmp_path / "out"
    assert cli("bench", str(config_file(tmp_path, bench, "sweep.toml")), "--out", str(out))[0] == 0
    client = MlflowClient(tracking_uri=(out / "mlruns").as_uri())
    runs = client.search_runs([client.get_experiment_by_name("sweep").experiment_id])
    assert sorted((r.data.tags["variant"], r.data.tags["seed"], r.data.tags["bench"]) for r in runs) == [
        ("erm", "0", "sweep"),
        ("erm", "1", "sweep"),
    ]
    assert "2 runs of 1 variant" in (out / "summary.md").read_text()  # not 4: the store's copies of results.json are no runs
    assert "mlruns" not in os.environ.get(trackers.STORE_ENV, "")  # the bench's settings end with it


class Memory(ld.Tracker):
    """Keeps what it is given, for the test to read."""

    name = "memory"
    opened: ClassVar[list[Memory]] = []

    def __init__(self, config, run_dir, start_step):
        super().__init__(config, run_dir, start_step)
        self.values, self.results = {}, None
        Memory.opened.append(self)

    def log(self, step, values):
        self.values.update({(name, step): value for name, value in values.items()})

    def close(self, results, run_dir):
        self.results = results


class Needy(Memory):
    """A tracker whose package is not installed."""

    name = "needy"
    requires: ClassVar[dict[str, str]] = {"no_such_tracker_package": "needy-tracker[client]"}


class MemoryPlugin:
    @ld.hookimpl
    def register_trackers(self, register):
        register(Memory)
        register(Needy)


def test_a_plugin_tracker_is_chosen_by_name_and_gets_every_logged_value_and_the_results(tiny, tmp_path):
    registry = Registry(extra_plugins=[("memory", MemoryPlugin())])
    Memory.opened.clear()
    run_dir = tmp_path / "run"
    results = train(config_from_dict(tracked(tiny, ["memory"]), registry), run_dir, registry=registry)
    (tracker,) = Memory.opened
    assert tracker.run_dir == run_dir and tracker.start_step == 0
    assert {key: value for key, value in tracker.values.items() if key[0] != tracking.STEP_TIME} == expected(run_dir)
    assert tracker.results == results


def test_a_plugin_tracker_whose_package_is_missing_is_one_line_naming_its_requirement(tiny, tmp_path):
    registry = Registry(extra_plugins=[("memory", MemoryPlugin())])
    with pytest.raises(
        ld.ConfigError, match=r"^train.trackers: 'needy' needs the no_such_tracker_package package: pip install 'needy-tracker\[client\]'$"
    ):
        train(config_from_dict(tracked(tiny, ["needy"]), registry), tmp_path / "run", registry=registry)
    assert not os.path.exists(tmp_path / "run")


def test_a_tracker_takes_its_options_from_its_table_under_train_trackers_and_the_run_records_them(tiny, tmp_path):
    registry = Registry(extra_plugins=[("memory", MemoryPlugin())])
    tiny["train"]["trackers"] = {"tensorboard": {"folder": "events"}, "memory": {}}
    config = config_from_dict(tiny, registry)
    assert config.train.tracker_tables == {"tensorboard": {"folder": "events"}, "memory": {}}
    options = tracking.tracker_options(trackers._TensorBoard, config.train.tracker_tables["tensorboard"])
    assert options == trackers.TensorBoardOptions(folder="events")
    assert config_from_dict(config.as_dict(), registry) == config  # the table form is what config.toml records


@pytest.mark.parametrize(
    "table, message",
    [
        ({"tensorboard": {"foldr": "x"}}, "unknown key train.trackers.tensorboard.foldr; did you mean 'folder'? (allowed: folder)"),
        (
            {"tensorboard": {"folder": "../up"}},
            "train.trackers.tensorboard.folder = '../up' must be one folder name inside the run directory",
        ),
        ({"mlflow": {"experiment": 3}}, "train.trackers.mlflow.experiment must be a string, got 3"),
        ({"mlflow": "on"}, "train.trackers.mlflow must be a table of that tracker's options (an empty one takes its defaults), got 'on'"),
        ({"wandb": {"mode": "onlin"}}, "train.trackers.wandb.mode must be 'offline' or 'online', got 'onlin'"),
        (
            {"wandb": {"project": "runs/lista"}},
            "train.trackers.wandb.project = 'runs/lista' must be 1 to 128 characters without any of / \\ # ? % : (W&B refuses them)",
        ),
        ({"tensorbord": {}}, "train.trackers.tensorbord is not a registered tracker; did you mean 'tensorboard'?"),
    ],
)
def test_a_wrong_tracker_option_is_one_line_before_anything_trains(tiny, tmp_path, table, message):
    tiny["train"]["trackers"] = table
    code, lines = cli("run", str(config_file(tmp_path, tiny)), "--out", str(tmp_path / "out"))
    assert code == 2 and len(lines) == 1 and message in lines[0], lines
    assert not os.path.exists(tmp_path / "out")


def test_tensorboard_writes_its_event_files_in_the_folder_its_options_name(tiny, tmp_path):
    pytest.importorskip("tensorboard", reason="the tensorboard tracker needs pip install 'layerdescent[tensorboard]'")
    tiny["train"]["trackers"] = {"tensorboard": {"folder": "events"}}
    train(config_from_dict(tiny), tmp_path / "run")
    assert list((tmp_path / "run" / "events").glob("events.out.tfevents.*")) and not (tmp_path / "run" / "tensorboard").exists()


def test_mlflow_logs_into_the_experiment_store_and_run_name_its_options_name(tiny, tmp_path, monkeypatch):
    pytest.importorskip("mlflow", reason="the mlflow tracker needs pip install 'layerdescent[mlflow]'")
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    store = (tmp_path / "store").as_uri()
    tiny["train"]["trackers"] = {"mlflow": {"experiment": "lista-sweep", "tracking_uri": store, "run_name": "first try"}}
    train(config_from_dict(tiny), tmp_path / "run")
    client = MlflowClient(tracking_uri=store)
    (run,) = client.search_runs([client.get_experiment_by_name("lista-sweep").experiment_id])
    assert run.info.run_name == "first try" and run.info.status == "FINISHED"
    assert not (tmp_path / "run" / "mlruns").exists()


def test_a_run_resumes_with_other_tracker_options_which_change_how_it_is_watched_not_what_it_computes(tiny):
    from layerdescent.run.rundir import config_difference

    recorded = config_from_dict(tiny).as_dict()
    tiny["train"]["trackers"] = {"tensorboard": {"folder": "events"}}
    assert config_difference(recorded, config_from_dict(tiny)) is None
    tiny["train"]["lr"] = 0.5
    assert config_difference(recorded, config_from_dict(tiny)).startswith("train.lr (recorded 0.01, asked 0.5)")


# --- Weights & Biases --------------------------------------------------------------------------


def offline_wandb(monkeypatch, tmp_path: Path) -> None:
    """W&B with no login and no network: its settings and caches under ``tmp_path``, no mode set but the tracker's default."""
    pytest.importorskip("wandb", reason="the wandb tracker needs pip install 'layerdescent[wandb]'")
    for name in (
        "WANDB_MODE",
        "WANDB_PROJECT",
        "WANDB_ENTITY",
        "WANDB_API_KEY",
        "WANDB_DIR",
        "WANDB_RUN_ID",
        "WANDB_RESUME",
        "WANDB_BASE_URL",
    ):
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / "wandb-home"
    for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(name, str(home / name.lower()))
    monkeypatch.setenv("NETRC", str(home / "netrc"))  # no credentials: a run that tried to go online would fail at once
    monkeypatch.setenv("WANDB_ERROR_REPORTING", "false")
    monkeypatch.setenv("WANDB_DISABLE_GIT", "true")


def wandb_sessions(run_dir: Path) -> list[list]:
    """The records of each W&B session (an offline-run-* folder) in the run directory, oldest first.

    W&B writes them as a LevelDB log of protobuf records; the wandb package has no reader of its
    own, so this is the format's reader: a 7-byte file header, then 32 KiB blocks of chunks, each
    with a 7-byte header (checksum, length, type: 1 full, 2 first, 3 middle, 4 last).
    """
    import wandb
    from wandb.proto import wandb_internal_pb2

    wandb.teardown()  # W&B's service writes a finished run's log after finish() returns: wait for it
    sessions = []
    for path in sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb")):
        data, records, pending, at = path.read_bytes(), [], b"", 7
        assert data[:4] == b":W&B", path
        while at + 7 <= len(data):
            if 32768 - at % 32768 < 7:  # a block's tail too short for a header is padding
                at += 32768 - at % 32768
                continue
            _, length, kind = struct.unpack("<IHB", data[at : at + 7])
            if kind == 0:
                break
            pending += data[at + 7 : at + 7 + length]
            at += 7 + length
            if kind in (1, 4):
                record = wandb_internal_pb2.Record()
                record.ParseFromString(pending)
                records.append(record)
                pending = b""
        sessions.append(records)
    return sorted(sessions, key=lambda records: wandb_run(records).start_time.ToNanoseconds())  # folder names tie within a second


def wandb_rows(records: list) -> dict[tuple[str, int], float]:
    """Every logged (name, step) of one session's history and its value, W&B's own keys (_step, _runtime) left out."""
    rows = {}
    for record in records:
        if record.WhichOneof("record_type") == "history":
            items = {item.key or ".".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            rows.update({(name, items["_step"]): value for name, value in items.items() if not name.startswith("_")})
    return rows


def wandb_run(records: list):
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    return run


def test_wandb_writes_an_offline_run_in_the_run_directory_holding_every_logged_value(tiny, tmp_path, monkeypatch):
    offline_wandb(monkeypatch, tmp_path)
    run_dir = tmp_path / "run"
    results = train(config_from_dict(tracked(tiny, ["wandb"])), run_dir)
    (records,) = wandb_sessions(run_dir)  # offline by default: nothing left the machine
    run = wandb_run(records)
    state = json.loads((run_dir / "wandb" / trackers.WANDB_STATE).read_text())
    assert (run.run_id, run.project, run.display_name) == (state["id"], "layerdescent", "primal-dual/seed-0")
    config = {item.key: json.loads(item.value_json) for item in run.config.update}
    assert config["train.lr"] == 0.01 and config["constraints.0.alpha"] == 0.05 and config["task.layers"] == tiny["task"]["layers"]
    rows, last = wandb_rows(records), results["train"]["steps"]
    assert {key: rows[key] for key in expected(run_dir)} == expected(run_dir)
    assert all(value > 0 for (name, _), value in rows.items() if name == tracking.STEP_TIME)
    assert rows[("test/gamma_0.5/loss/l4", last)] == results["gammas"][1]["layer_loss"][4]
    summary = {
        item.key or ".".join(item.nested_key): json.loads(item.value_json)
        for r in records
        if r.WhichOneof("record_type") == "summary"
        for item in r.summary.update
    }
    assert summary["test/gamma_0.5/loss/l4"] == results["gammas"][1]["layer_loss"][4]
    assert any(r.WhichOneof("record_type") == "exit" for r in records) and state["step"] == last

    tracker = trackers._Wandb(config_from_dict(tiny), run_dir, last)  # a finished run evaluated again: the same W&B run
    tracker.close(results, run_dir)
    tracker.close(results, run_dir)  # a second close does nothing
    assert {wandb_run(r).run_id for r in wandb_sessions(run_dir)} == {state["id"]}


def test_a_resumed_run_logs_to_the_same_wandb_run_and_sends_no_step_twice(tiny, tmp_path, monkeypatch):
    offline_wandb(monkeypatch, tmp_path)
    run_dir = tmp_path / "run"
    tiny["train"].update(log_every=2, checkpoint_every=3)
    config = config_from_dict(tracked(tiny, ["wandb"]))
    restore = interrupt_at_step(monkeypatch, 12)  # after the checkpoint at step 9 and the log line at step 11
    with pytest.raises(KeyboardInterrupt):
        train(config, run_dir)
    restore()
    train(config, run_dir, resume=True)  # in this process, whose W&B run of the interrupted part is still open
    first, second = wandb_sessions(run_dir)
    assert wandb_run(first).run_id == wandb_run(second).run_id == json.loads((run_dir / "wandb" / trackers.WANDB_STATE).read_text())["id"]
    before, after = wandb_rows(first), wandb_rows(second)
    # resumed from the checkpoint of step 9, the run logged step 11 again, which W&B held already
    assert max(step for _, step in before) == 11 and min(step for _, step in after) == 12
    # and retraced it to the values W&B kept: together, the log of a run that never stopped
    assert {key: {**before, **after}[key] for key in expected(run_dir)} == expected(run_dir)


def test_wandb_online_without_a_login_is_one_line_naming_the_offline_mode(tiny, tmp_path, monkeypatch):
    offline_wandb(monkeypatch, tmp_path)
    tiny["train"]["trackers"] = {"wandb": {"mode": "online", "project": "lista"}}
    code, lines = cli("run", str(config_file(tmp_path, tiny)), "--out", str(tmp_path / "out"))
    assert code == 2 and len(lines) == 1, lines
    assert (
        lines[0].startswith("layerdescent: error: train.trackers.wandb: W&B could not start the run: ") and "mode = 'offline'" in lines[0]
    )


def test_wandb_writes_nothing_in_home_only_in_the_run_directory(tiny, tmp_path):
    pytest.importorskip("wandb", reason="the wandb tracker needs pip install 'layerdescent[wandb]'")
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "XDG_"))}
    env.update(HOME=str(home), WANDB_MODE="offline", NETRC=str(home / "netrc"), WANDB_DISABLE_GIT="true", OMP_NUM_THREADS="1")
    env["MPLCONFIGDIR"] = str(tmp_path / "mpl")  # matplotlib's font cache is not W&B's to confine
    config = config_file(tmp_path, tracked(tiny, ["wandb"]))
    done = subprocess.run(
        [*LAYERDESCENT, "run", str(config), "--out", str(tmp_path / "run")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    assert sorted(str(p.relative_to(home)) for p in home.rglob("*")) == []
    assert list((tmp_path / "run" / "wandb").glob("offline-run-*/run-*.wandb"))


def test_a_file_where_wandb_keeps_its_run_is_one_line(tiny, tmp_path, monkeypatch):
    offline_wandb(monkeypatch, tmp_path)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "wandb").write_text("my notes\n")
    code, lines = cli("run", str(config_file(tmp_path, tracked(tiny, ["wandb"]))), "--out", str(tmp_path / "out"))
    assert code == 2 and len(lines) == 1 and "out/wandb is a file, where the W&B tracker keeps its run" in lines[0], lines
    assert (tmp_path / "out" / "wandb").read_text() == "my notes\n"
