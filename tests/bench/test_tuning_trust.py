"""Tuning that can be trusted: trial folders stay under --out, the decision is the trials' own, bounds hold before anything trains."""

from __future__ import annotations

import copy
import json
import os
import shutil
import signal
from contextlib import contextmanager

import pytest
import tomli_w
from conftest import TINY
from helpers import assert_one_line, cli

from layerdescent.analysis.tuning import ADOPTED, read_adopted
from layerdescent.analysis.tuning_search import parse_search
from layerdescent.bench.plan import plan
from layerdescent.errors import ConfigError
from layerdescent.run.config_file import read_toml

SEARCH = {"trials": [{"solver.dual_lr": 0.5}, {"solver.dual_lr": 5.0}], "criterion": "loss", "gamma": 0.5, "higher_is_better": False}


def bench_file(tmp_path, tiny, search: dict, seeds=(0,)) -> str:
    tiny["train"] = {**tiny["train"], "epochs": 1}
    table = {**tiny, "bench": {"seeds": list(seeds), "variants": {"primal-dual": {}}, "tuning": {"primal-dual": search}}}
    path = tmp_path / "bench.toml"
    path.write_text(tomli_w.dumps(table))
    return str(path)


@contextmanager
def within(seconds: int):
    """Fail a block that runs longer than ``seconds`` (a search expanded before it is bounded never returns)."""

    def late(*_):
        raise AssertionError(f"took longer than {seconds} s")

    previous = signal.signal(signal.SIGALRM, late)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize("value", ["../../../esc", "/abs/esc"])
def test_a_trial_value_that_is_a_path_trains_in_a_hashed_folder_under_out(tmp_path, tiny, value):
    out = tmp_path / "deep" / "er" / "out"
    path = bench_file(tmp_path, tiny, {**SEARCH, "trials": [{"constraints.0.name": value}]})
    status, lines = cli("bench", path, "--out", out, "--only", "tune-*")
    assert status == 0, lines
    trained = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("results.json"))
    assert len(trained) == 1 and trained[0].parts[:4] == ("deep", "er", "out", trained[0].parts[3])
    folder = out / trained[0].parts[3]
    assert folder.name.startswith("tune-primal-dual,") and "/" not in folder.name
    config = read_toml(folder / "seed-100" / "config.toml")
    assert config["constraints"][0]["name"] == value and config["label"] == folder.name  # the readable value is in its config
    assert not os.path.exists(tmp_path / "esc") and not os.path.exists("/abs")


@pytest.mark.parametrize("key", ["label", "seed"])
def test_a_trial_may_not_set_its_runs_label_or_seed(tmp_path, tiny, key):
    # {label = "erm"} would be adopted, and the primal-dual main runs would call themselves erm
    path = bench_file(tmp_path, tiny, {**SEARCH, "trials": [{key: "erm" if key == "label" else 7, "solver.dual_lr": 0.5}]})
    assert_one_line(*cli("bench", path, "--out", tmp_path / "out"), f"bench.tuning.primal-dual: a trial may not set '{key}'")
    assert not (tmp_path / "out").exists()


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """A bench whose search has run (its trials, its decision, its main run), trained once for the tests that tamper with a copy."""
    root = tmp_path_factory.mktemp("tuned")
    path = bench_file(root, copy.deepcopy(TINY), SEARCH)
    assert cli("bench", path, "--out", root / "out")[0] == 0
    return root


def tampered(tuned, tmp_path, **change) -> tuple:
    """A copy of the tuned bench whose tuning.json's decision for primal-dual has ``change``; (bench file, out)."""
    out = tmp_path / "out"
    shutil.copytree(tuned / "out", out)
    decisions = read_adopted(out)
    decisions["primal-dual"].update(change)
    (out / ADOPTED).write_text(json.dumps(decisions))
    return str(tuned / "bench.toml"), out


def test_a_forged_adoption_in_tuning_json_is_refused_and_nothing_trains_on_it(tuned, tmp_path):
    path, out = tampered(tuned, tmp_path, adopted={"solver.dual_lr": 99.0})  # a value no trial had
    shutil.rmtree(out / "primal-dual")  # the main run still to train
    assert_one_line(*cli("bench", path, "--out", out), f"{out / ADOPTED} records a decision for primal-dual", "delete it and rerun")
    assert not (out / "primal-dual").exists()


@pytest.mark.parametrize("adopted, trials", [("solver.dual_lr", []), (["x"], "x"), ({"solver.dual_lr": 0.5}, "x")])
def test_a_malformed_tuning_json_is_one_line_in_report(tuned, tmp_path, adopted, trials):
    _, out = tampered(tuned, tmp_path, adopted=adopted, trials=trials)
    assert_one_line(*cli("report", out), f"{out / ADOPTED} records a decision for primal-dual", "delete it and rerun")


def test_a_criterion_the_task_does_not_report_is_refused_before_anything_trains(tmp_path, tiny):
    path = bench_file(tmp_path, tiny, {**SEARCH, "criterion": "nope"})
    assert_one_line(*cli("bench", path, "--out", tmp_path / "out"), "bench.tuning.primal-dual.criterion: 'nope' is not a metric of task")
    assert not list(tmp_path.rglob("seed-*"))


def test_a_symlink_at_tuning_json_is_refused_and_left_alone(tmp_path, tiny):
    path, out = bench_file(tmp_path, tiny, SEARCH), tmp_path / "out"
    out.mkdir()
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text("{}")
    (out / ADOPTED).symlink_to(elsewhere)
    assert_one_line(*cli("bench", path, "--out", out), f"{out / ADOPTED} is a symbolic link")
    assert (out / ADOPTED).is_symlink() and elsewhere.read_text() == "{}" and not list(out.glob("tune-*"))


def test_a_grid_space_of_a_hundred_million_points_is_refused_in_one_line_before_it_is_expanded():
    space = {f"train.k{i}": list(range(100)) for i in range(4)}
    rule = {k: v for k, v in SEARCH.items() if k != "trials"}
    with within(5), pytest.raises(ConfigError, match=r"^bench\.tuning\.pd\.space is a grid of 100,000,000 trials; at most 10,000"):
        parse_search("pd", {**rule, "space": space})


def test_a_ten_thousand_trial_search_is_refused_by_the_bench_run_cap(tmp_path, tiny):
    rule = {k: v for k, v in SEARCH.items() if k != "trials"}
    path = bench_file(
        tmp_path,
        tiny,
        {**rule, "space": {"solver.dual_lr": [float(i + 1) for i in range(100)], "train.lr": [0.001 * (i + 1) for i in range(100)]}},
    )
    with within(20), pytest.raises(ConfigError, match=r"^the bench has 10,001 runs .*tuning trials x seeds.*at most 10,000"):
        plan(path, tmp_path / "out")


def test_trials_times_seeds_count_in_the_bench_run_cap(tmp_path, tiny):
    rule = {k: v for k, v in SEARCH.items() if k != "trials"}
    search = {**rule, "space": {"solver.dual_lr": [float(i + 1) for i in range(100)]}, "seeds": list(range(100))}
    path = bench_file(tmp_path, tiny, search)
    with within(20), pytest.raises(ConfigError, match=r"^the bench has 10,001 runs"):
        plan(path, tmp_path / "out")


@pytest.mark.parametrize(
    "change, message",
    [
        ({"gammas": [0.5, "x"]}, "bench.tuning.pd.gammas must be a list of validation gammas that holds gamma (0.5), each a number >= 0"),
        ({"gammas": [0.5] + [1.0] * 5000}, "bench.tuning.pd.gammas must be a list of validation gammas that holds gamma (0.5)"),
        ({"trials": [{"solver.dual_lr": 0.5}] * 10_001}, "bench.tuning.pd.trials lists 10,001 trials; at most 10,000"),
        ({"seed": 1, "seeds": [1, 2]}, "bench.tuning.pd has seed and seeds: keep one"),
        ({"seeds": [1, 1]}, "bench.tuning.pd.seeds must be an integer, or seeds a list of 1 to 100 distinct integers"),
        ({"seeds": list(range(101))}, "bench.tuning.pd.seeds must be an integer, or seeds a list of 1 to 100 distinct integers"),
        ({"n_trials": 4}, 'bench.tuning.pd.n_trials is a sampler\'s: set sampler = "tpe" or "random"'),
    ],
)
def test_a_mistyped_or_unbounded_search_key_is_one_line(change, message):
    with pytest.raises(ConfigError) as caught:
        parse_search("pd", {**SEARCH, **change})
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)


def test_a_grid_value_outside_the_safe_alphabet_names_a_hashed_folder_and_keeps_its_readable_label(tmp_path, tiny):
    table = {**tiny, "bench": {"seeds": [0], "variants": {"primal-dual": {}}, "grid": {"constraints.0.name": ["a:b|c", "plain"]}}}
    path = tmp_path / "bench.toml"
    path.write_text(tomli_w.dumps(table))
    runs = plan(path, tmp_path / "out")
    assert [run.variant for run in runs] == ["primal-dual,name=a:b|c", "primal-dual,name=plain"]
    folders = [run.run_dir.relative_to(tmp_path / "out").parts for run in runs]
    assert folders[1] == ("primal-dual,name=plain", "seed-0")  # a safe name is its folder, as before
    assert folders[0][0].startswith("primal-dual,") and len(folders[0][0]) == len("primal-dual,") + 12 and folders[0][1] == "seed-0"
