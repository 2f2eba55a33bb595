"""What a default run imports is what a plain `pip install layerdescent` installs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from conftest import lista_task
from helpers import config_file

ROOT = Path(__file__).resolve().parents[1]

# Runs the CLI's run path in a fresh interpreter and names, for every top-level module first imported
# by layerdescent's own code (the package or a bundled plugin), the distributions that provide it.
PROBE = textwrap.dedent(
    """
    import json, os, sys
    from importlib import metadata

    OURS = tuple(os.path.realpath(p) + os.sep for p in sys.argv[3:])
    imported = {}

    class Witness:
        def find_spec(self, name, path=None, target=None):
            if "." not in name and name not in sys.modules and name not in sys.stdlib_module_names:
                frame = sys._getframe(1)
                while frame and ("importlib" in frame.f_code.co_filename or frame.f_code.co_filename.startswith("<")):
                    frame = frame.f_back  # past the import machinery, to the module whose import statement ran
                if frame and os.path.realpath(frame.f_code.co_filename).startswith(OURS):
                    imported.setdefault(name, frame.f_code.co_filename)
            return None

    sys.meta_path.insert(0, Witness())
    from layerdescent.cli import main

    status = main(["run", sys.argv[1], "--out", sys.argv[2]])
    owners = metadata.packages_distributions()
    print(json.dumps({"status": status, "imported": {m: [owners.get(m, []), f] for m, f in imported.items()}}))
    """
)


def _canon(name: str) -> str:
    return name.replace("_", "-").replace(".", "-").lower()


def _core_closure() -> set[str]:
    """The core requirements in pyproject.toml and, through the installed metadata, everything they require in turn."""
    from importlib import metadata

    from packaging.requirements import Requirement

    from layerdescent.run.config_file import read_toml

    declared = read_toml(ROOT / "pyproject.toml")["project"]["dependencies"]
    closure: set[str] = set()
    todo = [Requirement(text) for text in declared]
    while todo:
        req = todo.pop()
        if _canon(req.name) in closure or (req.marker is not None and not req.marker.evaluate({"extra": ""})):
            continue
        closure.add(_canon(req.name))
        try:
            todo.extend(Requirement(text) for text in metadata.requires(req.name) or [])
        except metadata.PackageNotFoundError:
            pass
    return closure


def test_every_module_a_default_run_imports_is_in_the_core_requirements(tmp_path):
    config = config_file(
        tmp_path,
        {
            "task": lista_task(layers=2, code_dim=8, measure_dim=6, train_size=32, validation_size=8, test_size=8),
            "train": {"epochs": 1, "batch_size": 16, "progress": False, "threads": 1},
            "solver": {"name": "primal-dual"},
            "constraints": [{"kind": "descent", "alpha": 0.05, "reference": "detached"}],
            "eval": {"gammas": [0.0]},
        },
    )
    ours = [str(ROOT / "src" / "layerdescent"), *map(str, (ROOT / "plugins").glob("layerdescent_*"))]
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(config), str(tmp_path / "run"), *ours],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    probe = json.loads(done.stdout.splitlines()[-1])
    assert probe["status"] == 0
    assert "torch" in probe["imported"]  # the witness saw the package's own imports
    closure = _core_closure() | {"layerdescent"}  # the bundled plugins are the package's own
    missing = {
        module: where for module, (owners, where) in probe["imported"].items() if owners and not {_canon(d) for d in owners} & closure
    }
    assert missing == {}, f"imported on the run path but not brought by the core requirements: {missing}"
