"""Plugins: found through the entry-point group, isolated when broken, listed with their status."""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch

import layerdescent as ld
from layerdescent import LayerOutput, Task, hookimpl
from layerdescent.registry import Registry


class ResidualRegression(Task):
    """A third-party task: a residual MLP refining a linear regression estimate."""

    name = "toy-regression"
    options = {"layers": 3, "size": 128}

    @property
    def num_layers(self) -> int:
        return self.options["layers"]

    def build_model(self):
        return torch.nn.ModuleList([torch.nn.Linear(4, 1)] + [torch.nn.Linear(5, 1) for _ in range(self.num_layers)])

    def build_datasets(self):
        import datasets

        g = torch.Generator().manual_seed(0)
        x = torch.randn(self.options["size"], 4, generator=g)
        y = x.sum(1, keepdim=True).sin()
        ds = datasets.Dataset.from_dict({"x": x.numpy(), "y": y.numpy()}).with_format("torch")
        return {"train": ds, "validation": ds, "test": ds}

    def collate(self, rows):
        return rows

    def layer_losses(self, model, batch, gamma=0.0):
        x = batch["x"] + gamma * torch.randn_like(batch["x"])
        estimate = model[0](x)
        losses = [(estimate - batch["y"]).pow(2).squeeze(1)]
        for layer in model[1:]:
            estimate = estimate + layer(torch.cat([x, estimate], 1))
            losses.append((estimate - batch["y"]).pow(2).squeeze(1))
        return LayerOutput(torch.stack(losses, 1), preds=estimate, target=batch["y"])


class ToyPlugin:
    @hookimpl
    def register_tasks(self, register):
        register(ResidualRegression)


def test_a_plugin_object_registers_a_task_that_trains(tmp_path):
    registry = Registry(extra_plugins=[("toy", ToyPlugin())])
    config = ld.config_from_dict(
        {"task": {"name": "toy-regression"}, "train": {"epochs": 2, "progress": False}, "constraints": [{"kind": "descent"}]},
        registry,
    )
    results = ld.train(config, tmp_path / "run", registry=registry)
    assert results["task"] == "toy-regression"
    assert len(results["gammas"][0]["layer_loss"]) == 4


@pytest.fixture
def entry_point_plugins(tmp_path, monkeypatch):
    """Install plugin modules under an entry point, as `pip install` of a third-party package would."""

    def install(modules: dict[str, str], entry_points: dict[str, str]):
        for name, source in modules.items():
            (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
        dist = tmp_path / "thirdparty_plugins-1.2.3.dist-info"
        dist.mkdir()
        (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: thirdparty-plugins\nVersion: 1.2.3\n")
        lines = "\n".join(f"{k} = {v}" for k, v in entry_points.items())
        (dist / "entry_points.txt").write_text(f"[layerdescent]\n{lines}\n")
        monkeypatch.syspath_prepend(str(tmp_path))
        for name in modules:
            sys.modules.pop(name, None)
        return Registry()

    return install


GOOD = """
    import layerdescent
    from layerdescent import Bound

    class Ceiling(Bound):
        '''A bound under another name.'''
        kind = "ceiling"

    @layerdescent.hookimpl
    def register_constraints(register):
        register(Ceiling)
"""


def test_an_entry_point_plugin_is_found_with_its_distribution(entry_point_plugins):
    registry = entry_point_plugins({"good_plugin": GOOD}, {"good": "good_plugin"})
    assert "ceiling" in registry.constraints
    info = registry.plugins["good"]
    assert (info.status, info.distribution, info.version) == ("loaded", "thirdparty-plugins", "1.2.3")
    assert "lista" in registry.tasks  # the bundled plugin loads through the same group


@pytest.mark.parametrize(
    "source, reason",
    [
        ("import no_such_module_anywhere\n", "import failed: ModuleNotFoundError"),
        ("import layerdescent\n@layerdescent.hookimpl\ndef register_task(register):\n    pass\n", "unknown hook 'register_task'"),
        (
            "import layerdescent\n@layerdescent.hookimpl\ndef register_tasks(register):\n    raise RuntimeError('boom')\n",
            "register_tasks raised RuntimeError: boom",
        ),
        ("import layerdescent\n@layerdescent.hookimpl\ndef register_tasks(register):\n    register(object)\n", "not a Task"),
        (
            "import layerdescent\nfrom layerdescent import Descent\n@layerdescent.hookimpl\ndef register_constraints(register):\n    register(Descent)\n",
            "'descent' is already registered by plugin 'layerdescent.core.constraints'",
        ),
        (
            "import layerdescent\nclass Mine(layerdescent.Executor):\n    name = 'local'\n@layerdescent.hookimpl\ndef register_executors(register):\n    register(Mine)\n",
            "register_executors: executor 'local' is already registered by plugin 'layerdescent.bench.executors'",
        ),
        (
            "import layerdescent\n@layerdescent.hookimpl\ndef register_trackers(register):\n    register(object)\n",
            "register_trackers raised PluginError: registered <class 'object'>, which is not a Tracker",
        ),
    ],
    ids=["import-error", "unknown-hook", "raises", "wrong-type", "duplicate-name", "duplicate-executor", "wrong-type-tracker"],
)
def test_a_broken_plugin_is_reported_by_name_and_the_others_still_load(entry_point_plugins, source, reason):
    registry = entry_point_plugins({"bad_plugin": source, "good_plugin": GOOD}, {"bad": "bad_plugin", "good": "good_plugin"})
    assert registry.plugins["bad"].status == "failed"
    assert reason in registry.plugins["bad"].reason
    assert registry.plugins["good"].status == "loaded"
    assert {"ceiling", "descent", "bound"} <= set(registry.constraints)
    assert "lista" in registry.tasks


def test_disable_environment_variable_blocks_plugins_by_name(monkeypatch):
    monkeypatch.setenv("LAYERDESCENT_DISABLE_PLUGINS", "lista, other")
    registry = Registry()
    assert registry.plugins["lista"].status == "blocked"
    assert "lista" not in registry.tasks


def test_unknown_task_names_the_closest_one():
    with pytest.raises(ld.PluginError, match="unknown task 'lsita'; did you mean 'lista'"):
        Registry().task("lsita")


class AssetPlugin:
    @hookimpl
    def register_assets(self, register):
        register(ld.Asset(name="tiny-wheel", source="pypi", requirement="tiny==1.0", filename="tiny-1.0-py3-none-any.whl", sha256="0" * 64))


def test_a_plugin_declares_assets_that_the_registry_lists_and_locates_with_a_fetch_hint(tmp_path, monkeypatch):
    monkeypatch.setenv("LAYERDESCENT_CACHE", str(tmp_path))
    registry = Registry(extra_plugins=[("assets", AssetPlugin())])
    asset = registry.asset("tiny-wheel")
    from layerdescent import assets

    with pytest.raises(ld.AssetError, match="layerdescent assets fetch tiny-wheel"):
        assets.locate(asset)


def test_plugins_command_shows_a_failed_plugin_with_its_reason(tmp_path):
    import os
    import subprocess

    (tmp_path / "bad_plugin.py").write_text("raise RuntimeError('broken on purpose')\n")
    dist = tmp_path / "bad_plugins-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: bad-plugins\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[layerdescent]\nbad = bad_plugin\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "layerdescent.cli", "plugins"], capture_output=True, text=True, env=env)
    assert proc.returncode == 0
    bad = next(line for line in proc.stdout.splitlines() if line.startswith("bad "))
    assert "failed" in bad and "bad-plugins 0.1" in bad and "RuntimeError: broken on purpose" in bad
    assert any(line.startswith("lista ") and "loaded" in line for line in proc.stdout.splitlines())
    assert proc.stderr.count("plugin 'bad' skipped") == 1


HALF = """
    import layerdescent
    from layerdescent import Bound

    class Half(Bound):
        '''Registered before the plugin breaks in another hook.'''
        kind = "half"

    @layerdescent.hookimpl
    def register_constraints(register):
        register(Half)

    @layerdescent.hookimpl
    def register_assets(register):
        raise RuntimeError("assets broke")
"""


def test_a_plugin_that_fails_in_one_hook_contributes_nothing_from_the_others(entry_point_plugins):
    registry = entry_point_plugins({"half_plugin": HALF, "good_plugin": GOOD}, {"half": "half_plugin", "good": "good_plugin"})
    assert registry.plugins["half"].status == "failed"
    assert "register_assets raised RuntimeError: assets broke" in registry.plugins["half"].reason
    assert "half" not in registry.constraints and "ceiling" in registry.constraints


def test_a_plugin_calling_sys_exit_at_import_is_skipped_by_name(entry_point_plugins):
    registry = entry_point_plugins(
        {"exiting_plugin": "import sys\nsys.exit(3)\n", "good_plugin": GOOD}, {"exiting": "exiting_plugin", "good": "good_plugin"}
    )
    assert registry.plugins["exiting"].status == "failed" and "sys.exit() at import" in registry.plugins["exiting"].reason
    assert "ceiling" in registry.constraints and "lista" in registry.tasks


def test_a_plugin_calling_sys_exit_in_a_hook_is_skipped_by_name(entry_point_plugins):
    source = "import sys, layerdescent\n@layerdescent.hookimpl\ndef register_tasks(register):\n    sys.exit(1)\n"
    registry = entry_point_plugins({"exiting_plugin": source}, {"exiting": "exiting_plugin"})
    assert registry.plugins["exiting"].status == "failed" and "register_tasks raised SystemExit" in registry.plugins["exiting"].reason


@pytest.mark.parametrize(
    "where, source, reason",
    [
        ("import", "raise GeneratorExit\n", "import failed: GeneratorExit"),
        ("import", "raise BaseException('bare')\n", "import failed: BaseException: bare"),
        (
            "hook",
            "import layerdescent\n@layerdescent.hookimpl\ndef register_tasks(register):\n    raise GeneratorExit\n",
            "register_tasks raised GeneratorExit",
        ),
        (
            "hook",
            "import layerdescent\n@layerdescent.hookimpl\ndef register_tasks(register):\n    raise BaseException('bare')\n",
            "register_tasks raised BaseException: bare",
        ),
    ],
)
def test_a_plugin_raising_a_base_exception_is_skipped_by_name(entry_point_plugins, where, source, reason):
    registry = entry_point_plugins({"odd_plugin": source, "good_plugin": GOOD}, {"odd": "odd_plugin", "good": "good_plugin"})
    assert registry.plugins["odd"].status == "failed" and reason in registry.plugins["odd"].reason
    assert "ceiling" in registry.constraints and "lista" in registry.tasks


def test_a_duplicate_name_names_both_plugins_and_which_was_skipped(entry_point_plugins):
    twin = GOOD.replace("A bound under another name.", "Another ceiling.")
    registry = entry_point_plugins({"good_plugin": GOOD, "twin_plugin": twin}, {"good": "good_plugin", "twin": "twin_plugin"})
    failed = [info for info in registry.plugins.values() if info.status == "failed" and info.name in ("good", "twin")]
    assert len(failed) == 1
    loser = failed[0].name
    winner = "good" if loser == "twin" else "twin"
    assert (
        f"constraint kind 'ceiling' is already registered by plugin {winner!r}; plugin {loser!r} was skipped, {winner!r} kept"
        in failed[0].reason
    )
    assert registry.owner[("ConstraintSpec", "ceiling")] == winner


def test_a_misspelt_disabled_plugin_is_warned_about(monkeypatch, caplog):
    monkeypatch.setenv("LAYERDESCENT_DISABLE_PLUGINS", "lsita")
    with caplog.at_level("WARNING", logger="layerdescent"):
        registry = Registry()
    assert registry.plugins["lista"].status == "loaded"
    assert any("names 'lsita', but no plugin has that name" in r.getMessage() for r in caplog.records)


def test_list_shows_the_plugin_each_constraint_kind_came_from(capsys):
    from layerdescent.cli import main

    assert main(["list"]) == 0
    descent = next(line for line in capsys.readouterr().out.splitlines() if line.strip().startswith("descent "))
    assert "[plugin layerdescent.core.constraints]" in descent


def test_list_shows_the_built_in_executors_and_trackers_as_default_plugins(capsys):
    from layerdescent.cli import main

    assert main(["list"]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines() if line.startswith("  ")}
    for name in ("local", "ray", "slurm"):
        assert rows[name].endswith("[plugin layerdescent.bench.executors]"), rows[name]
    for name in ("tensorboard", "mlflow"):
        assert rows[name].endswith("[plugin layerdescent.bench.trackers]"), rows[name]
