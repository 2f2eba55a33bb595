"""The README's examples work exactly as written, and it documents every hook."""

from __future__ import annotations

import re
import types
from pathlib import Path

import pytest
import torch

import layerdescent as ld
from layerdescent.registry import Registry

README = Path(__file__).resolve().parents[1] / "README.md"


def _plugin_example() -> types.ModuleType:
    text = README.read_text()
    code = re.search(r"<!-- plugin-example -->\n```python\n(.*?)```", text, re.S).group(1)
    module = types.ModuleType("my_plugin")
    exec(compile(code, "README.md:my_plugin.py", "exec"), module.__dict__)
    return module


def test_readme_plugin_example_registers_and_trains_under_descent_constraints(tmp_path):
    registry = Registry(extra_plugins=[("refine", _plugin_example())])
    config = ld.config_from_dict(
        {
            "task": {"name": "refine", "layers": 3},
            "train": {"epochs": 3, "progress": False, "lr": 0.01},
            "constraints": [{"kind": "descent", "alpha": 0.05}],
            "eval": {"gammas": [0.0, 0.5]},
        },
        registry,
    )
    results = ld.train(config, tmp_path / "run", registry=registry)
    assert results["task"] == "refine" and len(results["gammas"][0]["layer_loss"]) == 4


def test_readme_quotes_the_commands_ci_runs():
    text = README.read_text()
    ci = (README.parent / ".ci" / "run").read_text()
    command = 'pip install torch==2.13.0 && pip install -e ".[test]" && python -m pytest'
    assert command in text and command in ci


def test_readme_annotated_config_is_a_valid_config_with_every_section():
    from layerdescent.config import tomllib

    text = README.read_text()
    block = re.search(r"## A run, annotated\n\n```toml\n(.*?)```", text, re.S).group(1)
    config = ld.config_from_dict(tomllib.loads(block))
    assert config.solver.name == "primal-dual" and config.constraints[0].reference == "detached"
    assert config.train.on_nonfinite == "stop" and config.eval.gammas == (0.0, 0.1, 0.3, 0.5, 1.0)


def test_readme_constraint_example_registers_checks_its_options_and_trains(tmp_path, monkeypatch):
    import sys

    import pytest

    text = README.read_text()
    code = re.search(r"<!-- constraint-example -->\n```python\n(.*?)```", text, re.S).group(1)
    module = types.ModuleType("my_constraint")
    monkeypatch.setitem(sys.modules, "my_constraint", module)  # dataclasses look their module up
    exec(compile(code, "README.md:my_constraint.py", "exec"), module.__dict__)
    registry = Registry(extra_plugins=[("gap", module)])
    table = {"task": {"name": "lista", "layers": 3, "code_dim": 8, "measure_dim": 6, "sparsity": 2, "train_size": 64, "validation_size": 16, "test_size": 16}, "train": {"epochs": 1, "progress": False}}
    with pytest.raises(ld.ConfigError, match=r"^constraints\[0\]: ratio must be in \(0, 1\], got 2.0$"):
        ld.config_from_dict({**table, "constraints": [{"kind": "gap", "ratio": 2.0}]}, registry)
    with pytest.raises(ld.ConfigError, match=r"constraints\[0\].ratio must be a number"):
        ld.config_from_dict({**table, "constraints": [{"kind": "gap", "ratio": "half"}]}, registry)
    config = ld.config_from_dict({**table, "constraints": [{"kind": "gap", "ratio": 0.5}]}, registry)
    results = ld.train(config, tmp_path / "run", registry=registry)
    assert results["constraints"]["gap"]["labels"] == ["l3<=0.5*l0"]


def python_block(marker: str, source: Path = README) -> str:
    """The ```python block that follows ``<!-- marker -->`` in ``source`` (the README, or a page under docs/)."""
    return re.search(rf"<!-- {marker} -->\n```python\n(.*?)```", source.read_text(), re.S).group(1)


def test_readme_loop_example_trains_under_descent_constraints_exactly_as_written():
    namespace: dict = {}
    exec(compile(python_block("loop-example"), "README.md:loop", "exec"), namespace)
    update, losses = namespace["update"], namespace["losses"]
    means = torch.stack(losses, dim=1).mean(0).detach()
    assert means[-1] < means[0] * 0.5  # the last layer improved on the input's estimate
    assert update.record()["lambda"]["descent"] and all(v >= 0 for v in update.multipliers()["descent"].tolist())
    assert namespace["step"] == 299


def test_readme_solver_example_registers_and_runs_from_toml_alone(tmp_path, monkeypatch):
    import sys

    module = types.ModuleType("my_solver")
    monkeypatch.setitem(sys.modules, "my_solver", module)  # dataclasses look their module up
    exec(compile(python_block("solver-example"), "README.md:my_solver.py", "exec"), module.__dict__)
    registry = Registry(extra_plugins=[("ramp", module)])
    table = {
        "task": {"name": "lista", "layers": 3, "code_dim": 8, "measure_dim": 6, "sparsity": 2, "train_size": 64, "validation_size": 16, "test_size": 16},
        "train": {"epochs": 1, "progress": False},
        "solver": {"name": "ramp", "steps": 2},
    }
    results = ld.train(ld.config_from_dict(table, registry), tmp_path / "run", registry=registry)
    assert results["solver"] == "ramp"
    table["solver"]["steps"] = 0
    with pytest.raises(ld.ConfigError, match=r"solver.steps must be >= 1, got 0"):
        ld.config_from_dict(table, registry)


def test_every_hook_is_documented_in_the_readme_and_exercised_by_a_test():
    from layerdescent import hookspecs

    hooks = [name for name in dir(hookspecs) if name.startswith("register_")]
    text = README.read_text()
    tests = "".join(p.read_text() for p in Path(__file__).parent.glob("test_*.py") if p.name != Path(__file__).name)
    assert len(hooks) >= 4
    for hook in hooks:
        assert f"`{hook}(register)`" in text or f"def {hook}(register)" in text, f"{hook} is not documented in the README"
        assert f"def {hook}(" in tests, f"no test implements {hook}"


def test_readme_bench_judging_example_is_a_valid_bench_table():
    from layerdescent.config import tomllib
    from layerdescent.endpoints import parse_spec

    block = re.search(r"<!-- bench-judging-example -->\n```toml\n(.*?)```", README.read_text(), re.S).group(1)
    bench = tomllib.loads(block)["bench"]
    spec = parse_spec(bench, list(bench["variants"]))
    assert spec.baselines == ("erm", "penalty") and spec.tuning == {"alpha=0.2": 12}
    assert spec.primary.variants == ("primal-dual",) and spec.primary.adopted == ("alpha=0.2",) and spec.primary.gammas == (0.0, 1.6, 3.2)
