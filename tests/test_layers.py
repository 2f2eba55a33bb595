"""The package's layers hold: each imports only the layers below it (the contracts in .importlinter)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LINT = "from importlinter.cli import lint_imports_command; lint_imports_command()"  # `lint-imports`, from this interpreter


def test_every_import_runs_down_the_layers_and_the_cores_own_order_and_the_core_touches_no_file():
    pytest.importorskip("importlinter", reason="the layer check needs pip install 'layerdescent[test]' (import-linter)")
    proc = subprocess.run([sys.executable, "-c", LINT, "--config", str(ROOT / ".importlinter")], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "Contracts: 3 kept, 0 broken." in proc.stdout
    assert "Inside the core:" in proc.stdout  # the front above the solvers, the solvers above the problem
    assert "plugin registry" in proc.stdout  # the core imports no registry: a front above it passes one


def test_the_core_objects_expose_no_more_public_methods_than_they_did():
    from layerdescent import LayerwiseProblem, LayerwiseUpdate, Solver

    def methods(cls):
        return [
            n
            for n, v in vars(cls).items()
            if not n.startswith("_") and not isinstance(v, type) and (callable(v) or isinstance(v, (property, classmethod, staticmethod)))
        ]

    counts = {cls.__name__: len(methods(cls)) for cls in (LayerwiseUpdate, LayerwiseProblem, Solver)}
    # issue 62 counted 51 and asks for 30: the step's engine is the scheme's (core/solver.py), Cooper owns the multipliers' tensors
    assert sum(counts.values()) <= 30, counts


def test_the_registry_names_its_built_in_plugins_by_module_path_and_imports_none_of_them():
    from layerdescent import registry

    source = Path(registry.__file__).read_text()
    for path in registry.DEFAULT_PLUGINS:
        assert f"from {path}" not in source.split("if TYPE_CHECKING:")[0] and f"import {path}" not in source
    loaded = registry.Registry(entry_points=False)
    assert {info.name for info in loaded.plugins.values()} == set(registry.DEFAULT_PLUGINS)
    assert all(info.status == "loaded" for info in loaded.plugins.values())


def test_no_module_imports_another_that_imports_it_back_even_inside_a_function():
    grimp = pytest.importorskip("grimp", reason="the import graph needs pip install 'layerdescent[test]' (import-linter brings grimp)")
    graph = grimp.build_graph("layerdescent", exclude_type_checking_imports=True)
    modules = sorted(m for m in graph.modules if m.startswith("layerdescent"))
    state: dict[str, str] = {}  # "open" while on the path being walked, "done" once every module below it was

    def walk(module: str, path: list[str]) -> list[str] | None:
        state[module] = "open"
        for imported in sorted(graph.find_modules_directly_imported_by(module)):
            if not imported.startswith("layerdescent"):
                continue
            if state.get(imported) == "open":
                return [*path, module, imported]
            if imported not in state and (cycle := walk(imported, [*path, module])):
                return cycle
        state[module] = "done"
        return None

    cycles = [cycle for module in modules if module not in state and (cycle := walk(module, []))]
    assert not cycles, f"an import cycle: {' -> '.join(cycles[0])}"


def test_the_tests_mirror_the_packages_and_share_helpers_only_through_helpers_and_conftest():
    tests = Path(__file__).parent
    for path in tests.rglob("test_*.py"):
        imported = [line for line in path.read_text().splitlines() if line.strip().startswith(("from test_", "import test_"))]
        assert not imported, (
            f"{path.relative_to(tests)} imports another test module ({imported[0].strip()}): move what it shares to tests/helpers.py"
        )
    layers = {p.name for p in (ROOT / "src" / "layerdescent").iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert layers <= {p.name for p in tests.iterdir() if p.is_dir()}, "every layer of the package has a folder of tests"
