"""`layerdescent config`: a complete TOML at the defaults that `run` takes unchanged, and a reference page generated from the code."""

from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path

import layerdescent as ld
from layerdescent.cli import main
from layerdescent.registry import Registry
from layerdescent.run.config import EvalConfig, TrainConfig
from layerdescent.run.config_file import tomllib
from layerdescent.run.config_keys import dataclass_keys, default_config, reference_markdown, task_keys

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "reference" / "configuration.md"
BUNDLED = ("lista", "language", "text-classification", "llm-finetuning", "video-denoising")


def _bundled() -> Registry:
    """The registry of the bundled plugins alone, whatever else is installed."""
    modules = {
        "lista": "layerdescent_lista",
        "language": "layerdescent_language",
        "text-classification": "layerdescent_text",
        "llm-finetuning": "layerdescent_llm",
        "video-denoising": "layerdescent_video",
    }
    return Registry(extra_plugins=[(name, importlib.import_module(modules[name])) for name in BUNDLED], entry_points=False)


def test_configuration_reference_page_is_what_the_code_generates():
    assert PAGE.read_text() == reference_markdown(_bundled()), (
        "docs/reference/configuration.md is stale: run `layerdescent config --reference > docs/reference/configuration.md`"
    )


def test_every_key_of_every_bundled_table_task_solver_and_constraint_kind_has_a_meaning():
    registry = _bundled()
    tables = [dataclass_keys(TrainConfig, "train"), dataclass_keys(EvalConfig, "eval")]
    tables += [dataclass_keys(cls.Options, "solver") for cls in registry.solvers.values()]
    tables += [dataclass_keys(cls, "constraints") for cls in registry.constraints.values()]
    tables += [task_keys(cls) for cls in registry.tasks.values()]
    missing = [key.name for keys in tables for key in keys if not key.meaning]
    assert not missing, f"keys without a one-line meaning (a docstring under the field, or Task.option_help): {missing}"


def test_reference_ranges_are_found_from_the_checks_themselves():
    ranges = {key.name: key.range for key in dataclass_keys(TrainConfig, "train")}
    assert ranges["lr"] == "> 0" and ranges["epochs"] == ">= 1, <= 1,000,000" and ranges["dropout"] == ">= 0, < 1"
    assert ranges["optimizer"] == 'one of `"adam"`, `"adamw"`, `"sgd"`'
    solver = {key.name: key.range for key in dataclass_keys(ld.get_registry().solver("primal-dual").Options, "solver")}
    assert solver["penalty_growth"] == ">= 1" and solver["nupi_ema"] == ">= 0, < 1" and solver["dual_lr"] == ">= 0"
    descent = {key.name: key for key in dataclass_keys(ld.Descent, "constraints")}
    assert descent["alpha"].range == ">= 0, < 1" and descent["reference"].default == "detached"


def test_config_defaults_is_every_key_at_its_default_for_each_solver(capsys):
    for solver in ("erm", "penalty", "primal-dual"):
        assert main(["config", "--defaults", "--solver", solver]) == 0
        table = tomllib.loads(capsys.readouterr().out)
        config = ld.config_from_dict(table)
        assert config == default_config(solver=solver)
        recorded = config.as_dict()  # what a run records: every key it writes is in the printed file, with the same value
        for section, values in recorded.items():
            if isinstance(values, dict):
                assert values.items() <= table[section].items(), section
        fields = {f.name for f in dataclasses.fields(TrainConfig)} - {"dropout"}  # unset: a comment
        assert fields == set(table["train"]) and table["solver"]["name"] == solver


def test_config_defaults_for_another_task_fills_in_its_options(capsys):
    assert main(["config", "--defaults", "--task", "text-classification"]) == 0
    table = tomllib.loads(capsys.readouterr().out)
    assert table["task"]["model_path"] == "" and table["task"]["pooling"] == "mean"
    assert main(["config", "--defaults", "--task", "no-such-task"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_config_defaults_round_trips_through_run_unchanged(tmp_path, capsys):
    assert main(["config", "--defaults"]) == 0
    path = tmp_path / "defaults.toml"
    path.write_text(capsys.readouterr().out)
    assert main(["run", str(path), "--out", str(tmp_path / "run")]) == 0
    recorded = tomllib.loads((tmp_path / "run" / "config.toml").read_text())
    printed = tomllib.loads(path.read_text())
    assert ld.config_from_dict(recorded) == ld.config_from_dict(printed) == default_config()
    for section, values in recorded.items():  # as_dict leaves out a few keys at their defaults; every key it writes is printed alike
        if isinstance(values, dict):
            assert values.items() <= printed[section].items(), section
        elif isinstance(values, list):
            assert all(r.items() <= p.items() for r, p in zip(values, printed[section], strict=True)), section
        else:
            assert values == printed[section], section


def test_config_reference_prints_every_registered_table(capsys):
    assert main(["config", "--reference"]) == 0
    page = capsys.readouterr().out
    for heading in ("## [train]", "### solver `primal-dual`", "### kind `descent`", "### task `lista`", "## [eval]"):
        assert heading in page
    assert main(["config", "--reference", "--task", "lista"]) == 2
    assert "--task and --solver go with --defaults" in capsys.readouterr().err
