"""The docs' examples work exactly as written, every code block in them runs or is checked, and they document every hook."""

from __future__ import annotations

import re
import types
from pathlib import Path

import pytest
import torch
from conftest import SMALL_LISTA_TASK
from helpers import assert_defaults_unless_marked, docs_block

import layerdescent as ld
from layerdescent.registry import Registry

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PLUGINS = DOCS / "plugins.md"


# A lista small enough to train one epoch in a test, for the plugin examples that must train.
SMALL_LISTA = {"task": SMALL_LISTA_TASK, "train": {"epochs": 1, "progress": False}}


def _plugin_module(name: str, marker: str, monkeypatch) -> types.ModuleType:
    """The plugins page's block after ``<!-- marker -->``, executed as module ``name`` (dataclasses look their module up)."""
    import sys

    module = types.ModuleType(name)
    monkeypatch.setitem(sys.modules, name, module)
    exec(compile(docs_block(marker), f"docs/plugins.md:{name}.py", "exec"), module.__dict__)
    return module


def _plugin_example() -> types.ModuleType:
    module = types.ModuleType("my_plugin")
    exec(compile(docs_block("plugin-example"), "docs/plugins.md:my_plugin.py", "exec"), module.__dict__)
    return module


def test_docs_plugin_example_registers_and_trains_under_descent_constraints(tmp_path):
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


def test_docs_annotated_config_is_a_valid_config_with_every_section():
    from layerdescent.run.config_file import tomllib

    block = docs_block("annotated-config", DOCS / "configuration.md", "toml")
    config = ld.config_from_dict(tomllib.loads(block))
    assert config.solver.name == "primal-dual" and config.constraints[0].reference == "detached"
    assert config.train.on_nonfinite == "stop" and config.eval.gammas == (0.0, 0.1, 0.3, 0.5, 1.0)


def test_docs_constraint_example_registers_checks_its_options_and_trains(tmp_path, monkeypatch):
    module = _plugin_module("my_constraint", "constraint-example", monkeypatch)
    registry = Registry(extra_plugins=[("gap", module)])
    table = SMALL_LISTA
    with pytest.raises(ld.ConfigError, match=r"^constraints\[0\]: ratio must be in \(0, 1\], got 2.0$"):
        ld.config_from_dict({**table, "constraints": [{"kind": "gap", "ratio": 2.0}]}, registry)
    with pytest.raises(ld.ConfigError, match=r"constraints\[0\].ratio must be a number"):
        ld.config_from_dict({**table, "constraints": [{"kind": "gap", "ratio": "half"}]}, registry)
    config = ld.config_from_dict({**table, "constraints": [{"kind": "gap", "ratio": 0.5}]}, registry)
    results = ld.train(config, tmp_path / "run", registry=registry)
    assert results["constraints"]["gap"]["labels"] == ["l3<=0.5*l0"]


def test_docs_loop_example_trains_under_descent_constraints_exactly_as_written():
    namespace: dict = {}
    exec(compile(docs_block("loop-example", DOCS / "own-loop.md"), "docs/own-loop.md:loop", "exec"), namespace)
    update, losses = namespace["update"], namespace["losses"]
    means = torch.stack(losses, dim=1).mean(0).detach()
    assert means[-1] < means[0] * 0.5  # the last layer improved on the input's estimate
    assert update.record()["lambda"]["descent"] and all(v >= 0 for v in update.multipliers()["descent"].tolist())
    assert namespace["step"] == 299


def test_docs_solver_example_registers_and_runs_from_toml_alone(tmp_path, monkeypatch):
    module = _plugin_module("my_solver", "solver-example", monkeypatch)
    registry = Registry(extra_plugins=[("ramp", module)])
    table = {**SMALL_LISTA, "solver": {"name": "ramp", "steps": 2}}
    results = ld.train(ld.config_from_dict(table, registry), tmp_path / "run", registry=registry)
    assert results["solver"] == "ramp"
    table["solver"]["steps"] = 0
    with pytest.raises(ld.ConfigError, match=r"solver.steps must be >= 1, got 0"):
        ld.config_from_dict(table, registry)


def _installed(tmp_path: Path, module: str, marker: str) -> dict[str, str]:
    """The environment of a process that sees the docs' ``marker`` block installed as ``module`` under an entry point."""
    import os

    site = tmp_path / "site"  # what `pip install .` of the plugin's package leaves on sys.path
    dist = site / f"{module}-0.1.0.dist-info"
    dist.mkdir(parents=True)
    (site / f"{module}.py").write_text(docs_block(marker))
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module.replace('_', '-')}\nVersion: 0.1.0\n")
    (dist / "entry_points.txt").write_text(f"[layerdescent]\nextensions = {module}\n")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}


def _layerdescent(env: dict[str, str], *argv, **popen):
    """The `layerdescent` command in a process of its own: finished, or (``popen``) running."""
    import subprocess
    import sys

    command = [sys.executable, "-m", "layerdescent.cli", *map(str, argv)]
    if popen:
        return subprocess.Popen(command, env=env, **popen)
    return subprocess.run(command, capture_output=True, text=True, env=env, check=False)


def _bench_file(tmp_path: Path, **train) -> Path:
    import copy

    import tomli_w
    from conftest import TINY

    table = copy.deepcopy(TINY)
    table["train"].update({"epochs": 1, **train})
    table["bench"] = {"seeds": [0], "variants": {"erm": {"solver": {"name": "erm"}}, "primal-dual": {}}}
    bench = tmp_path / "bench.toml"
    bench.write_text(tomli_w.dumps(table))
    return bench


def _same_runs(out: Path, reference: Path) -> None:
    """Each run of ``out`` has the results.json of ``reference``'s, timings aside, and its CSV rows are its metrics log."""
    import json

    from layerdescent.run.tracking import STEP_TIME, result_labels, scalars

    for variant in ("erm", "primal-dual"):
        ours, local = (json.loads((root / variant / "seed-0" / "results.json").read_text()) for root in (out, reference))
        for data in (ours, local):
            data.pop("eval_seconds"), data["train"].pop("step_time_median")
        assert ours == local
        run_dir = out / variant / "seed-0"
        rows = [
            (int(step), name, float(value))
            for step, name, value in (line.split(",") for line in (run_dir / "values.csv").read_text().splitlines())
        ]
        logged = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        labels = result_labels(ours)
        want = [(record["step"], name, value) for record in logged for name, value in scalars(record, labels).items()]
        assert want and sorted(row for row in rows if row[1] != STEP_TIME) == sorted(want)  # each once: none lost, none twice


def test_docs_executor_and_tracker_plugin_is_chosen_by_name_with_its_options_once_installed(tmp_path):
    from layerdescent.bench.runner import run_bench

    env = _installed(tmp_path, "my_extensions", "executor-tracker-example")
    listed = _layerdescent(env, "list").stdout.splitlines()
    assert any(line.split()[:1] == ["subprocess"] and line.endswith("[plugin extensions]") for line in listed), listed
    assert any(line.split()[:1] == ["csv"] and line.endswith("[plugin extensions]") for line in listed), listed
    assert "    nice = 0" in listed and '    file = "values.csv"' in listed  # their options, with the defaults
    assert any(
        line.split()[:4] == ["extensions", "loaded", "my-extensions", "0.1.0"] for line in _layerdescent(env, "plugins").stdout.splitlines()
    )
    bench = _bench_file(tmp_path)
    flags = ("--executor", "subprocess", "--set", "bench.executor.nice=1", "--set", "train.trackers.csv.file='values.csv'")
    refused = _layerdescent(env, "bench", bench, "--out", tmp_path / "refused", *flags[:2], "--set", "bench.executor.nice=40")
    assert refused.returncode == 2 and refused.stderr == "layerdescent: error: bench.executor.nice must be in 0..19, got 40\n"
    proc = _layerdescent(env, "bench", bench, "--out", tmp_path / "ours", *flags)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert sorted(line.split(" [")[0] for line in lines[:2]) == ["erm seed 0: trained", "primal-dual seed 0: trained"], lines
    assert lines[1].endswith("[subprocess: 2 finished, 0 running, 0 failed, 0 waiting]"), lines
    run_bench(bench, tmp_path / "local")  # the same runs on the built-in local executor, no tracker
    _same_runs(tmp_path / "ours", tmp_path / "local")


def test_a_bench_interrupted_through_a_plugin_executor_stops_its_runs_and_resumes_to_the_same_numbers(tmp_path):
    import signal
    import subprocess
    import time

    from layerdescent.bench.runner import run_bench

    env = _installed(tmp_path, "my_extensions", "executor-tracker-example")
    bench = _bench_file(tmp_path, epochs=40, checkpoint_every=5)
    flags = ("--executor", "subprocess", "--set", "bench.executor.workers=1", "--set", "train.trackers.csv.file='values.csv'")
    out = tmp_path / "ours"
    bench_process = _layerdescent(env, "bench", bench, "--out", out, *flags, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    started = time.monotonic()
    while not (out / "erm" / "seed-0" / "checkpoint.pt").exists():  # erm is training, past a checkpoint
        assert bench_process.poll() is None and time.monotonic() - started < 120, bench_process.communicate()
        time.sleep(0.05)
    bench_process.send_signal(signal.SIGINT)
    _, stderr = bench_process.communicate(timeout=30)  # close() stopped the run within seconds
    assert bench_process.returncode == 130 and "interrupted; the same command again continues" in stderr, stderr
    assert not (out / "erm" / "seed-0" / "results.json").exists()
    run_pids = {int(p.read_text().strip() or 0) for p in out.glob("*/seed-0/.layerdescent.lock")}
    assert not any(Path(f"/proc/{pid}").exists() for pid in run_pids if pid), "a run still trains after the bench stopped"
    proc = _layerdescent(env, "bench", bench, "--out", out, *flags)
    assert proc.returncode == 0, proc.stderr
    assert "erm seed 0: resumed" in proc.stdout
    run_bench(bench, tmp_path / "local")
    _same_runs(out, tmp_path / "local")


def test_docs_command_plugin_adds_a_subcommand(tmp_path):
    env = _installed(tmp_path, "my_commands", "command-example")
    (tmp_path / "bench" / "erm" / "seed-0").mkdir(parents=True)
    (tmp_path / "bench" / "erm" / "seed-0" / "results.json").write_text("{}")
    assert "count the finished runs of a bench" in _layerdescent(env, "--help").stdout
    proc = _layerdescent(env, "count", tmp_path / "bench")
    assert (proc.returncode, proc.stdout) == (0, "1 finished runs\n"), proc.stderr
    assert any(
        line.split()[:1] == ["count"] and line.endswith("[plugin extensions]") for line in _layerdescent(env, "list").stdout.splitlines()
    )


def test_every_hook_is_documented_in_the_plugin_guide_and_exercised_by_a_test():
    from layerdescent import hookspecs

    hooks = [name for name in dir(hookspecs) if name.startswith("register_")]
    text = PLUGINS.read_text()
    tests = "".join(p.read_text() for p in Path(__file__).parent.rglob("test_*.py") if p.name != Path(__file__).name)
    assert len(hooks) >= 4
    for hook in hooks:
        assert f"`{hook}(register)`" in text or f"def {hook}(register)" in text, f"{hook} is not documented in docs/plugins.md"
        assert f"def {hook}(" in tests, f"no test implements {hook}"


def test_docs_bench_judging_example_is_a_valid_bench_table():
    from layerdescent.analysis.endpoints_file import parse_spec
    from layerdescent.run.config_file import tomllib

    block = docs_block("bench-judging-example", DOCS / "benchmarks.md", "toml")
    bench = tomllib.loads(block)["bench"]
    spec = parse_spec(bench, list(bench["variants"]))
    assert spec.baselines == ("erm", "penalty") and spec.tuning == {"alpha=0.2": 12}
    assert spec.primary.variants == ("primal-dual",) and spec.primary.adopted == ("alpha=0.2",) and spec.primary.gammas == (0.0, 1.6, 3.2)


# --- every code block of the docs ----------------------------------------------------------------

from codeblocks import PAGES, blocks, check_shell, check_text, check_toml, in_tmp, run_python  # noqa: E402

# docs/solvers.md's python blocks build on each other: tests/test_solver_docs.py runs them in order, in one module.
IN_ORDER = DOCS / "solvers.md"
DOC_BLOCKS = [b for page in PAGES if page.parent != ROOT for b in blocks(page) if not (page == IN_ORDER and b.lang == "python")]


@pytest.mark.parametrize("block", DOC_BLOCKS, ids=lambda b: b.where)
def test_every_docs_code_block_runs_or_is_checked(block, tmp_path):
    """Python runs as written; TOML is validated as a config, bench or pyproject; JSON and YAML parse; shell commands parse; a text diagram names what exists."""
    assert block.lang in ("python", "toml", "json", "yaml", "bash", "text"), (
        f"{block.where}: a fence needs one of these languages, not {block.lang!r}"
    )
    if block.lang == "python":
        with in_tmp(tmp_path):
            run_python(block)
    elif block.lang == "toml":
        check_toml(block)
    elif block.lang == "json":
        import json

        json.loads(block.code)
    elif block.lang == "yaml":  # a LightningCLI config: tests/integrations/test_lightning.py trains it
        import yaml

        assert isinstance(yaml.safe_load(block.code), dict), f"{block.where}: a YAML block is a mapping"
    elif block.lang == "bash":
        check_shell(block)
    elif block.lang == "text":
        check_text(block)


def test_the_docs_have_code_blocks_of_every_checked_language():
    assert {b.lang for b in DOC_BLOCKS} == {"python", "toml", "json", "yaml", "bash", "text"}


def test_docs_annotated_config_differs_from_the_defaults_only_where_it_says_so():
    assert_defaults_unless_marked(docs_block("annotated-config", DOCS / "configuration.md", "toml"))


def test_public_surface_table_names_exactly_the_public_names():
    table = re.search(r"<!-- public-names -->\n(.*?)\n\n", PLUGINS.read_text(), re.S).group(1)
    documented = set(re.findall(r"`([A-Za-z_]+)`", "\n".join(line.split("|")[1] for line in table.splitlines()[2:])))
    assert documented == set(ld.__all__)


def test_the_api_reference_documents_every_public_name():
    import importlib

    text = (DOCS / "reference" / "api.md").read_text()
    documented = set(re.findall(r"^::: ([\w.]+)$", text, re.M))
    eager = ("layerdescent.errors", "layerdescent.hookspecs", "layerdescent.optional")  # imported by the package itself
    for name in set(ld.__all__) - {"__version__"}:
        module = ld._LAZY.get(name) or next(m for m in eager if hasattr(importlib.import_module(m), name))
        assert f"{module}.{name}" in documented or module in documented, f"{name} ({module}) is not in docs/reference/api.md"
        assert getattr(importlib.import_module(module), name) is getattr(ld, name)


def test_the_plain_api_page_is_what_the_code_generates():
    pytest.importorskip("lightning", reason="the page lists DescentModule and DescentCallback (pip install 'layerdescent[lightning]')")
    pytest.importorskip("transformers", reason="the page lists DescentTrainer (pip install 'layerdescent[hf]')")
    from layerdescent.cli.api import api_page

    page = api_page()
    assert (DOCS / "reference" / "api-plain.md").read_text() == page, (
        "docs/reference/api-plain.md is stale: run `layerdescent api > docs/reference/api-plain.md`"
    )
    assert {m for m in re.findall(r"^## `(\w+)`$", page, re.M)} == set(ld.__all__) - {"__version__"}
    assert "- `multipliers() -> dict[str, torch.Tensor]`: Current lambda of each constraint." in page  # a method, in one line


def test_module_map_names_every_module_of_the_package():
    table = re.search(r"<!-- module-map -->\n(.*?)\n\n", (DOCS / "contributing.md").read_text(), re.S).group(1)
    mapped = set(re.findall(r"`([a-z_/]+\.py)`", table))
    package = ROOT / "src" / "layerdescent"
    modules = {str(p.relative_to(package)) for p in package.rglob("*.py")}
    assert mapped == modules, f"missing: {sorted(modules - mapped)}, gone: {sorted(mapped - modules)}"


def test_mkdocs_nav_lists_every_page_and_a_built_site_is_not_committed():
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    assert {p for p in pages if p not in nav} == set()
    assert "site/" in (ROOT / ".gitignore").read_text().splitlines()
