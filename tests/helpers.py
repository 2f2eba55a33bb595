"""What many test modules share: a config file from a table, the CLI run in-process, a one-line error asserted, a benchmark script run."""

from __future__ import annotations

import contextlib
import io
import json
import re
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import tomli_w
from conftest import SMALL_LISTA_TASK

from layerdescent.cli import main

TASK = SMALL_LISTA_TASK


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


def fake_results(label: str, solver: str, seed: int, mse0: float, mse1: float, step_time: float) -> dict:
    return {
        "schema": 1,
        "label": label,
        "task": "lista",
        "solver": solver,
        "seed": seed,
        "num_layers": 2,
        "split": "test",
        "train": {"steps": 20, "epochs": 1, "step_time_median": step_time},
        "constraints": {"descent": {"labels": ["l1<=l0", "l2<=l1"], "lambda": [0.1 * (seed + 1), 0.0]}},
        "gammas": [
            {
                "gamma": g,
                "layer_loss": [2.0 * mse, 1.5 * mse, mse],
                "descent_rate": [0.9, 0.5 + 0.1 * seed],
                "metrics": {"mse": mse, "snr_db": 10.0 - mse},
                "samples": 100,
            }
            for g, mse in ((0.0, mse0), (1.0, mse1))
        ],
    }


def run_benchmark_script(name: str, *args: str) -> subprocess.CompletedProcess:
    """benchmarks/NAME run with ``args`` as a user would, its output captured."""
    script = Path(__file__).parents[1] / "benchmarks" / name
    return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True)


def assert_script_remakes(tmp_path: Path, committed: Path, name: str, *args: str) -> None:
    """benchmarks/NAME ``args`` --out a fresh file writes ``committed`` again, all but its third line (the command, naming the --out)."""
    out = tmp_path / committed.name
    run_benchmark_script(name, *args, "--out", str(out)).check_returncode()
    made, kept = out.read_text().splitlines(), committed.read_text().splitlines()
    assert made[:2] == kept[:2] and made[3:] == kept[3:], f"benchmarks/{name} no longer makes {committed}"


REPO = Path(__file__).parents[1]


TEXT = {
    "task": {"name": "text-classification", "model_path": "tiny", "dataset": "synthetic", "synthetic_size": 200, "max_length": 16},
    "train": {"epochs": 1, "batch_size": 32, "lr": 1e-3, "progress": False, "log_every": 2, "threads": 1, "train_gamma": 0.5},
    "solver": {"name": "primal-dual", "dual_lr": 1.0},
    "constraints": [{"kind": "descent", "alpha": 0.05}],
    "eval": {"gammas": [0.0, 1.0], "batch_size": 64},
}


# Runs the config in a fresh interpreter; with MODE it SIGKILLs itself at a chosen moment.
RUNNER = textwrap.dedent(
    """
    import json, os, signal, sys
    import layerdescent as ld
    import layerdescent.run.checkpoint as checkpoint
    from layerdescent.run.trainer import Trainer

    config, out, mode, n = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
    calls = {"step": 0, "save": 0}

    def die():
        os.kill(os.getpid(), signal.SIGKILL)

    if mode == "step":
        original_step = Trainer.step
        def step(self, *args, **kwargs):
            calls["step"] += 1
            if calls["step"] == n:
                die()
            return original_step(self, *args, **kwargs)
        Trainer.step = step
    elif mode == "checkpoint-write":
        original_save = checkpoint.torch.save
        def save(obj, handle):
            calls["save"] += 1
            if calls["save"] == n:
                handle.write(b"half a checkpoint")
                handle.flush()
                die()
            return original_save(obj, handle)
        checkpoint.torch.save = save
    ld.train(ld.config_from_dict(config), out, resume=mode == "resume")
    """
)


def docs_block(marker: str, page: Path = REPO / "docs" / "plugins.md", lang: str = "python") -> str:
    """The code block that follows ``<!-- marker -->`` on a docs page (the plugin guide by default)."""
    return re.search(rf"<!-- {marker} -->\n```{lang}\n(.*?)```", page.read_text(), re.S).group(1)


def assert_defaults_unless_marked(block: str) -> None:
    """Every key of a TOML example is at its default, unless its line (or its table's line) says `not the default`."""
    from layerdescent.run.config_file import tomllib
    from layerdescent.run.config_keys import defaults_toml

    table = tomllib.loads(block)
    defaults = tomllib.loads(defaults_toml(table["task"]["name"], table.get("solver", {}).get("name", "primal-dual")))
    section, marked_table = None, False
    for line in block.splitlines():
        head = re.match(r"^\[+([a-z_]+)\]+", line)
        if head:
            section, marked_table = head.group(1), "not the default" in line
            continue
        key = re.match(r"^([a-z_]+) = ", line)
        if not key or marked_table or "not the default" in line:
            continue
        name = key.group(1)
        value = table[section][name] if section else table[name]
        default = defaults[section].get(name) if section else defaults[name]
        assert value == default, f"{section}.{name} = {value!r} is not the default {default!r}: say `not the default` on its line"


def interrupt_at_step(monkeypatch, step: int) -> Callable[[], None]:
    """Make the trainer stop with a Ctrl-C at its ``step``-th step from now (counting every run's steps); the returned call undoes it."""
    from layerdescent.run.trainer import Trainer

    original, calls = Trainer.step, []

    def interrupted(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == step:
            raise KeyboardInterrupt
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Trainer, "step", interrupted)
    return lambda: monkeypatch.setattr(Trainer, "step", original)


# mse at gamma 1 per seed: primal-dual beats erm clearly in every seed, and ties penalty
AT_GAMMA_1 = {"erm": (0.50, 0.52, 0.51), "penalty": (0.300, 0.321, 0.309), "primal-dual": (0.301, 0.320, 0.310)}


def write_run(root: Path, label: str, solver: str, seed: int, mse0: float, mse1: float, code: str | None = None, task: str = "") -> None:
    run = root / label / f"seed-{seed}"
    run.mkdir(parents=True)
    (run / "config.toml").write_text(f'seed = {seed}\n[task]\nname = "lista"\n{task}[solver]\nname = "{solver}"\n')
    result = fake_results(label, solver, seed, mse0, mse1, 0.002)
    for g in result["gammas"]:
        g["layer_loss"] = [1.0, 0.8, 0.6]
    if code:
        result["code"] = {"version": "0.1.0", "commit": code, "dirty": False}
    (run / "results.json").write_text(json.dumps(result))


def three_solvers(root: Path) -> Path:
    """A lista bench where primal-dual beats erm at gamma 1 in every seed but not penalty; all tie in distribution."""
    for solver, values in AT_GAMMA_1.items():
        for seed, mse1 in enumerate(values):
            write_run(root, solver, solver, seed, 0.1 + 0.01 * seed, mse1)
    return root


GAMMAS = (0.0, 0.5, 1.0, 2.0)


def write_gamma_runs(root, values: dict[str, list[list[float]]], layers: dict[str, list[list[float]]] | None = None):
    """Runs of label -> per seed, the mse at each of GAMMAS; ``layers`` label -> per seed, the per-layer loss at every gamma."""
    for label, seeds in values.items():
        for seed, mse in enumerate(seeds):
            run = root / label / f"seed-{seed}"
            run.mkdir(parents=True)
            (run / "config.toml").write_text(f'seed = {seed}\n[task]\nname = "lista"\n[solver]\nname = "{label}"\n')
            loss = layers[label][seed] if layers else [1.0, 0.8, 0.6]
            result = {
                "schema": 1,
                "label": label,
                "task": "lista",
                "solver": label,
                "seed": seed,
                "num_layers": len(loss) - 1,
                "split": "test",
                "train": {"steps": 20, "epochs": 1, "step_time_median": 0.002},
                "gammas": [
                    {"gamma": g, "layer_loss": loss, "descent_rate": [0.9] * (len(loss) - 1), "metrics": {"mse": m}, "samples": 100}
                    for g, m in zip(GAMMAS, mse)
                ],
            }
            (run / "results.json").write_text(json.dumps(result))
    return root
