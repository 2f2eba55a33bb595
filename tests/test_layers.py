"""The package's layers hold: each imports only the layers below it (the contracts in .importlinter)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LINT = "from importlinter.cli import lint_imports_command; lint_imports_command()"  # `lint-imports`, from this interpreter


def test_every_import_runs_down_the_layers_and_the_core_touches_no_file():
    pytest.importorskip("importlinter", reason="the layer check needs pip install 'layerdescent[test]' (import-linter)")
    proc = subprocess.run([sys.executable, "-c", LINT, "--config", str(ROOT / ".importlinter")], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "Contracts: 2 kept, 0 broken." in proc.stdout


def test_the_registry_names_its_built_in_plugins_by_module_path_and_imports_none_of_them():
    from layerdescent import registry

    source = Path(registry.__file__).read_text()
    for path in registry.DEFAULT_PLUGINS:
        assert f"from {path}" not in source.split("if TYPE_CHECKING:")[0] and f"import {path}" not in source
    loaded = registry.Registry(entry_points=False)
    assert {info.name for info in loaded.plugins.values()} == set(registry.DEFAULT_PLUGINS)
    assert all(info.status == "loaded" for info in loaded.plugins.values())
