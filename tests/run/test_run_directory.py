"""Run directories nobody can corrupt: one process at a time, reuse only under the same config, nothing written outside --out."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import tomli_w
from helpers import RUN, assert_one_line, cli, config_file, with_

import layerdescent as ld
import layerdescent.bench.plan as plan_module
import layerdescent.bench.runner as bench_module
import layerdescent.run.trainer as trainer_module
from layerdescent.bench.plan import plan
from layerdescent.bench.runner import run_bench
from layerdescent.run import layout, lock

ROOT = Path(__file__).resolve().parents[2]
BENCH = {**RUN, "bench": {"seeds": [0], "variants": {"erm": {"solver": {"name": "erm"}}, "primal-dual": {}}}}


def files_under(path: Path) -> set[Path]:
    return {p for p in path.rglob("*")}


# --- item 1: a lock that dies with its holder -----------------------------------------------------

HOLDER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from layerdescent.run import lock
    with lock.locked(Path(sys.argv[1])):
        print("locked", flush=True)
        time.sleep(600)
    """
)


def test_a_second_process_is_refused_while_the_first_holds_the_run_directory_and_a_killed_holder_frees_it(tmp_path):
    out = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        assert_one_line(
            *cli("run", config_file(tmp_path, RUN), "--out", out), f"{out} is in use by another layerdescent process (pid {holder.pid})"
        )
        assert not (out / "metrics.jsonl").exists()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    status, lines = cli("run", config_file(tmp_path, RUN), "--out", out)  # the lock died with its holder
    assert status == 0, lines
    assert (out / "results.json").exists()


def test_a_run_holds_its_lock_while_it_trains(tmp_path, monkeypatch):
    from layerdescent.run.trainer import Trainer

    seen = {}
    real = Trainer.setup

    def setup(self):
        seen["status"], seen["lines"] = cli("run", config_file(tmp_path, RUN, "other.toml"), "--out", self.run_dir)
        return real(self)

    monkeypatch.setattr(Trainer, "setup", setup)
    ld.train(ld.config_from_dict(RUN), tmp_path / "run")
    assert_one_line(seen["status"], seen["lines"], "is in use by another layerdescent process")
    assert (tmp_path / "run" / layout.LOCK).exists()


# --- item 3: a finished run is reused only under the config it was trained with ---------------------


@pytest.fixture(scope="module")
def benched(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bench")
    path = config_file(tmp, BENCH, "bench.toml")
    status, lines = cli("bench", path, "--out", tmp / "out")
    assert status == 0, lines
    return path, tmp / "out"


def test_a_bench_under_a_changed_config_refuses_the_finished_runs_by_the_first_differing_key(tmp_path, benched):
    path, out = benched
    before = {p: p.stat().st_mtime_ns for p in out.rglob("results.json")}
    assert_one_line(
        *cli("bench", path, "--out", out, "--set", "train.lr=0.02"),
        "finished under another config, first at train.lr (recorded 0.01, asked 0.02)",
    )
    assert {p: p.stat().st_mtime_ns for p in out.rglob("results.json")} == before


def test_a_bench_with_only_another_thread_count_or_checkpoint_interval_still_counts_its_runs_done(tmp_path, benched, monkeypatch):
    path, out = benched
    monkeypatch.setattr(
        trainer_module, "train", lambda *a, **k: pytest.fail("a finished run was trained again")
    )  # what every executor trains a run with
    status, lines = cli(
        "bench", path, "--out", out, "--set", "train.threads=2", "--set", "train.progress=true", "--set", "train.checkpoint_every=7"
    )
    assert status == 0, lines


def test_evaluate_with_a_new_gamma_grid_refuses_an_output_evaluated_under_the_old_one(tmp_path, benched):
    _, out = benched
    again = tmp_path / "again"
    assert cli("evaluate", out, "--out", again, "--set", "eval.gammas=[0.0, 1.0]")[0] == 0
    assert_one_line(
        *cli("evaluate", out, "--out", again, "--set", "eval.gammas=[0.0, 2.0]"), "evaluated under another config, first at eval.gammas"
    )
    assert cli("evaluate", out, "--out", again, "--set", "eval.gammas=[0.0, 1.0]")[0] == 0  # the same grid: done


@pytest.mark.parametrize("where", ["same", "inside"])
def test_evaluate_into_its_own_directory_is_refused(benched, where):
    _, out = benched
    target = out if where == "same" else out / "again"
    assert_one_line(*cli("evaluate", out, "--out", target), "lies inside")
    assert not (out / "again").exists()


def test_committed_older_lista_results_still_count_as_done_for_their_own_bench_file(tmp_path, monkeypatch):
    copy = tmp_path / "lista"
    shutil.copytree(ROOT / "benchmarks" / "results" / "lista", copy, ignore=shutil.ignore_patterns("*.png", "*.md"))
    monkeypatch.setattr(
        trainer_module, "train", lambda *a, **k: pytest.fail("a committed run was trained again")
    )  # what every executor trains a run with
    monkeypatch.setattr(bench_module, "write_report", lambda out, **k: out / "summary.md")
    statuses = []
    run_bench(ROOT / "benchmarks" / "lista.toml", copy, on_run=lambda run, status: statuses.append(status))
    assert statuses == ["done"] * 18


# --- item 4: nothing lands outside --out -------------------------------------------------------


@pytest.mark.parametrize("variant", ["../../../escaped", "/tmp/escaped-absolute", "a/b", ".."])
def test_a_variant_name_that_is_not_one_path_component_is_refused(tmp_path, variant):
    path = config_file(tmp_path, {**RUN, "bench": {"variants": {variant: {}}}})
    before = files_under(tmp_path)
    assert_one_line(*cli("bench", path, "--out", tmp_path / "a" / "b" / "out"), "is not a plain name")
    assert files_under(tmp_path) - before == set()
    assert not Path("/tmp/escaped-absolute").exists()


def test_a_grid_over_the_label_cannot_escape_the_output_directory(tmp_path):
    table = {**RUN, "bench": {"variants": {"erm": {"solver": {"name": "erm"}}}, "grid": {"label": ["/../../../escaped", "fine"]}}}
    assert_one_line(
        *cli("bench", config_file(tmp_path, table), "--out", tmp_path / "a" / "b" / "out"),
        "label = '/../../../escaped' must be a plain name",
    )
    assert not (tmp_path / "escaped").exists() and not (tmp_path / "a").exists()


def test_a_grid_over_paths_names_runs_by_the_last_part():
    table = {**RUN, "bench": {"variants": {"erm": {"solver": {"name": "erm"}}}, "grid": {"label": ["one", "two"]}}}
    names = {run.run_dir.parent.name for run in plan_table(table)}
    assert names == {"erm,label=one", "erm,label=two"}
    assert plan_module._short("/models/a/roberta/") == "roberta" and plan_module._short("..") == "_"


def test_a_run_label_that_climbs_out_is_refused_before_anything_is_written(tmp_path):
    path = config_file(tmp_path, with_(RUN, "label", "/../../../x"))
    before = files_under(tmp_path)
    status, lines = cli("run", path)
    assert_one_line(status, lines, "must be a plain name")
    assert files_under(tmp_path) - before == set()


# --- item 5: a person's own files are never overwritten ------------------------------------------


def test_a_run_into_a_directory_of_hand_written_files_is_refused_and_leaves_them_as_they_were(tmp_path):
    mine = tmp_path / "my"
    mine.mkdir()
    config = config_file(mine, RUN, "config.toml")
    written = config.read_text()
    (mine / "metrics.jsonl").write_text("my own notes\n")
    assert_one_line(*cli("run", config, "--out", mine), f"{mine} is not a run directory but holds config.toml")
    assert config.read_text() == written and (mine / "metrics.jsonl").read_text() == "my own notes\n"
    assert sorted(p.name for p in mine.iterdir()) == ["config.toml", "metrics.jsonl"]
    assert_one_line(*cli("run", config, "--out", mine, "--resume"), "is not a run directory")


def test_an_empty_directory_or_one_with_unrelated_files_is_a_fine_output(tmp_path):
    (tmp_path / "empty").mkdir()
    assert cli("run", config_file(tmp_path, RUN), "--out", tmp_path / "empty")[0] == 0
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "README.txt").write_text("keep me")
    assert cli("run", config_file(tmp_path, RUN), "--out", tmp_path / "notes")[0] == 0
    assert (tmp_path / "notes" / "README.txt").read_text() == "keep me"


def test_a_run_killed_before_its_first_checkpoint_is_still_a_run(tmp_path, monkeypatch):
    from layerdescent.run.trainer import Trainer

    def crash(self, *args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(Trainer, "step", crash)
    with pytest.raises(KeyboardInterrupt):
        ld.train(ld.config_from_dict(RUN), tmp_path / "run")
    monkeypatch.undo()
    assert (tmp_path / "run" / "config.toml").exists() and not (tmp_path / "run" / "checkpoint.pt").exists()
    assert cli("run", config_file(tmp_path, RUN), "--out", tmp_path / "run")[0] == 0  # its own files, not a person's


# --- item 6: distinct configs get distinct directories ------------------------------------------


def plan_table(table, out=Path("/nonexistent/out")):
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"plan-{os.getpid()}.toml"
    path.write_text(tomli_w.dumps(table))
    try:
        return plan(path, out)
    finally:
        path.unlink()


def test_grid_values_that_print_alike_get_distinct_run_directories():
    table = {**RUN, "bench": {"variants": {"erm": {"solver": {"name": "erm"}}}, "grid": {"train.lr": [0.001, 0.0010000001]}}}
    runs = plan_table(table)
    assert len({run.run_dir for run in runs}) == 2
    assert {run.variant for run in runs} == {"erm,lr=0.001", "erm,lr=0.0010000001"}


def test_an_unchanged_grid_keeps_its_short_names():
    table = {**RUN, "bench": {"variants": {"pd": {}}, "grid": {"constraints.0.alpha": [0.0, 0.05, 0.1]}}}
    assert [run.variant for run in plan_table(table)] == ["pd,alpha=0", "pd,alpha=0.05", "pd,alpha=0.1"]


def test_a_grid_value_listed_twice_is_refused(tmp_path):
    table = {**RUN, "bench": {"variants": {"erm": {"solver": {"name": "erm"}}}, "grid": {"train.lr": [0.1, 0.1]}}}
    assert_one_line(*cli("bench", config_file(tmp_path, table), "--out", tmp_path / "out"), "would share the run name '0.1'")


# --- items 8 and 13 ------------------------------------------------------------------------------


@pytest.mark.parametrize("seeds, where", [([0, 2**32], "bench.seeds[1]"), ([-1], "bench.seeds[0]")])
def test_bench_seeds_are_range_checked(tmp_path, seeds, where):
    table = {**BENCH, "bench": {**BENCH["bench"], "seeds": seeds}}
    assert_one_line(*cli("bench", config_file(tmp_path, table), "--out", tmp_path / "out"), f"{where} must be in 0..4294967295")


def test_run_on_a_bench_file_says_to_use_bench(tmp_path):
    assert_one_line(*cli("run", config_file(tmp_path, BENCH), "--out", tmp_path / "out"), "is a bench file", "layerdescent bench")
    assert not (tmp_path / "out").exists()


# --- what a finished run keeps on disk ------------------------------------------------------------

# what a finished run leaves beside its lock: no optimizer state, no best-epoch copies
FINISHED_RUN_FILES = [".layerdescent.lock", "config.toml", "metrics.jsonl", "model.safetensors", "results.json"]


def test_a_finished_run_keeps_its_model_and_drops_optimizer_state_unless_asked(tmp_path):
    ld.train(ld.config_from_dict(RUN), tmp_path / "lean")
    assert sorted(p.name for p in (tmp_path / "lean").iterdir()) == FINISHED_RUN_FILES
    ld.train(ld.config_from_dict(with_(RUN, "train.keep_checkpoint", True)), tmp_path / "kept")
    assert (tmp_path / "kept" / "checkpoint.pt").exists()
    again = ld.evaluate_run(tmp_path / "lean", tmp_path / "again")
    assert again["gammas"] == ld.evaluate_run(tmp_path / "kept", tmp_path / "again-kept")["gammas"]


def test_a_finished_run_with_early_stopping_drops_its_best_epoch_files_too(tmp_path):
    table = with_(with_(RUN, "train.early_stopping", 1), "train.epochs", 3)
    ld.train(ld.config_from_dict(table), tmp_path / "lean")
    assert sorted(p.name for p in (tmp_path / "lean").iterdir()) == FINISHED_RUN_FILES


def test_a_run_from_before_model_files_is_evaluated_from_its_checkpoint(tmp_path):
    results = ld.train(ld.config_from_dict(with_(RUN, "train.keep_checkpoint", True)), tmp_path / "old")
    (tmp_path / "old" / "model.safetensors").unlink()  # the layout of runs written before it existed
    assert ld.evaluate_run(tmp_path / "old", tmp_path / "again")["gammas"] == results["gammas"]


def test_resuming_a_finished_run_without_its_checkpoint_is_refused_not_retrained(tmp_path):
    ld.train(ld.config_from_dict(RUN), tmp_path / "run")
    log = (tmp_path / "run" / "metrics.jsonl").read_text()
    assert_one_line(
        *cli("run", config_file(tmp_path, RUN), "--out", tmp_path / "run", "--resume"), "holds a finished run and no checkpoint.pt"
    )
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == log


def test_a_list_option_of_the_wrong_type_reads_well(tmp_path):
    assert_one_line(
        *cli("run", config_file(tmp_path, with_(RUN, "constraints.0.layers", ["a"])), "--out", tmp_path / "out"),
        "must be a list of integers",
    )


# --- the output folder is layerdescent's alone (issue 36) ------------------------------------------


def test_a_lock_file_planted_as_a_symlink_is_refused_and_the_file_it_points_to_is_untouched(tmp_path):
    victim = tmp_path / "precious.txt"
    victim.write_text("keep me")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / layout.LOCK).symlink_to(victim)
    assert_one_line(*cli("run", config_file(tmp_path, RUN), "--out", tmp_path / "run"), ".layerdescent.lock is a symbolic link")
    assert victim.read_text() == "keep me"


def test_a_pipe_planted_as_a_run_file_is_refused_instead_of_waited_on(tmp_path):
    (tmp_path / "run").mkdir()
    os.mkfifo(tmp_path / "run" / "config.toml")
    assert_one_line(*cli("run", config_file(tmp_path, RUN), "--out", tmp_path / "run", "--resume"), "config.toml is not a plain file")


@pytest.mark.parametrize("name", ["metrics.jsonl", "config.toml"])
def test_a_dangling_symlink_planted_as_a_run_file_is_refused_and_nothing_is_created_where_it_points(tmp_path, name):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / name).symlink_to(tmp_path / "elsewhere" / name)
    (tmp_path / "elsewhere").mkdir()
    assert_one_line(*cli("run", config_file(tmp_path, RUN), "--out", tmp_path / "run"), f"{name} is a symbolic link")
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_deleting_the_lock_file_while_a_run_trains_does_not_let_a_second_writer_in(tmp_path, monkeypatch):
    from layerdescent.run.trainer import Trainer

    run, path, seen, real = tmp_path / "run", config_file(tmp_path, with_(RUN, "train.epochs", 2)), {}, Trainer.step

    def step(self, *args, **kwargs):
        if not seen:
            (run / layout.LOCK).unlink()
            seen["second"] = cli("run", path, "--out", run, "--resume")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Trainer, "step", step)
    status, lines = cli("run", path, "--out", run)
    assert_one_line(*seen["second"], "is in use by another layerdescent process")
    assert status == 0, lines
    steps = [r["step"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["event"] == "train"]
    assert steps == sorted(steps) and len(steps) == len(set(steps))  # one writer: no repeated or out-of-order step


def test_a_run_whose_directory_is_moved_away_stops_before_writing_into_its_replacement(tmp_path, monkeypatch):
    from layerdescent.run.trainer import Trainer

    run, real = tmp_path / "run", Trainer.step

    def step(self, *args, **kwargs):
        if not (tmp_path / "moved").exists():
            run.rename(tmp_path / "moved")
            run.mkdir()
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Trainer, "step", step)
    assert_one_line(*cli("run", config_file(tmp_path, RUN), "--out", run), "is no longer this run's", "moved or replaced")
    assert list(run.iterdir()) == []


USERS_OWN = {"summary.md": b"my own notes\n", "loss_vs_layer.png": b"\x89PNG my own plot"}


@pytest.mark.parametrize("name", USERS_OWN)
@pytest.mark.parametrize("command", ["bench", "demo"])
def test_bench_and_demo_never_replace_your_own_summary_or_plots(tmp_path, name, command):
    out = tmp_path / "out"
    out.mkdir()
    (out / name).write_bytes(USERS_OWN[name])
    argv = ("bench", config_file(tmp_path, BENCH, "bench.toml")) if command == "bench" else ("demo", "--task", "lista")
    assert_one_line(*cli(*argv, "--out", out), f"{out / name} was not written by layerdescent")
    assert sorted(p.name for p in out.iterdir()) == [name] and (out / name).read_bytes() == USERS_OWN[name]


def test_report_replaces_its_own_summary_but_not_one_you_edited_since(tmp_path, benched):
    out = tmp_path / "bench"
    shutil.copytree(benched[1], out)
    made = (out / "summary.md").read_text()
    assert cli("report", out)[0] == 0
    assert (out / "summary.md").read_text() == made  # the bench's title and "Made by" line kept
    (out / "summary.md").write_text(made + "my own conclusions\n")
    assert_one_line(*cli("report", out), "summary.md was not written by layerdescent (or was changed since)")
    assert (out / "summary.md").read_text().endswith("my own conclusions\n")


@pytest.mark.parametrize("into", ["the-bench", "the-runs-parent"])
def test_evaluate_refuses_an_out_that_holds_a_bench_or_the_runs_it_reads(tmp_path, benched, into):
    bench = tmp_path / "bench"
    shutil.copytree(benched[1], bench)
    before = {p: p.read_bytes() for p in bench.rglob("*") if p.is_file()}
    runs = bench / "erm" / "seed-0" if into == "the-runs-parent" else benched[1] / "erm" / "seed-0"
    target = bench / "erm" if into == "the-runs-parent" else bench
    assert_one_line(*cli("evaluate", runs, "--out", target), "--out")
    assert {p: p.read_bytes() for p in bench.rglob("*") if p.is_file()} == before


def test_where_a_directory_cannot_be_locked_deleting_the_lock_file_stops_the_run_before_its_next_checkpoint(tmp_path, monkeypatch):
    from layerdescent.run.trainer import Trainer

    monkeypatch.setattr(lock, "_lock_directory", lambda run_dir: None)  # as on an NFS mount: the lock file alone holds the run
    run, real = tmp_path / "run", Trainer.step

    def step(self, *args, **kwargs):
        (run / layout.LOCK).unlink(missing_ok=True)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Trainer, "step", step)
    assert_one_line(*cli("run", config_file(tmp_path, RUN), "--out", run), "is no longer this run's (.layerdescent.lock was removed")
    assert not (run / "checkpoint.pt").exists() and not (run / "results.json").exists()


def test_a_report_killed_while_it_wrote_leaves_no_folder_behind_once_another_report_runs(tmp_path, benched):
    from layerdescent.run import publish

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    out = tmp_path / "bench"
    shutil.copytree(benched[1], out)
    (out / f"{publish.STAGE}{dead.pid}-abc").mkdir()  # a report killed mid-way, by a process now gone
    assert cli("report", out)[0] == 0
    assert not any(p.name.startswith(publish.STAGE) for p in out.iterdir())


def test_evaluate_refuses_an_out_holding_the_evaluation_of_another_bench_laid_out_alike(tmp_path, benched):
    other = tmp_path / "other"
    shutil.copytree(benched[1], other)
    for results in other.rglob("results.json"):  # another training of the same variants
        data = json.loads(results.read_text())
        results.write_text(json.dumps({**data, "train": {**data["train"], "step_time_median": 1.0}}))
    assert cli("evaluate", benched[1], "--out", tmp_path / "again")[0] == 0
    assert_one_line(*cli("evaluate", other, "--out", tmp_path / "again"), "is an evaluation of another run than")


def test_a_variant_folder_planted_as_a_symlink_is_refused_before_anything_trains(tmp_path):
    elsewhere, out = tmp_path / "elsewhere", tmp_path / "out"
    elsewhere.mkdir()
    out.mkdir()
    (out / "erm").symlink_to(elsewhere)
    assert_one_line(*cli("bench", config_file(tmp_path, BENCH, "bench.toml"), "--out", out), f"{out / 'erm'} is a symbolic link")
    assert list(elsewhere.iterdir()) == [] and sorted(p.name for p in out.iterdir()) == ["erm"]
