"""Every mistake the README promises one line for ends in one line on stderr and exit status 2, never a traceback.

The table runs ``layerdescent.cli.main`` in this process (an escaping exception fails the test just
as a traceback would, at a fraction of a subprocess's cost); the cases where the process itself
matters (a segfault, a device file, an allocation that must fail) run the console script.
"""

from __future__ import annotations

import contextlib
import errno
import gc
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
import torch
import torchmetrics
from conftest import LAYERDESCENT
from helpers import RUN, assert_one_line, cli, config_file, with_

import layerdescent.registry as registry_module
from layerdescent import LayerOutput, Task, hookimpl
from layerdescent.cli import main
from layerdescent.registry import Registry
from layerdescent.run.guard import calling

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
    "epochs-past-int64": (with_(RUN, "train.epochs", 2**64), "train.epochs must be at most 1,000,000"),
    "batch_size-2**40": (with_(RUN, "train.batch_size", 2**40), "train.batch_size must be at most 2,147,483,647"),
    "eval-batch_size-2**40": (with_(RUN, "eval.batch_size", 2**40), "eval.batch_size must be at most 2,147,483,647"),
    "train_gamma-1e308": (with_(RUN, "train.train_gamma", [1e308]), "train.train_gamma: 1e+308 outside [0, 1e+06]"),
    "layers-10**12": (with_(RUN, "task.layers", 10**12), "task.layers = 1,000,000,000,000 is more than this task builds (at most 1,024)"),
    "layers-2**63": (with_(RUN, "task.layers", 2**63 - 1), "task.layers = 9,223,372,036,854,775,807 is more than this task builds"),
    "layers-100000": (with_(RUN, "task.layers", 100_000), "task.layers = 100,000 is more than this task builds (at most 1,024)"),
    "code_dim-10**8": (with_(RUN, "task.code_dim", 10**8), "task.code_dim = 100,000,000 is more than this task builds (at most 16,384)"),
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
    "5000-deep": (_deep, "nests tables or arrays more than 32 deep"),
    "500-deep-table-header": (
        lambda t: _file(t, ("[" + ".".join(["a"] * 500) + "]\nx = 1\n").encode()),
        "nests tables or arrays more than 32 deep",
    ),
    "500-deep-dotted-key": (lambda t: _file(t, (".".join(["a"] * 500) + " = 1\n").encode()), "nests tables or arrays more than 32 deep"),
    "huge": (lambda t: _file(t, b"#" * (11 << 20)), "larger than 10 MiB"),
}


@pytest.mark.parametrize("make, message", FILE_CASES.values(), ids=FILE_CASES.keys())
def test_a_config_file_that_is_not_a_config_is_one_line(tmp_path, make, message):
    assert_one_line(*cli("run", make(tmp_path), "--out", tmp_path / "out"), message)


@pytest.mark.parametrize(
    "override, message",
    [
        (".".join(["train"] * 500) + "=1", "a key of 500 parts; a config nests at most 32 deep"),
        ("train.lr=" + "[" * 200 + "]" * 200, "its value nests arrays or tables 200 deep; a config nests at most 32 deep"),
    ],
    ids=["500-part-key", "200-deep-value"],
)
def test_a_set_override_nested_past_the_bound_is_one_line(tmp_path, override, message):
    assert_one_line(*cli("run", config_file(tmp_path, RUN), "--out", tmp_path / "out", "--set", override), message)


def test_epochs_that_make_more_steps_than_a_run_could_ever_take_are_one_line(tmp_path):
    table = with_(with_(with_(RUN, "train.epochs", 1_000_000), "train.batch_size", 1), "task.train_size", 2000)
    assert_one_line(
        *cli("run", config_file(tmp_path, table), "--out", tmp_path / "out"), "train.epochs = 1000000 makes 2,000,000,000 optimizer steps"
    )
    assert not (tmp_path / "out").exists()


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

    import layerdescent.run.checkpoint as checkpoint

    real, calls = checkpoint.torch.save, {"n": 0}

    def save(obj, handle):
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(obj, handle)

    monkeypatch.setattr(checkpoint.torch, "save", save)
    table = with_(with_(RUN, "train.epochs", 2), "train.keep_checkpoint", True)
    assert_one_line(
        *cli("run", config_file(tmp_path, table), "--out", tmp_path / "out"), "No space left on device", "the last checkpoint is intact"
    )
    assert checkpoint.load_checkpoint(tmp_path / "out" / "checkpoint.pt", "lista", kind="run")["position"]["epoch"] == 1


def test_a_full_disk_before_the_first_checkpoint_says_to_run_again_not_resume(tmp_path, monkeypatch):
    import layerdescent.run.checkpoint as checkpoint

    def save(obj, handle):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint.torch, "save", save)
    assert_one_line(
        *cli("run", config_file(tmp_path, RUN), "--out", tmp_path / "out"),
        "No space left on device",
        "no checkpoint was written yet: free space and run it again",
    )


def test_a_run_folder_made_read_only_mid_run_is_one_line_that_says_the_checkpoint_is_intact(tmp_path, monkeypatch):
    from layerdescent.run import checkpoint

    real, calls = checkpoint.tempfile.mkstemp, {"n": 0}

    def mkstemp(*args, **kwargs):
        calls["n"] += kwargs.get("prefix", "").startswith(".checkpoint.pt")
        if calls["n"] == 2:  # the second checkpoint: the first is there to resume from
            raise PermissionError(13, "Permission denied", str(kwargs.get("dir")))
        return real(*args, **kwargs)

    monkeypatch.setattr(checkpoint.tempfile, "mkstemp", mkstemp)
    table = with_(RUN, "train.epochs", 2)
    assert_one_line(
        *cli("run", config_file(tmp_path, table), "--out", tmp_path / "out"),
        "Permission denied",
        "the last checkpoint is intact: make it writable",
    )


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
                node = node[int(part)] if isinstance(node, list) else node[part]
            last = int(parts[-1]) if isinstance(node, list) else parts[-1]
            node[last] = value(node[last]) if callable(value) else value
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


def test_resume_refuses_a_log_line_damaged_before_the_checkpoint(tmp_path, finished):
    path, source = finished
    run = tmp_path / "run"
    shutil.copytree(source, run)
    (run / "results.json").unlink()
    log = (run / "metrics.jsonl").read_bytes()
    (run / "metrics.jsonl").write_bytes(b"X" + log[1:])  # same length: only the content tells
    assert_one_line(*cli("run", path, "--out", run, "--resume"), "metrics.jsonl:1 is not a JSON record", "before the point checkpoint")
    assert (run / "metrics.jsonl").read_bytes() == b"X" + log[1:]


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
        mode = self.options["mode"]
        return "2" if mode == "num_layers-string" else 10**12 if mode == "deep" else self.options["layers"]

    def build_model(self):
        model = torch.nn.ModuleList([torch.nn.Linear(3, 1) for _ in range(3)])
        if self.options["mode"] == "nan-unused":
            model.unused = torch.nn.Parameter(torch.full((2,), float("nan")))  # no loss reads it
        return model

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
        if mode == "exits":
            sys.exit(0)
        if mode == "generator-exit":
            raise GeneratorExit
        if mode == "base-exception":
            raise BaseException("bare")
        if mode == "float":
            return float(losses.detach().mean())  # a plugin that hands back a number, not the tensor
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
        if mode == "in-place":  # a chain whose backward needs model[1].weight as the forward saw it
            losses = losses + 0 * model[1](model[0](batch["x"]).repeat(1, 3)).pow(2)
            with torch.no_grad():
                model[1].weight.add_(0.0)
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
    "num_layers-10**12": ("deep", "num_layers is 1,000,000,000,000; layerdescent trains at most 1024 layers"),
    "split-not-a-dataset": ("split-not-a-dataset", "build_datasets returned split 'test' as list"),
    "layer_losses-raises": ("raises", "layer_losses raised KeyError: 'x_missing'"),
    "layer_losses-sys-exit-0": (
        "exits",
        "layer_losses raised SystemExit(0) (sys.exit()); a plugin must raise an Exception, not end the process",
    ),
    "layer_losses-generator-exit": ("generator-exit", "layer_losses raised GeneratorExit; a plugin must raise an Exception"),
    "layer_losses-bare-base-exception": ("base-exception", "layer_losses raised BaseException: bare; a plugin must raise an Exception"),
    "layer_losses-float": ("float", "layer_losses returned float, not a LayerOutput"),
    "layer_losses-tuple": ("tuple", "layer_losses returned tuple, not a LayerOutput"),
    "layer_losses-1d": ("one-d", "layer_losses raised ValueError: LayerOutput.losses must be B x (L+1)"),
    "layer_losses-integer": ("integer", "layer_losses returned losses of dtype torch.int64"),
    "wrong-column-count": ("columns", "layer_losses returned losses with 2 columns; it needs 3"),
    "metric-shapes": ("metric-shapes", "metrics().update"),
    "parameters-changed-in-place": (
        "in-place",
        "the backward pass through layer_losses raised RuntimeError: one of the variables needed for gradient computation has been modified by an inplace operation",
    ),
    "nan-but-unused-parameter": ("nan-unused", "'unused' holds non-finite (NaN or infinite) values after training"),
}


@pytest.mark.parametrize("mode, message", PLUGIN_CASES.values(), ids=PLUGIN_CASES.keys())
def test_a_plugin_that_breaks_the_contract_is_one_line_naming_it_and_the_method(tmp_path, monkeypatch, mode, message):
    monkeypatch.setattr(registry_module, "_registry", Registry(extra_plugins=[("broken-plugin", BrokenPlugin())]))
    table = {
        "task": {"name": "broken", "mode": mode},
        "train": {"epochs": 1, "batch_size": 16, "progress": False},
        "solver": {"name": "erm"},
    }
    assert_one_line(*cli("run", config_file(tmp_path, table), "--out", tmp_path / "out"), "task 'broken' (plugin 'broken-plugin')", message)
    assert not (tmp_path / "out" / "results.json").exists()
    assert not (tmp_path / "out" / "model.safetensors").exists()


def test_a_plugin_exiting_inside_a_bench_fails_its_run_and_the_others_train(tmp_path, monkeypatch):
    monkeypatch.setattr(registry_module, "_registry", Registry(extra_plugins=[("broken-plugin", BrokenPlugin())]))
    table = {
        "task": {"name": "broken"},
        "train": {"epochs": 1, "batch_size": 16, "progress": False},
        "solver": {"name": "erm"},
        "bench": {"seeds": [0], "variants": {"exits": {"task": {"mode": "exits"}}, "fine": {}}},
    }
    status, lines = cli("bench", config_file(tmp_path, table), "--out", tmp_path / "out")
    assert status != 0 and any("layer_losses raised SystemExit(0) (sys.exit())" in line for line in lines), lines
    assert (tmp_path / "out" / "fine" / "seed-0" / "results.json").exists()
    assert not (tmp_path / "out" / "exits" / "seed-0" / "results.json").exists()


@pytest.fixture
def ctrl_c_plugin(tmp_path, monkeypatch):
    """A plugin installed under an entry point whose import raises KeyboardInterrupt."""
    (tmp_path / "ctrl_c_plugin.py").write_text("raise KeyboardInterrupt\n")
    dist = tmp_path / "ctrl_c_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: ctrl-c-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[layerdescent]\nctrl-c = ctrl_c_plugin\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry_module, "_registry", None)


def test_a_plugin_raising_keyboard_interrupt_at_import_is_a_plugin_failure_not_an_interrupt(ctrl_c_plugin):
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        assert main(["list"]) == 0 and main(["plugins"]) == 0
    assert "interrupted" not in err.getvalue()
    assert any(line.startswith("ctrl-c") and "failed" in line and "KeyboardInterrupt" in line for line in out.getvalue().splitlines()), (
        out.getvalue()
    )


def test_ctrl_c_between_entering_a_plugin_call_and_its_block_leaves_nothing_to_report(monkeypatch):
    # The signal can land after calling().__enter__ and before the block's cleanup is set up; the guard must
    # then have nothing left to finalize (a suspended generator's close() printed "collate raised GeneratorExit").
    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    guard = calling("task 'lista' (plugin 'lista')", "collate")
    guard.__enter__()
    del guard
    gc.collect()
    assert unraisable == []


# --- bench --------------------------------------------------------------------------------------

BENCH = {**RUN, "bench": {"seeds": [0], "variants": {"erm": {"solver": {"name": "erm"}}}}}

BENCH_CASES = {
    "slurm-mem-gb-nan": (("--executor", "slurm", "--set", "bench.executor.mem_gb=nan"), "bench.executor.mem_gb must be a number, got nan"),
    "slurm-time-absurd": (
        ("--executor", "slurm", "--set", "bench.executor.time=99999999"),
        "bench.executor.time must be in 1..527040 minutes",
    ),
    "ray-not-installed": (("--executor", "ray"), "ray"),
}


def importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


@pytest.mark.parametrize("flags, message", BENCH_CASES.values(), ids=BENCH_CASES.keys())
def test_a_refused_executor_or_option_is_one_line_and_leaves_nothing_behind(tmp_path, flags, message):
    if "ray" in flags and importable("ray"):
        pytest.skip("ray is installed here, so the executor would not be refused")
    assert_one_line(*cli("bench", config_file(tmp_path, BENCH, "bench.toml"), "--out", tmp_path / "out", *flags), message)
    assert not (tmp_path / "out").exists()


def test_a_bench_of_more_runs_than_any_sweep_is_one_line_before_planning(tmp_path):
    table = {**BENCH, "bench": {**BENCH["bench"], "seeds": list(range(200)), "grid": {"train.lr": [0.001 * (i + 1) for i in range(100)]}}}
    assert_one_line(
        *cli("bench", config_file(tmp_path, table, "bench.toml"), "--out", tmp_path / "out"), "the bench has 20,000 runs", "at most 10,000"
    )


def test_a_bench_files_mistyped_top_level_seed_is_one_line(tmp_path):
    table = {**BENCH, "seed": "many"}
    assert_one_line(
        *cli("bench", config_file(tmp_path, table, "bench.toml"), "--out", tmp_path / "out"), "seed must be an integer, got 'many'"
    )
    assert not (tmp_path / "out").exists()


# --- report -------------------------------------------------------------------------------------

SCHEMA_CASES = {
    "layer_loss-not-a-number": (_edit("gammas.0.layer_loss.1", "x"), "gammas[0].layer_loss[1] is 'x', not a number"),
    "metric-nan": (_edit("gammas.1.metrics.mse", float("nan")), "gammas[1].metrics.mse is nan, not a finite number"),
    "num_layers-disagrees": (_edit("num_layers", 5), "gammas[0].layer_loss has 4 entries, but num_layers = 5 needs 6"),
    "seed-a-string": (_edit("seed", "0"), "seed is '0', not an integer"),
    "descent_rate-above-1": (_edit("gammas.0.descent_rate.0", 7), "gammas[0].descent_rate[0] is 7, outside 0..1"),
    "train-steps-a-string": (_edit("train.steps", "a"), "train.steps is 'a', not an integer"),
}


@pytest.mark.parametrize("edit, message", SCHEMA_CASES.values(), ids=SCHEMA_CASES.keys())
def test_report_on_a_results_file_that_breaks_the_schema_is_one_line_naming_the_file_and_field(tmp_path, finished, edit, message):
    run = tmp_path / "run"
    shutil.copytree(finished[1], run)
    data = edit(json.loads((run / "results.json").read_text()))
    (run / "results.json").write_text(json.dumps(data))
    assert_one_line(*cli("report", run), f"{run / 'results.json'}: {message}")
    assert not (run / "summary.md").exists()


def test_report_on_an_unreadable_log_is_one_line(tmp_path, finished):
    run = tmp_path / "run"
    shutil.copytree(finished[1], run)
    (run / "metrics.jsonl").unlink()
    (run / "metrics.jsonl").mkdir()  # what root cannot be kept from reading, a directory still is not a log
    assert_one_line(*cli("report", run), f"cannot read {run / 'metrics.jsonl'}")


def test_report_into_a_read_only_folder_is_one_line(tmp_path, finished, monkeypatch):
    import matplotlib.figure

    def refuse(self, path, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(path))

    run = tmp_path / "run"
    shutil.copytree(finished[1], run)
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", refuse)
    assert_one_line(*cli("report", run), f"cannot write the report into {run}: Permission denied")
    assert sorted(p.name for p in run.iterdir()) == sorted(p.name for p in finished[1].iterdir())


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
    def cap():  # an allocation that must fail fails here without troubling the machine
        resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))

    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.run(
        [*LAYERDESCENT, *map(str, argv)],
        capture_output=True,
        text=True,
        env=env,
        preexec_fn=cap if limit_memory else None,
        timeout=300,
        **kwargs,
    )


def test_the_console_script_ends_in_one_line_for_a_device_a_huge_model_and_too_many_threads(tmp_path):
    cases = [
        (("run", "/dev/zero", "--out", tmp_path / "a"), {}, "config file /dev/zero is a device"),
        (("run", "/dev/null", "--out", tmp_path / "a"), {}, "config file /dev/null is a device"),
        (
            (
                "run",
                config_file(tmp_path, with_(with_(RUN, "task.layers", 1024), "task.code_dim", 16_384), "big.toml"),
                "--out",
                tmp_path / "b",
            ),
            {"limit_memory": True},
            "too large",
        ),
        (
            ("run", config_file(tmp_path, with_(RUN, "train.threads", 100000), "threads.toml"), "--out", tmp_path / "c"),
            {},
            "train.threads must be at most",
        ),
    ]
    for argv, options, message in cases:
        proc = console(*argv, **options)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
        assert lines[-1].startswith("layerdescent: error: ") and message in lines[-1], lines


def test_a_file_size_limit_hit_inside_torch_save_is_one_line(tmp_path):
    def limit():  # room for the config and the log, not for a checkpoint (about 23 kB)
        resource.setrlimit(resource.RLIMIT_FSIZE, (8000, 8000))

    proc = subprocess.run(
        [*LAYERDESCENT, "run", str(config_file(tmp_path, RUN)), "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        preexec_fn=limit,
        timeout=300,
        check=False,
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert lines[-1].startswith("layerdescent: error: ") and "File too large" in lines[-1] and "raise the file size limit" in lines[-1], (
        lines
    )


def test_a_file_size_limit_hit_writing_the_model_file_is_one_line(tmp_path, monkeypatch):
    import safetensors.torch

    def save_file(tensors, filename):
        raise safetensors.SafetensorError("Error while serializing: I/O error: File too large (os error 27)")

    monkeypatch.setattr(safetensors.torch, "save_file", save_file)
    assert_one_line(*cli("run", config_file(tmp_path, RUN), "--out", tmp_path / "out"), "File too large", "raise the file size limit")
    assert not (tmp_path / "out" / "results.json").exists()
