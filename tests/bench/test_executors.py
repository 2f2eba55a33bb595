"""A bench trains the same runs whichever executor runs them: the local pool, Ray, or submitit's jobs."""

from __future__ import annotations

import concurrent.futures
import importlib.util
import json
import os
from pathlib import Path

import pytest
from helpers import RUN, cli, config_file, interrupt_at_step, with_

import layerdescent as ld
from layerdescent.bench.executors import ExecutorChoice, ExecutorOptions, RunsFailed, SlurmOptions
from layerdescent.bench.executors import base as executors
from layerdescent.bench.runner import run_bench
from layerdescent.errors import ConfigError
from layerdescent.registry import Registry

# checkpoints along the way, so a killed bench has something to resume
BENCH = {
    **with_(with_(RUN, "train.epochs", 3), "train.checkpoint_every", 1),
    "bench": {"seeds": [0], "variants": {"erm": {"solver": {"name": "erm"}}, "primal-dual": {}}},
}
VARIANTS = ("erm", "primal-dual")
LOCAL_JOBS = {"executor": {"cluster": "local", "time": 10}}  # slurm's keys, dropped for the local executor


def results(out: Path) -> dict[str, dict]:
    """Each run's results.json without its timings, the fields that differ between identical runs."""
    found = {}
    for variant in VARIANTS:
        data = json.loads((out / variant / "seed-0" / "results.json").read_text())
        data["train"].pop("step_time_median")
        data.pop("eval_seconds")
        found[variant] = data
    return found


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[Path, dict]:
    """The bench file and what the local executor makes of it."""
    tmp = tmp_path_factory.mktemp("local")
    path = config_file(tmp, {**BENCH, "bench": {**BENCH["bench"], **LOCAL_JOBS}}, "bench.toml")
    run_bench(path, tmp / "out")
    return path, results(tmp / "out")


@pytest.fixture(scope="module")
def ray_instance():
    """One local Ray instance for the module: starting one takes seconds."""
    ray = pytest.importorskip("ray", reason="the ray executor needs pip install 'layerdescent[ray]' (about 240 MB)")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def test_ray_trains_the_same_runs_as_the_local_executor(reference, ray_instance, tmp_path):
    path, expected = reference
    seen = []
    summary = run_bench(
        path, tmp_path / "out", executor=ExecutorChoice("ray", ExecutorOptions(workers=2)), on_run=lambda run, status: seen.append(status)
    )
    assert results(tmp_path / "out") == expected
    assert summary.exists() and ray_instance.is_initialized()  # the bench leaves an instance it did not start
    assert seen[-1].endswith("[ray: 2 finished, 0 running, 0 failed, 0 waiting]")


def test_a_failed_ray_run_is_named_with_its_log_and_the_others_finish(reference, ray_instance, tmp_path):
    table = json.loads(json.dumps(BENCH))
    table["bench"]["variants"]["primal-dual"] = {"solver": {"dual_lr": 1e6, "max_multiplier": 1e-3}}  # diverges at once
    bench = config_file(tmp_path, table, "bench.toml")
    with pytest.raises(RunsFailed) as failed:
        run_bench(bench, tmp_path / "out", executor=ExecutorChoice("ray"))
    lines = str(failed.value).splitlines()
    assert lines[0].startswith(f"1 of 2 runs failed; {tmp_path / 'out' / 'summary.md'} covers the runs that finished")
    assert lines[1].startswith("primal-dual seed 0: DivergenceError:")
    assert any(line.startswith("  | ") and "DivergenceError" in line for line in lines[2:])
    assert (tmp_path / "out" / "erm" / "seed-0" / "results.json").exists()


def test_an_interrupted_bench_resumes_through_submitted_jobs_to_the_same_results(reference, tmp_path, monkeypatch):
    pytest.importorskip("submitit", reason="the slurm executor needs pip install 'layerdescent[slurm]'")
    path, expected = reference
    out = tmp_path / "out"
    restore = interrupt_at_step(monkeypatch, 4)  # erm is halfway, with a checkpoint; primal-dual has not started
    with pytest.raises(KeyboardInterrupt):
        run_bench(path, out)
    restore()
    assert (out / "erm" / "seed-0" / "checkpoint.pt").exists() and not (out / "primal-dual" / "seed-0").exists()
    # submitted and left, then collected by a second call: the bench a SLURM user runs from a login node
    assert run_bench(path, out, executor=ExecutorChoice("slurm", SlurmOptions(cluster="local", wait=False))) is None
    jobs = json.loads((out / ".submitit" / "jobs.json").read_text())
    assert jobs.keys() == {"erm/seed-0", "primal-dual/seed-0"}
    seen = []
    summary = run_bench(
        path, out, executor=ExecutorChoice("slurm", SlurmOptions(cluster="local")), on_run=lambda run, status: seen.append(status)
    )
    assert summary.exists() and results(out) == expected
    assert sorted(s.split(" [")[0] for s in seen) == ["resumed", "trained"]
    assert json.loads((out / ".submitit" / "jobs.json").read_text()) == jobs  # collected, not submitted again


def test_a_worker_that_does_not_see_the_output_directory_refuses_to_train(reference, tmp_path):
    path, _ = reference
    from layerdescent.bench.plan import plan

    (run,) = [r for r in plan(path, tmp_path / "out") if r.variant == "erm"]
    with pytest.raises(ConfigError, match="put --out on a filesystem every worker sees"):
        executors.execute(run, str(tmp_path / "out"), "not-the-token", 1, {})
    assert not (tmp_path / "out" / "erm").exists()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--executor", "local", "--no-wait"], "--no-wait is for --executor slurm"),
        (["--executor", "ray", "--set", "bench.executor.cpus_per_run=0"], "bench.executor.cpus_per_run must be in 1..4096, got 0"),
        (["--executor", "slurm", "--set", "bench.executor.partition=1"], "bench.executor.partition must be a string, got 1"),
        (["--set", "bench.executor.adress='h:1'"], "unknown key bench.executor.adress; did you mean 'address'? (executor 'local' accepts:"),
        (["--workers", "0"], "--workers (bench.executor.workers) must be in 1..4096, got 0"),
    ],
)
def test_executor_options_that_cannot_work_are_one_line(reference, tmp_path, argv, message):
    path, _ = reference
    code, lines = cli("bench", str(path), "--out", str(tmp_path / "out"), *argv)
    assert code == 2 and len(lines) == 1 and message in lines[0], lines


def test_a_misspelled_slurm_setting_gets_the_closest_name(tmp_path):
    bench = config_file(tmp_path, {**BENCH, "bench": {**BENCH["bench"], "executor": {"name": "slurm", "partion": "gpu"}}}, "bench.toml")
    code, lines = cli("bench", str(bench), "--out", str(tmp_path / "out"))
    assert code == 2 and len(lines) == 1 and "bench.executor.partion" in lines[0] and "'partition'" in lines[0], lines


def test_a_bench_file_with_the_old_slurm_table_is_told_where_its_settings_went(tmp_path):
    bench = config_file(tmp_path, {**BENCH, "bench": {**BENCH["bench"], "slurm": {"partition": "gpu"}}}, "bench.toml")
    code, lines = cli("bench", str(bench), "--out", str(tmp_path / "out"))
    assert (code, lines) == (
        2,
        ['layerdescent: error: bench.slurm is now [bench.executor]: name = "slurm" and the same keys (partition, time, mem_gb, ...)'],
    )


def test_the_bench_file_chooses_its_executor_and_options_and_the_flag_overrides_the_name(tmp_path):
    from layerdescent.bench.runner import executor_choice

    table = {"name": "slurm", "partition": "gpu", "time": 120, "address": "head:6379"}
    bench = config_file(tmp_path, {**BENCH, "bench": {**BENCH["bench"], "executor": table}}, "bench.toml")
    assert executor_choice(bench) == ExecutorChoice("slurm", SlurmOptions(partition="gpu", time=120))  # ray's address is dropped
    ray = executor_choice(bench, ["bench.executor.gpus_per_run=1"], "ray", workers=3)
    assert ray.name == "ray" and (ray.options.address, ray.options.gpus_per_run, ray.options.workers) == ("head:6379", 1.0, 3)


def test_slurm_without_a_scheduler_says_how_to_try_it_locally(tmp_path, monkeypatch):
    pytest.importorskip("submitit", reason="the slurm executor needs pip install 'layerdescent[slurm]'")
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch on it
    code, lines = cli("bench", str(config_file(tmp_path, BENCH, "bench.toml")), "--out", str(tmp_path / "out"), "--executor", "slurm")
    assert code == 2 and len(lines) == 1 and "no sbatch here" in lines[0] and 'cluster = "local"' in lines[0], lines
    assert not os.path.exists(tmp_path / "out" / "erm")


class Processes(ld.Executor):
    """Every run a job of a process pool, the shape of a Dask or any futures executor."""

    name = "processes"

    def start(self):
        self.pool = concurrent.futures.ProcessPoolExecutor(self.options.workers or 2)
        self.slots = self.options.workers or 2

    def submit(self, run):
        return self.pool.submit(self.job, run)  # the job crosses to another process, as it would to a cluster

    def ready(self, handles):
        done, _ = concurrent.futures.wait(handles, timeout=executors.POLL_SECONDS, return_when=concurrent.futures.FIRST_COMPLETED)
        return list(done)

    def outcome(self, future):
        return future.result()

    def close(self):
        self.pool.shutdown()


class ProcessesPlugin:
    @ld.hookimpl
    def register_executors(self, register):
        register(Processes)


def test_a_plugin_executor_is_chosen_by_name_and_trains_the_same_runs_as_the_local_executor(reference, tmp_path):
    path, expected = reference
    registry, seen = Registry(extra_plugins=[("processes", ProcessesPlugin())]), []
    assert (
        registry.owner[("Executor", "processes")] == "processes" and registry.owner[("Executor", "local")] == "layerdescent.bench.executors"
    )
    summary = run_bench(
        path,
        tmp_path / "out",
        registry=registry,
        executor=ExecutorChoice("processes", ExecutorOptions(workers=2)),
        on_run=lambda run, status: seen.append(status),
    )
    assert results(tmp_path / "out") == expected and summary.exists()
    assert sorted(s.split(" [")[0] for s in seen) == ["trained", "trained"]
    assert seen[-1].endswith("[processes: 2 finished, 0 running, 0 failed, 0 waiting]")
    assert (tmp_path / "out" / "logs" / "erm" / "seed-0.log").exists()  # each job's output went to its log


def test_an_unknown_executor_is_one_line_naming_the_registered_ones(reference, tmp_path):
    path, _ = reference
    code, lines = cli("bench", str(path), "--out", str(tmp_path / "out"), "--executor", "rey")
    assert code == 2 and len(lines) == 1, lines
    assert "--executor 'rey' is not a registered executor; did you mean 'ray'? (known: local, ray, slurm;" in lines[0]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name, module", [("ray", "ray"), ("slurm", "submitit")])
def test_a_missing_executor_package_is_one_line_naming_its_extra(reference, tmp_path, monkeypatch, name, module):
    path, _ = reference
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda wanted, *a: None if wanted == module else real(wanted, *a))
    code, lines = cli("bench", str(path), "--out", str(tmp_path / "out"), "--executor", name)
    assert (code, lines) == (2, [f"layerdescent: error: --executor {name} needs the {module} package: pip install 'layerdescent[{name}]'"])
    assert not (tmp_path / "out").exists()
