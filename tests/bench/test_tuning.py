"""Tuning the tool runs: a declared search's trials train first, on validation, the rule adopts one, the main runs train from it."""

from __future__ import annotations

import json

import pytest
import tomli_w
from helpers import REPO, fake_results

from layerdescent.analysis.endpoints_file import read_spec
from layerdescent.analysis.tuning import ADOPTED, decide, read_adopted
from layerdescent.analysis.tuning_search import parse_search
from layerdescent.cli import main
from layerdescent.errors import ConfigError
from layerdescent.run.config_file import read_toml

SEARCH = {"trials": [{"solver.dual_lr": 0.5}, {"solver.dual_lr": 5.0}], "criterion": "loss", "gamma": 0.5, "higher_is_better": False}


def bench_file(tmp_path, tiny, search: dict, variant: str = "primal-dual") -> str:
    table = {
        **tiny,
        "bench": {
            "seeds": [0, 1],
            "variants": {"erm": {"solver": {"name": "erm"}}, "primal-dual": {}},
            "tuning": {variant: search},
        },
    }
    path = tmp_path / "bench.toml"
    path.write_text(tomli_w.dumps(table))
    return str(path)


def test_bench_trains_the_trials_before_the_variants_runs_adopts_the_best_on_validation_and_trains_from_it(tmp_path, tiny, capsys):
    path, out = bench_file(tmp_path, tiny, SEARCH), tmp_path / "out"
    before = (tmp_path / "bench.toml").read_bytes()
    assert main(["bench", path, "--out", str(out)]) == 0
    said = [line.split(":")[0] for line in capsys.readouterr().out.splitlines() if ": trained" in line]
    order = [said.index(f"tune-primal-dual,dual_lr={lr} seed 100") for lr in ("0.5", "5")]
    assert max(order) < min(said.index(f"primal-dual seed {seed}") for seed in (0, 1))  # erm, untuned, trains beside the trials
    trials = {lr: json.loads((out / f"tune-primal-dual,dual_lr={lr}" / "seed-100" / "results.json").read_text()) for lr in ("0.5", "5")}
    assert all(t["split"] == "validation" and [g["gamma"] for g in t["gammas"]] == [0.5] for t in trials.values())
    best = min(trials, key=lambda lr: trials[lr]["gammas"][0]["layer_loss"][-1])
    decision = read_adopted(out)["primal-dual"]
    assert decision["adopted"] == {"solver.dual_lr": float(best)} and decision["budget"] == 2
    # the main runs train from the adopted setting; the bench file is never edited
    for seed in (0, 1):
        assert read_toml(out / "primal-dual" / f"seed-{seed}" / "config.toml")["solver"]["dual_lr"] == float(best)
    assert (tmp_path / "bench.toml").read_bytes() == before
    # the adopted setting is reproducible from the recorded trials alone
    assert decide(parse_search("primal-dual", SEARCH), out) == decision
    assert "| primal-dual | 2 |" in (out / "summary.md").read_text()  # the budget a report states is the trials'
    page = (out / "endpoints.md").read_text()
    assert f"### primal-dual: 2 trials on validation, adopted solver.dual_lr = {float(best)!r}" in page
    assert f"| tune-primal-dual,dual_lr={best} | {trials[best]['gammas'][0]['layer_loss'][-1]:.6g} | yes |" in page


def test_main_runs_asked_for_before_their_trials_ran_are_refused_in_one_line(tmp_path, tiny, capsys):
    path = bench_file(tmp_path, tiny, SEARCH)
    assert main(["bench", path, "--out", str(tmp_path / "out"), "--only", "primal-dual"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "layerdescent: error: bench.tuning.primal-dual: its main runs wait for its trials, which have not all run: "
        "bench --only 'tune-primal-dual,*' first, or the bench without --only"
    ]
    assert not (tmp_path / "out" / "primal-dual").exists()


def test_a_search_where_no_trial_qualifies_stops_the_variant_and_says_why(tmp_path, tiny, capsys):
    # erm holds no constraint, so no multiplier of its trials can bind
    path = bench_file(tmp_path, tiny, {**SEARCH, "trials": [{"train.lr": 0.01}], "qualify": "binds"}, variant="erm")
    assert main(["bench", path, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "bench.tuning.erm: no trial qualified ('binds', criterion 'loss'" in err and "widen the search" in err
    assert read_adopted(tmp_path / "out")["erm"]["adopted"] is None


def write_trial(out, name: str, value: float, lam: list[float] | None = None) -> None:
    run = out / name / "seed-100"
    run.mkdir(parents=True)
    result = fake_results(name, "primal-dual", 0, value, value, 0.0)
    result["gammas"] = [{**result["gammas"][0], "gamma": 0.5, "layer_loss": [1.0, 1.0, value]}]
    result["constraints"] = {"descent": {"labels": ["l1<=l0", "l2<=l1"], "lambda": lam or [0.0, 0.0]}}
    (run / "results.json").write_text(json.dumps(result))


def test_ties_go_to_the_trial_listed_first_and_binds_leaves_out_what_does_not_bind(tmp_path):
    three = [{"solver.dual_lr": v} for v in (0.5, 5.0, 50.0)]
    write_trial(tmp_path, "tune-pd,dual_lr=0.5", 0.3 + 5e-10, [0.1, 0.0])
    write_trial(tmp_path, "tune-pd,dual_lr=5", 0.3, [0.1, 0.0])
    assert decide(parse_search("pd", {**SEARCH, "trials": three}), tmp_path) is None  # a trial still to run: nothing decided yet
    assert decide(parse_search("pd", SEARCH), tmp_path)["adopted"] == {"solver.dual_lr": 0.5}  # within 1e-9 of 0.3: the first listed
    write_trial(tmp_path, "tune-pd,dual_lr=50", 0.1, [0.0, 0.0])
    assert decide(parse_search("pd", {**SEARCH, "trials": three}), tmp_path)["adopted"] == {"solver.dual_lr": 50.0}
    binding = decide(parse_search("pd", {**SEARCH, "trials": three, "qualify": "binds"}), tmp_path)
    assert binding["adopted"] == {"solver.dual_lr": 0.5} and [t["qualifies"] for t in binding["trials"]] == [True, True, False]


def test_a_declared_tie_widens_what_counts_as_equal(tmp_path):
    write_trial(tmp_path, "tune-pd,dual_lr=0.5", 0.3 + 5e-7)
    write_trial(tmp_path, "tune-pd,dual_lr=5", 0.3)
    assert decide(parse_search("pd", SEARCH), tmp_path)["adopted"] == {"solver.dual_lr": 5.0}
    wide = decide(parse_search("pd", {**SEARCH, "tie": 1e-6}), tmp_path)
    assert wide["adopted"] == {"solver.dual_lr": 0.5} and wide["rule"]["tie"] == "within 1e-06: the trial listed first"


def test_a_search_with_labels_and_the_training_criterion_trains_the_variants_it_takes_at_the_adopted_settings(tmp_path, tiny, capsys):
    search = {**SEARCH, "labels": ["slow", "fast"], "criterion": "best_val_loss", "gamma": 0.3, "takes": ["wide"]}
    variants = {"primal-dual": {}, "wide": {"train": {"batch_size": 16}}}
    table = {**tiny, "bench": {"seeds": [0], "variants": variants, "tuning": {"primal-dual": search}}}
    path, out = tmp_path / "bench.toml", tmp_path / "out"
    path.write_text(tomli_w.dumps(table))
    assert main(["bench", str(path), "--out", str(out)]) == 2  # the criterion is early stopping's kept epoch
    assert "criterion 'best_val_loss' is the validation loss of the epoch early stopping keeps" in capsys.readouterr().err
    table["train"] = {**table["train"], "epochs": 2, "early_stopping": 1}
    path.write_text(tomli_w.dumps(table))
    assert main(["bench", str(path), "--out", str(out)]) == 0
    capsys.readouterr()
    trials = {label: out / f"tune-primal-dual,{label}" / "seed-100" for label in ("slow", "fast")}
    assert sorted(p.name for p in out.glob("tune-*")) == ["tune-primal-dual,fast", "tune-primal-dual,slow"]  # none for "wide"
    # the criterion is read from training's validation, which the trials ran at the rule's gamma
    assert all(read_toml(t / "config.toml")["train"]["validation_gamma"] == 0.3 for t in trials.values())
    kept = {label: json.loads((t / "results.json").read_text())["train"]["best_val_loss"][-1] for label, t in trials.items()}
    best = min(kept, key=kept.get)
    decision = read_adopted(out)["primal-dual"]
    assert decision["adopted_run"] == f"tune-primal-dual,{best}" and [t["value"] for t in decision["trials"]] == [
        kept["slow"],
        kept["fast"],
    ]
    adopted = {"slow": 0.5, "fast": 5.0}[best]
    for variant in ("primal-dual", "wide"):
        assert read_toml(out / variant / "seed-0" / "config.toml")["solver"]["dual_lr"] == adopted
    assert read_toml(out / "wide" / "seed-0" / "config.toml")["train"]["batch_size"] == 16


def test_a_search_may_name_its_trials_apart_from_its_variant():
    search = parse_search("penalty-band", {**SEARCH, "trials": [{"solver.weights": "geometric", "solver.rho": 0.7}], "name": "penalty"})
    assert [search.trial_name(t) for t in search.trials] == ["tune-penalty,weights=geometric,rho=0.7"]


def test_a_grid_space_is_every_combination_in_order():
    rule = {k: v for k, v in SEARCH.items() if k != "trials"}
    search = parse_search("pd", {**rule, "space": {"constraints.0.alpha": [0.05, 0.2], "solver.dual_lr": [5.0, 50.0]}})
    assert [search.trial_name(t) for t in search.trials] == [
        "tune-pd,alpha=0.05,dual_lr=5",
        "tune-pd,alpha=0.05,dual_lr=50",
        "tune-pd,alpha=0.2,dual_lr=5",
        "tune-pd,alpha=0.2,dual_lr=50",
    ]


@pytest.mark.parametrize(
    "search, message",
    [
        ({**SEARCH, "criteria": "loss"}, "unknown key bench.tuning.pd.criteria"),
        ({k: v for k, v in SEARCH.items() if k != "gamma"}, "bench.tuning.pd lacks 'gamma'"),
        ({**SEARCH, "space": {"solver.dual_lr": [1.0]}}, "bench.tuning.pd needs trials (a list of settings) or space"),
        ({**SEARCH, "qualify": "some"}, "bench.tuning.pd.qualify must be one of any, binds"),
        ({**SEARCH, "gammas": [0.0]}, "bench.tuning.pd.gammas must be a list of validation gammas that holds gamma"),
        ({**SEARCH, "name": "a/b"}, "bench.tuning.pd.name must be a plain name for its trials' labels"),
        ({**SEARCH, "labels": ["one"]}, "bench.tuning.pd.labels must name each of its 2 trials"),
        ({**SEARCH, "takes": ["pd"]}, "bench.tuning.pd.takes must list other variants trained at the adopted settings"),
        ({**SEARCH, "tie": -1}, "bench.tuning.pd.tie must be a criterion difference >= 0"),
    ],
)
def test_a_bad_search_is_one_line(search, message):
    with pytest.raises(ConfigError, match="^" + message.replace(".", r"\.").replace("(", r"\(").replace(")", r"\)")):
        parse_search("pd", search)


def test_the_adopted_file_is_written_again_byte_for_byte_when_nothing_changed(tmp_path, tiny, capsys):
    path, out = bench_file(tmp_path, tiny, SEARCH), tmp_path / "out"
    assert main(["bench", path, "--out", str(out)]) == 0
    first = (out / ADOPTED).read_bytes()
    assert main(["bench", path, "--out", str(out)]) == 0
    assert (out / ADOPTED).read_bytes() == first
    capsys.readouterr()


@pytest.mark.parametrize("variant, dual_lr", [("levels", 50.0), ("primal-dual", 5.0)])
def test_the_declared_rule_reproduces_lista_band2s_adoption_from_its_committed_trials(variant, dual_lr):
    # lista_band2's header rule, declared: alpha x dual_lr on validation, last-layer loss at the band's top, binding only;
    # its summary's command carries the settings a person adopted by hand from the same trials
    space = {"constraints.0.alpha": [0.05, 0.2], "solver.dual_lr": [0.5, 5.0, 50.0, 500.0]}
    search = parse_search(variant, {"space": space, "criterion": "loss", "gamma": 1.0, "higher_is_better": False, "qualify": "binds"})
    decision = decide(search, REPO / "benchmarks" / "results" / "lista_band2")
    assert decision["adopted"] == {"constraints.0.alpha": 0.05, "solver.dual_lr": dual_lr} and decision["budget"] == 8
    made_by = (REPO / "benchmarks" / "results" / "lista_band2" / "summary.md").read_text()
    assert f"--set bench.variants.{variant}.solver.dual_lr={dual_lr}" in made_by


def _at(table, dotted: str):
    for part in dotted.split("."):
        table = table[int(part)] if isinstance(table, list) else table[part]
    return table


@pytest.mark.parametrize("bench", ["lista_band2", "video_levels", "video_deep"])
def test_a_committed_benchs_decisions_are_its_declared_rules_applied_to_its_committed_trials_and_its_main_runs_took_them(bench):
    # `layerdescent bench benchmarks/BENCH.toml --out benchmarks/results/BENCH --only 'tune-*' --skip-failed` wrote them, training nothing
    spec = read_spec(REPO / "benchmarks" / f"{bench}.toml")
    out = REPO / "benchmarks" / "results" / bench
    decisions = read_adopted(out)
    assert decisions == {variant: decide(search, out) for variant, search in spec.searches.items()}
    for variant, search in spec.searches.items():
        adopted = decisions[variant]["adopted"]
        for taker in (variant, *search.takes):
            configs = sorted((out / taker).glob("seed-*/config.toml"))
            assert configs, f"{taker} has no committed run"
            for config in configs:
                recorded = {key: _at(read_toml(config), key) for key in adopted}
                assert recorded == adopted, f"{config} was not trained at the adopted settings"


def test_the_committed_benches_adopt_what_their_headers_say():
    adopted = {bench: read_adopted(REPO / "benchmarks" / "results" / bench) for bench in ("lista_band2", "video_levels", "video_deep")}
    assert adopted["lista_band2"]["penalty-band"]["adopted"] == {"solver.weights": "geometric", "solver.rho": 0.7}
    assert adopted["video_levels"]["vtest-dust-penalty-band"]["adopted"] == {"solver.weights": "linear"}
    assert adopted["video_levels"]["vtest-transformer-levels"]["adopted"] == {"constraints.0.alpha": 0.2, "solver.dual_lr": 50.0}
    runs = {arch: adopted["video_deep"][f"vtest-{arch}-{solver}"]["adopted_run"] for arch in ("dust", "l1l1") for solver in ("penalty",)}
    assert runs == {"dust": "tune-dust-penalty,rho=0.7", "l1l1": "tune-l1l1-penalty,rho=0.9"}
    trials = adopted["video_deep"]["vtest-dust-primal-dual"]["trials"]
    assert [t["failed"] for t in trials] == [False, True, False, True]  # both anchored runs diverged: they qualify for nothing
