"""Every mistake the README promises one line for ends in one line on stderr and exit status 2, never a traceback.

The table runs ``layerdescent.cli.main`` in this process (an escaping exception fails the test just
as a traceback would, at a fraction of a subprocess's cost); the cases where the process itself
matters (a segfault, a device file, an allocation that must fail) run the console script.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import datasets
import pytest
import tomli_w
import torch
import torchmetrics

import layerdescent.registry as registry_module
from layerdescent import LayerOutput, Task, hookimpl
from layerdescent.cli import main
from layerdescent.registry import Registry

TASK = {"name": "lista", "layers": 3, "code_dim": 8, "measure_dim": 6, "sparsity": 2, "train_size": 64, "validation_size": 16, "test_size": 16}
RUN = {
    "task": TASK,
    "train": {"epochs": 1, "batch_size": 32, "lr": 0.01, "progress": False, "threads": 1},
    "solver": {"name": "primal-dual", "dual_lr": 0.5},
    "constraints": [{"kind": "descent", "alpha": 0.05}],
    "eval": {"gammas": [0.0, 0.5]},
}


def cli(*argv: str) -> tuple[int, list[str]]:
    """Exit status and stderr lines of one in-process CLI call."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        status = main([str(a) for a in argv])
    return status, err.getvalue().splitlines()


def assert_one_line(status: int, lines: list[str], *needles: str) -> None:
    assert status == 2, lines
    errors = [line for line in lines if line.startswith("layerdescent: error: ")]
    assert len(errors) == 1 and not any("Traceback" in line for line in lines), lines
    for needle in needles:
        assert needle in errors[0], errors[0]


def config_file(tmp_path: Path, table: dict, name: str = "run.toml") -> Path:
    path = tmp_path / name
    path.write_text(tomli_w.dumps(table))
    return path


def with_(table: dict, dotted: str, value) -> dict:
    table = json.loads(json.dumps(table))
    node, parts = table, dotted.split(".")
    for part in parts[:-1]:
        node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
    node[parts[-1]] = value
    return table


# --- config -------------------------------------------------------------------------------------

CONFIG_CASES = {
    "seed-negative": (with_(RUN, "seed", -1), "seed must be in 0..4294967295"),
    "seed-2**32": (with_(RUN, "seed", 2**32), "seed must be in 0..4294967295"),
    "eval-seed-huge": (with_(RUN, "eval.seed", 9223372036854775807), "eval.seed must be in 0..4294967295"),
    "name-__class__": (with_(RUN, "constraints.0.name", "__class__"), "'__class__' is reserved"),
    "name-state_dict": (with_(RUN, "constraints.0.name", "state_dict"), "'state_dict' is reserved"),
    "name-compute_cmp_state": (with_(RUN, "constraints.0.name", "compute_cmp_state"), "'compute_cmp_state' is reserved"),
    "threads-100000": (with_(RUN, "train.threads", 100000), "train.threads must be at most"),
    "gamma-inf": (with_(RUN, "eval.gammas", [0.0, float("inf")]), "eval.gammas[1] must be a finite number"),
    "label-over-255": (with_(RUN, "label", "x" * 300), "label is 300 bytes long"),
    "label-escapes": (with_(RUN, "label", "/../../../x"), "must be a plain name"),
    "test_size-1": (with_(RUN, "task.test_size", "1"), "task.test_size must be an integer"),
}


@pytest.mark.parametrize("table, message", CONFIG_CASES.values(), ids=CONFIG_CASES.keys())
def test_a_bad_config_value_is_one_line(tmp_path, table, message):
    assert_one_line(*cli("run", config_file(tmp_path, table), "--out", tmp_path / "out"), message)
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_on_a_cpu_build_is_one_line(tmp_path):
    table = with_(RUN, "train.device", "cuda")
    assert_one_line(*cli("run", config_file(tmp_path, table), "--out", tmp_path / "out"), "train.device = 'cuda'")


def _deep(tmp_path: Path) -> Path:
    path = tmp_path / "deep.toml"
    path.write_text("a = " + "[" * 5000 + "]" * 5000 + "\n")
    return path


def _file(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / "file.toml"
    path.write_bytes(data)
    return path


FILE_CASES = {
    "binary": (lambda t: _file(t, bytes(range(256)) * 4), "not UTF-8 text"),
    "latin-1": (lambda t: _file(t, 'label = "caf\xe9"\n'.encode("latin-1")), "not UTF-8 text"),
    "directory": (lambda t: t, "is a directory"),
    "5000-deep": (_deep, "nests tables or arrays too deeply"),
    "huge": (lambda t: _file(t, b"#" * (11 << 20)), "larger than 10 MiB"),
}


@pytest.mark.parametrize("make, message", FILE_CASES.values(), ids=FILE_CASES.keys())
def test_a_config_file_that_is_not_a_config_is_one_line(tmp_path, make, message):
    assert_one_line(*cli("run", make(tmp_path), "--out", tmp_path / "out"), message)


def test_several_config_mistakes_are_all_reported_one_line_each(tmp_path):
    table = with_(with_(RUN, "train.batchsize", 32), "solvr", {"name": "erm"})
    status, lines = cli("run", config_file(tmp_path, table), "--out", tmp_path / "out")
    assert status == 2 and len(lines) == 2, lines
    assert "unknown key solvr; did you mean 'solver'" in lines[0]
    assert "unknown key train.batchsize; did you mean 'batch_size'" in lines[1]


# --- output directory ---------------------------------------------------------------------------


def _a_file(tmp_path: Path) -> Path:
    (tmp_path / "taken").write_text("a file")
    return tmp_path / "taken"


OUT_CASES = {
    "a-file": (_a_file, "is a file, not a directory"),
    "under-a-file": (lambda t: _a_file(t) / "run", "lies under a file"),
    "unwritable": (lambda t: Path("/sys/layerdescent-test-run"), "cannot be created"),
    "name-over-255": (lambda t: t / ("x" * 300), "cannot be created"),
}


@pytest.mark.parametrize("make, message", OUT_CASES.values(), ids=OUT_CASES.keys())
def test_an_output_directory_that_cannot_be_one_is_one_line(tmp_path, make, message):
    assert_one_line(*cli("run", config_file(tmp_path, RUN), "--out", make(tmp_path)), message)


def test_a_full_disk_is_one_line_that_says_the_checkpoint_is_intact(tmp_path, monkeypatch):
    import errno

    import layerdescent.checkpoint as checkpoint

    real, calls = checkpoint.torch.save, {"n": 0}

    def save(obj, handle):
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(obj, handle)

    monkeypatch.setattr(checkpoint.torch, "save", save)
    table = with_(with_(RUN, "train.epochs", 2), "train.keep_checkpoint", True)
    assert_one_line(*cli("run", config_file(tmp_path, table), "--out", tmp_path / "out"), "No space left on device", "the last checkpoint is intact")
    assert checkpoint.load_checkpoint(tmp_path / "out" / "checkpoint.pt", "lista", kind="run")["position"]["epoch"] == 1


# --- checkpoints --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished two-epoch run that kept its checkpoints, and its config file."""
    tmp = tmp_path_factory.mktemp("finished")
    path = config_file(tmp, with_(with_(RUN, "train.epochs", 2), "train.keep_checkpoint", True))
    status, lines = cli("run", path, "--out", tmp / "run")
    assert status == 0, lines
    return path, tmp / "run"


def _edit(key, value):
    def edit(payload):
        if value is KeyError:
            del payload[key]
        else:
            node, parts = payload, key.split(".")
            for part in parts[:-1]:
                node = node[part]
            node[parts[-1]] = value(node[parts[-1]]) if callable(value) else value
        return payload

    return edit


CHECKPOINT_CASES = {
    "another-models-shapes": (_edit("model.w1", lambda w: torch.zeros(2, 3)), "does not fit this model (size mismatch for w1"),
    "missing-key": (_edit("solver", KeyError), "lacks its 'solver' entry"),
    "mistyped-key": (_edit("position", [1, 2]), "has a list as its 'position' entry"),
    "rng-empty": (_edit("rng", []), "holds no RNG state"),
    "negative-metrics-offset": (_edit("metrics_offset", -5), "negative metrics_offset"),
    "huge-metrics-offset": (_edit("metrics_offset", 2**40), "metrics.jsonl held 1099511627776 bytes"),
    "negative-epoch": (_edit("position.epoch", -3), "position epoch = -3"),
    "nan-weights": (_edit("model.w1", lambda w: torch.full_like(w, float("nan"))), "non-finite (NaN or infinite) weights in 'w1'"),
}


@pytest.mark.parametrize("edit, message", CHECKPOINT_CASES.values(), ids=CHECKPOINT_CASES.keys())
def test_a_damaged_or_edited_checkpoint_is_one_line_naming_the_file(tmp_path, finished, edit, message):
    path, source = finished
    run = tmp_path / "run"
    shutil.copytree(source, run)
    (run / "results.json").unlink()
    payload = edit(torch.load(run / "checkpoint.pt", weights_only=False))
    torch.save(payload, run / "checkpoint.pt")
    assert_one_line(*cli("run", path, "--out", run, "--resume"), message)
    assert not (run / "results.json").exists()
    assert (run / "metrics.jsonl").stat().st_size == (source / "metrics.jsonl").stat().st_size  # not grown, not cut


def test_a_missing_log_on_resume_is_one_line(tmp_path, finished):
    path, source = finished
    run = tmp_path / "run"
    shutil.copytree(source, run)
    (run / "results.json").unlink()
    (run / "metrics.jsonl").unlink()
    assert_one_line(*cli("run", path, "--out", run, "--resume"), "metrics.jsonl is missing")


def test_a_damaged_previous_checkpoint_is_not_called_intact(tmp_path, finished):
    path, source = finished
    run = tmp_path / "run"
    shutil.copytree(source, run)
    (run / "results.json").unlink()
    for name in ("checkpoint.pt", "checkpoint.prev.pt"):
        (run / name).write_bytes(b"not a checkpoint")
    status, lines = cli("run", path, "--out", run, "--resume")
    assert_one_line(status, lines, "checkpoint.prev.pt, is damaged too")
    assert "intact" not in lines[-1]


# --- plugins ------------------------------------------------------------------------------------


class Broken(Task):
    """A regression task whose ``mode`` option breaks one part of the contract."""

    name = "broken"
    options = {"mode": "none", "layers": 2}

    def __init__(self, **options):
        super().__init__(**options)
        if self.options["mode"] == "constructor":
            raise ValueError("cannot start")

    @property
    def num_layers(self):
        return "2" if self.options["mode"] == "num_layers-string" else self.options["layers"]

    def build_model(self):
        return torch.nn.ModuleList([torch.nn.Linear(3, 1) for _ in range(3)])

    def build_datasets(self):
        x = torch.randn(32, 3, generator=torch.Generator().manual_seed(0))
        ds = datasets.Dataset.from_dict({"x": x.numpy(), "y": x.sum(1, keepdim=True).numpy()}).with_format("torch")
        if self.options["mode"] == "split-not-a-dataset":
            return {"train": ds, "validation": ds, "test": [1, 2, 3]}
        return {"train": ds, "validation": ds, "test": ds}

    def collate(self, rows):
        return rows

    def layer_losses(self, model, batch, gamma=0.0):
        mode = self.options["mode"]
        losses = torch.stack([(layer(batch["x"]) - batch["y"]).pow(2).squeeze(1) for layer in model], 1)
        if mode == "raises":
            raise KeyError("x_missing")
        if mode == "float":
            return float(losses.mean())
        if mode == "tuple":
            return (losses, None)
        if mode == "one-d":
            return LayerOutput(losses.mean(1))
        if mode == "integer":
            return LayerOutput(losses.round().long())
        if mode == "columns":
            return LayerOutput(losses[:, :2])
        if mode == "metric-shapes":
            return LayerOutput(losses, preds=torch.zeros(len(losses), 5), target=batch["y"])
        return LayerOutput(losses, preds=model[-1](batch["x"]), target=batch["y"])

    def metrics(self):
        return torchmetrics.MetricCollection({"mse": torchmetrics.MeanSquaredError()})


class BrokenPlugin:
    @hookimpl
    def register_tasks(self, register):
        register(Broken)


PLUGIN_CASES = {
    "constructor-raises": ("constructor", "__init__ raised ValueError: cannot start"),
    "num_layers-string": ("num_layers-string", "num_layers is '2', not an integer >= 1"),
    "split-not-a-dataset": ("split-not-a-dataset", "build_datasets returned split 'test' as list"),
    "layer_losses-raises": ("raises", "layer_losses raised KeyError: 'x_missing'"),
    "layer_losses-float": ("float", "layer_losses returned float, not a LayerOutput"),
    "layer_losses-tuple": ("tuple", "layer_losses returned tuple, not a LayerOutput"),
    "layer_losses-1d": ("one-d", "layer_losses raised ValueError: LayerOutput.losses must be B x (L+1)"),
    "layer_losses-integer": ("integer", "layer_losses returned losses of dtype torch.int64"),
    "wrong-column-count": ("columns", "layer_losses returned losses with 2 columns; it needs 3"),
    "metric-shapes": ("metric-shapes", "metrics().update"),
}


@pytest.mark.parametrize("mode, message", PLUGIN_CASES.values(), ids=PLUGIN_CASES.keys())
def test_a_plugin_that_breaks_the_contract_is_one_line_naming_it_and_the_method(tmp_path, monkeypatch, mode, message):
    monkeypatch.setattr(registry_module, "_registry", Registry(extra_plugins=[("broken-plugin", BrokenPlugin())]))
    table = {"task": {"name": "broken", "mode": mode}, "train": {"epochs": 1, "batch_size": 16, "progress": False}, "solver": {"name": "erm"}}
    assert_one_line(*cli("run", config_file(tmp_path, table), "--out", tmp_path / "out"), "task 'broken' (plugin 'broken-plugin')", message)
    assert not (tmp_path / "out" / "results.json").exists()


# --- evaluate -----------------------------------------------------------------------------------

RESULTS_CASES = {
    "corrupt": b'{"schema": 1,, "label": "erm"}',
    "truncated": b'{"schema": 1, "label": ',
    "binary": bytes(range(256)),
    "list-valued": b"[1, 2, 3]",
    "key-missing": b'{"schema": 1}',
}


@pytest.mark.parametrize("data", RESULTS_CASES.values(), ids=RESULTS_CASES.keys())
def test_evaluate_on_a_damaged_results_file_is_one_line(tmp_path, finished, data):
    run = tmp_path / "run"
    shutil.copytree(finished[1], run)
    (run / "results.json").write_bytes(data)
    assert_one_line(*cli("evaluate", run, "--out", tmp_path / "again"), "results.json")


def test_evaluate_into_a_file_is_one_line(tmp_path, finished):
    (tmp_path / "taken").write_text("a file")
    assert_one_line(*cli("evaluate", finished[1], "--out", tmp_path / "taken"), "is a file")


# --- assets -------------------------------------------------------------------------------------


def test_a_cache_that_is_a_file_is_one_line(tmp_path, monkeypatch):
    (tmp_path / "cache").write_text("not a directory")
    monkeypatch.setenv("LAYERDESCENT_CACHE", str(tmp_path / "cache"))
    assert_one_line(*cli("assets", "list"), "LAYERDESCENT_CACHE", "is a file")


def test_a_malformed_debian_header_is_one_error(tmp_path):
    from layerdescent import AssetError
    from layerdescent.assets import extract_from_file

    deb = tmp_path / "bad.deb"
    deb.write_bytes(b"!<arch>\n" + b"debian-binary   " + b"\xff" * 44)
    with pytest.raises(AssetError, match="malformed ar member header"):
        extract_from_file(deb, "x", tmp_path / "out")


# --- through the console script, where the process itself matters -------------------------------


def console(*argv, limit_memory: bool = False, **kwargs) -> subprocess.CompletedProcess:
    command = [shutil.which("layerdescent") or sys.executable, *([] if shutil.which("layerdescent") else ["-m", "layerdescent.cli"])]

    def cap():  # an allocation that must fail fails here without troubling the machine
        resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))

    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.run([*command, *map(str, argv)], capture_output=True, text=True, env=env, preexec_fn=cap if limit_memory else None, timeout=300, **kwargs)


def test_the_console_script_ends_in_one_line_for_a_device_a_huge_model_and_too_many_threads(tmp_path):
    cases = [
        (("run", "/dev/zero", "--out", tmp_path / "a"), {}, "larger than 10 MiB"),
        (("run", config_file(tmp_path, with_(RUN, "task.layers", 100_000_000), "big.toml"), "--out", tmp_path / "b"), {"limit_memory": True}, "too large"),
        (("run", config_file(tmp_path, with_(RUN, "train.threads", 100000), "threads.toml"), "--out", tmp_path / "c"), {}, "train.threads must be at most"),
    ]
    for argv, options, message in cases:
        proc = console(*argv, **options)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
        assert lines[-1].startswith("layerdescent: error: ") and message in lines[-1], lines
