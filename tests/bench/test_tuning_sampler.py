"""Tuning with several seeds a trial and with a seeded Optuna sampler: budgets in runs, searches that resume exactly."""

from __future__ import annotations

import json
import math
import sys

import optuna
import pytest
import tomli_w
from helpers import assert_one_line, cli, fake_results

from layerdescent.analysis.tuning import decide, read_adopted, trials_of
from layerdescent.analysis.tuning_sampler import study_path
from layerdescent.analysis.tuning_search import parse_search
from layerdescent.run.config_file import read_toml

RULE = {"criterion": "loss", "gamma": 0.5, "higher_is_better": False}
SPACE = {"solver.dual_lr": {"low": 0.5, "high": 50.0, "log": True}, "constraints.0.alpha": {"low": 0.01, "high": 0.3}}
TPE = {**RULE, "sampler": "tpe", "space": SPACE, "n_trials": 12, "sampler_seed": 0, "round": 4}


def write_run(out, name: str, seed: int, value: float, lam: float = 0.1) -> None:
    """A finished trial run at ``seed`` whose last layer's validation loss at gamma 0.5 is ``value``."""
    run = out / name / f"seed-{seed}"
    run.mkdir(parents=True)
    result = {**fake_results(name, "primal-dual", 0, value, value, 0.0), "seed": seed}
    result["gammas"] = [{**result["gammas"][0], "gamma": 0.5, "layer_loss": [1.0, 1.0, value]}]
    result["constraints"] = {"descent": {"labels": ["l1<=l0", "l2<=l1"], "lambda": [lam, 0.0]}}
    (run / "results.json").write_text(json.dumps(result))


def score(settings: dict) -> float:
    """A validation loss with its best at dual_lr 5, alpha 0.1."""
    return (math.log(settings["solver.dual_lr"]) - math.log(5.0)) ** 2 + (settings["constraints.0.alpha"] - 0.1) ** 2


def train_all(search, out, loss=score, reverse: bool = False, stop_after: int | None = None) -> list:
    """Train (write) every trial the search proposes until it proposes no more; ``stop_after`` runs, an interruption."""
    trained = 0
    while True:
        todo = [(name, trial) for name, trial in trials_of(search, out) if not (out / name).exists()]
        if not todo:
            return trials_of(search, out)
        for name, trial in reversed(todo) if reverse else todo:  # workers finish a round in any order
            if stop_after is not None and trained == stop_after:
                return trials_of(search, out)
            write_run(out, name, 100, loss(dict(trial)))
            trained += 1


def test_a_resumed_sampler_search_proposes_exactly_the_trials_an_uninterrupted_one_does(tmp_path):
    search = parse_search("pd", TPE)
    whole = train_all(search, tmp_path / "whole")
    assert len(whole) == 12 and len({name for name, _ in whole}) == 12
    # interrupted two trials into its second round, resumed, its rounds finished in the other order
    train_all(search, tmp_path / "resumed", stop_after=6)
    assert train_all(parse_search("pd", TPE), tmp_path / "resumed", reverse=True) == whole
    assert decide(search, tmp_path / "resumed") == decide(search, tmp_path / "whole")
    adopted = decide(search, tmp_path / "whole")
    assert adopted["budget"] == 12 and adopted["adopted"] == dict(min((t for _, t in whole), key=lambda t: score(dict(t))))


def test_a_sampler_proposes_from_the_finished_rounds_and_its_seed(tmp_path):
    search = parse_search("pd", TPE)
    whole = train_all(search, tmp_path / "a")
    flipped = train_all(search, tmp_path / "b", loss=lambda s: -score(s))
    assert whole[:4] == flipped[:4]  # the first round, the start-up, is the seed's alone
    assert whole[4:8] != flipped[4:8]  # after it, tpe reads the results of the rounds before
    reseeded = train_all(parse_search("pd", {**TPE, "sampler_seed": 1}), tmp_path / "c")
    assert [t for _, t in reseeded] != [t for _, t in whole]


def test_a_random_sampler_proposes_its_whole_search_at_once_within_its_ranges(tmp_path):
    space = {"solver.dual_lr": {"low": 0.5, "high": 50.0, "log": True}, "train.epochs": {"low": 1, "high": 8, "int": True}}
    search = parse_search("pd", {**RULE, "sampler": "random", "space": space, "n_trials": 20})
    trials = [dict(t) for _, t in trials_of(search, tmp_path)]
    assert len(trials) == 20
    assert all(0.5 <= t["solver.dual_lr"] <= 50.0 and isinstance(t["train.epochs"], int) and 1 <= t["train.epochs"] <= 8 for t in trials)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"space": {"solver.dual_lr": [0.5, 5.0]}}, "bench.tuning.pd.space must map dotted config keys to ranges for its sampler"),
        (
            {"space": {"solver.dual_lr": {"low": 5.0, "high": 0.5}}},
            "bench.tuning.pd.space.solver.dual_lr must be { low, high } with low < high",
        ),
        (
            {"space": {"solver.dual_lr": {"low": 0.0, "high": 5.0, "log": True}}},
            "bench.tuning.pd.space.solver.dual_lr must be { low, high }",
        ),
        ({"space": {"train.epochs": {"low": 1.5, "high": 8, "int": True}}}, "bench.tuning.pd.space.train.epochs must be { low, high }"),
        ({"n_trials": 0}, "bench.tuning.pd.n_trials must be an integer from 1 to 10,000"),
        ({"sampler": "cmaes"}, "bench.tuning.pd.sampler must be one of grid, tpe, random"),
        ({"labels": ["a"]}, "bench.tuning.pd.labels names listed trials; a sampler's are named by their number"),
    ],
)
def test_a_bad_sampler_search_is_one_line(change, message):
    with pytest.raises(Exception) as caught:
        parse_search("pd", {**TPE, **change})
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)


def test_a_sampler_without_optuna_installed_is_one_line_naming_the_extra(tmp_path, tiny, monkeypatch):
    monkeypatch.setitem(sys.modules, "optuna", None)  # as if it were not installed
    table = {**tiny, "bench": {"seeds": [0], "variants": {"primal-dual": {}}, "tuning": {"primal-dual": TPE}}}
    path = tmp_path / "bench.toml"
    path.write_text(tomli_w.dumps(table))
    status, lines = cli("bench", path, "--out", tmp_path / "out")
    assert_one_line(status, lines, "bench.tuning.primal-dual.sampler = 'tpe' needs the optuna package: pip install 'layerdescent[tune]'")


def test_a_trials_criterion_is_the_mean_over_its_seeds_and_a_failed_seed_disqualifies_it(tmp_path):
    search = parse_search("pd", {**RULE, "trials": [{"solver.dual_lr": 0.5}, {"solver.dual_lr": 5.0}], "seeds": [100, 101, 102]})
    for seed, value in zip((100, 101, 102), (0.1, 0.2, 0.6)):
        write_run(tmp_path, "tune-pd,dual_lr=0.5", seed, value)
    for seed, value in zip((100, 101), (0.5, 0.4)):
        write_run(tmp_path, "tune-pd,dual_lr=5", seed, value)
    assert decide(search, tmp_path) is None  # a seed still to run
    write_run(tmp_path, "tune-pd,dual_lr=5", 102, 0.3)
    decision = decide(search, tmp_path)
    assert [t["value"] for t in decision["trials"]] == [pytest.approx(0.3), pytest.approx(0.4)]
    assert decision["adopted"] == {"solver.dual_lr": 0.5} and decision["budget"] == 6  # 2 trials x 3 seeds
    (tmp_path / "tune-pd,dual_lr=0.5" / "seed-101" / "results.json").unlink()
    (tmp_path / "tune-pd,dual_lr=0.5" / "seed-101" / "failure.json").write_text(json.dumps({"error": "diverged"}))
    decision = decide(search, tmp_path)
    assert decision["adopted"] == {"solver.dual_lr": 5.0} and decision["trials"][0] | {"values": None} == {
        "run": "tune-pd,dual_lr=0.5",
        "settings": {"solver.dual_lr": 0.5},
        "value": None,
        "failed": True,
        "qualifies": False,
        "values": None,
    }


def test_a_bench_trains_a_sampled_search_at_every_seed_and_states_its_budget_in_runs(tmp_path, tiny):
    tiny["train"] = {**tiny["train"], "epochs": 1}
    search = {**RULE, "sampler": "random", "space": {"solver.dual_lr": {"low": 0.5, "high": 50.0, "log": True}}, "n_trials": 2}
    search["seeds"] = [100, 101]
    table = {**tiny, "bench": {"seeds": [0], "variants": {"primal-dual": {}}, "tuning": {"primal-dual": search}}}
    path, out = tmp_path / "bench.toml", tmp_path / "out"
    path.write_text(tomli_w.dumps(table))
    status, lines = cli("bench", path, "--out", out)
    assert status == 0, lines
    decision = read_adopted(out)["primal-dual"]
    assert (
        decision["budget"] == 4
        and [sorted(p.name for p in (out / t["run"]).iterdir()) for t in decision["trials"]] == [["seed-100", "seed-101"]] * 2
    )
    assert read_toml(out / "primal-dual" / "seed-0" / "config.toml")["solver"]["dual_lr"] == decision["adopted"]["solver.dual_lr"]
    # the study is kept for Optuna's own tools, its trials the ones the bench trained
    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(study_path(out, parse_search("primal-dual", search))))
    )
    study = optuna.load_study(study_name="primal-dual", storage=storage)
    assert [t.params for t in study.trials] == [t["settings"] for t in decision["trials"]]
    assert [t.value for t in study.trials] == [t["value"] for t in decision["trials"]]
    assert "| primal-dual | 4 |" in (out / "summary.md").read_text()
    assert "### primal-dual: 2 trials × 2 seeds = 4 runs on validation" in (out / "endpoints.md").read_text()
