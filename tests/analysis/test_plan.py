"""A bench file's declared plan: named endpoints in families, endpoints.md written by report, and the plan each run was made under."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tomli_w
from helpers import REPO, cli, three_solvers, write_run

import layerdescent.analysis.report as report_module
from layerdescent.analysis.endpoints import BenchSpec, Choice, Endpoint
from layerdescent.analysis.endpoints_file import parse_spec, read_spec
from layerdescent.analysis.judging import judge
from layerdescent.analysis.registration import LEDGER, changes
from layerdescent.analysis.report import collect, write_report
from layerdescent.analysis.stats import holm, paired_difference
from layerdescent.cli import main
from layerdescent.errors import ConfigError
from layerdescent.run.config_file import tomllib

PLAN = {
    "P1": {"variant": "primal-dual", "metric": "mse", "higher_is_better": False, "gamma": 1.0},
    "P2": {"variant": "primal-dual", "metric": "mse", "higher_is_better": False, "gamma": 1.0, "against": "erm"},
    "S1": {"variant": "primal-dual", "metric": "mse", "higher_is_better": False, "gamma": 0.0, "family": "cost"},
    "D1": {"variant": "primal-dual", "gamma": 1.0, "statistic": "rising"},
}


def test_each_endpoint_carries_the_p_of_the_comparison_it_shows(tmp_path):
    results = collect(three_solvers(tmp_path))
    spec = parse_spec({"baselines": ["erm", "penalty"], "plan": PLAN})
    p1, p2, s1, d1 = judge(results, spec, spec.endpoints())
    erm, pd = (
        [-r["gammas"][1]["metrics"]["mse"] for r in sorted(results, key=lambda r: r["seed"]) if r["label"] == x]
        for x in ("erm", "primal-dual")
    )
    # P2 names erm: its p is the paired test of primal-dual against erm, nothing else
    assert p2["baseline"] == "erm" and p2["difference"]["p"] == paired_difference(pd, erm)["p"]
    # P1 against the strongest: penalty has the better mean; primal-dual is not better than it
    assert p1["baseline"] == "penalty" and p1["decided_by"] == "penalty" and p1["verdict"] == "no difference"
    # one family of two (P1, P2), Holm within it; S1 alone in its family; D1 described, not tested
    assert [p1["p_holm"], p2["p_holm"]] == holm([p1["difference"]["p"], p2["difference"]["p"]])
    assert p1["m"] == p2["m"] == 2 and s1["m"] == 1 and "p_holm" not in d1
    assert d1["rises"] == [] and d1["layer_loss"] == pytest.approx([1.0, 0.8, 0.6])


def test_better_than_the_strongest_names_the_comparison_that_decided_it(tmp_path):
    # primal-dual beats both baselines; the weaker-looking one (erm) is far, penalty near: penalty's p decides
    for seed, (erm, pen, pd) in enumerate([(0.5, 0.31, 0.30), (0.52, 0.322, 0.3), (0.51, 0.315, 0.302)]):
        for label, value in (("erm", erm), ("penalty", pen), ("primal-dual", pd)):
            write_run(tmp_path, label, label, seed, 0.1, value)
    spec = parse_spec({"baselines": ["erm", "penalty"], "plan": {"P1": PLAN["P1"]}})
    (cell,) = judge(collect(tmp_path), spec, spec.endpoints())
    assert cell["decided_by"] == "penalty" and cell["difference"]["p"] == max(d["p"] for d in cell["versus"].values())


def test_report_writes_endpoints_md_family_by_family(tmp_path):
    spec = parse_spec({"baselines": ["erm", "penalty"], "plan": PLAN})
    write_report(three_solvers(tmp_path), spec=spec)
    page = (tmp_path / "endpoints.md").read_text()
    assert "## Family primary: the claim" in page and "## Family cost: secondary" in page
    assert "| P2 (mse, lower is better) | primal-dual | test | 1 | erm |" in page
    assert "| D1 | primal-dual | test | 1 | 3 | 0 | 1 0.8 0.6 |" in page
    assert "No plan is recorded with these runs" in page and "## Everything else: exploratory" in page
    summary = (tmp_path / "summary.md").read_text()
    assert "## Primary endpoints (pre-registered)" in summary and "[endpoints.md](endpoints.md)" in summary
    assert "| S1 " not in summary  # the summary shows the claim's family; the page shows them all


def test_the_older_primary_table_is_the_plans_family_primary():
    spec = parse_spec({"primary": {"metric": "mse", "higher_is_better": False, "gammas": [0.0, 0.5], "variants": ["pd"]}})
    assert [(e.variant, e.gamma, e.family, e.against) for e in spec.endpoints()] == [
        ("pd", 0.0, "primary", "strongest"),
        ("pd", 0.5, "primary", "strongest"),
    ]


@pytest.mark.parametrize(
    "plan, message",
    [
        ({"P1": {"variant": "a", "metric": "mse", "gamma": 0.5}}, "bench.plan.P1 lacks 'higher_is_better'"),
        ({"P1": {**PLAN["P1"], "gamm": 1}}, "unknown key bench.plan.P1.gamm"),
        ({"P1": {**PLAN["P1"], "gamma": "0.5"}}, "bench.plan.P1.gamma must be one perturbation level"),
        ({"P1": {**PLAN["P1"], "gamma": []}}, "bench.plan.P1.gamma is an empty list: name one or more"),
        ({"P1": {**PLAN["P1"], "statistic": "mean"}}, "bench.plan.P1.statistic must be one of difference, rising"),
        ({"P1": 3}, "bench.plan must hold one table per endpoint"),
        (
            {"dose-0": {"13": PLAN["P1"]}},
            'bench.plan.dose-0.13 is a table: a dot in an endpoint\'s name nests it; quote the name, [bench.plan."dose-0.13"]',
        ),
    ],
)
def test_a_bad_plan_is_one_line(plan, message):
    with pytest.raises(ConfigError, match="^" + message.replace(".", r"\.").replace("[", r"\[")):
        parse_spec({"plan": plan})


def kept_epochs(root, losses: dict[str, list[float]], gamma: float = 0.5):
    """Runs whose early stopping kept an epoch of last-layer validation loss ``losses[label][seed]`` at ``gamma``."""
    for label, values in losses.items():
        for seed, loss in enumerate(values):
            write_run(root, label, label.split("-d")[0], seed, 0.1, 0.2)
            run = root / label / f"seed-{seed}"
            result = json.loads((run / "results.json").read_text())
            result["train"] |= {"best_epoch": 1, "best_val_loss": [2.0, 1.0, loss]}
            (run / "results.json").write_text(json.dumps(result))
            (run / "config.toml").write_text(
                (run / "config.toml").read_text() + f"[train]\nearly_stopping = 1\nvalidation_gamma = {gamma}\n"
            )
    return root


def test_an_endpoint_on_the_kept_epoch_reads_early_stoppings_last_layer_validation_loss(tmp_path):
    root = kept_epochs(tmp_path, {"erm-d8": [0.30, 0.31, 0.32], "primal-dual-d8": [0.20, 0.22, 0.21]})
    e = {"variant": "primal-dual-d8", "against": "erm-d8", "on": "validation (kept epoch)", "metric": "loss"}
    spec = parse_spec(
        {"plan": {"R8": {**e, "higher_is_better": False, "gamma": 0.5}, "R0": {**e, "higher_is_better": False, "gamma": 0.0}}}
    )
    r8, r0 = judge(collect(root), spec, spec.endpoints())
    expected = paired_difference([-0.20, -0.22, -0.21], [-0.30, -0.31, -0.32])  # signed: lower is better
    assert r8["difference"]["mean"] == pytest.approx(expected["mean"]) and r8["verdict"] == "better"
    assert r0["verdict"] == "missing"  # the runs validated at 0.5, not 0


def test_a_choice_takes_the_first_candidate_judged_better_waits_for_an_unjudged_one_else_its_default():
    choice = Choice("depth", (("8", "R8"), ("12", "R12"), ("16", "R16")), "12")
    verdicts = lambda *v: {name: {"verdict": x} for name, x in zip(("R8", "R12", "R16"), v)}
    assert choice.decide(verdicts("worse", "better", "better")) == ("12", "R12 is better, after R8 worse")
    assert choice.decide(verdicts("no difference", "no difference", "worse"))[0] == "12"
    assert choice.decide(verdicts("no difference", "missing", "better")) == (None, "R12 has not run, after R8 no difference")
    assert choice.decide(verdicts("better", "missing", "missing"))[0] == "8"


def test_report_writes_the_setting_a_plans_choice_takes(tmp_path):
    root = kept_epochs(tmp_path, {"erm-d8": [0.30, 0.31, 0.32], "primal-dual-d8": [0.20, 0.22, 0.21]})
    e = {"variant": "primal-dual-d8", "against": "erm-d8", "on": "validation (kept epoch)", "metric": "loss", "higher_is_better": False}
    bench = {"plan": {"R8": {**e, "gamma": 0.5, "family": "rule 8"}}, "choice": {"depth": {"candidates": {"8": "R8"}, "otherwise": "12"}}}
    write_report(root, spec=parse_spec(bench))
    assert "**depth = 8** (R8 is better)." in (root / "endpoints.md").read_text()


@pytest.mark.parametrize(
    "choice, message",
    [
        ({"depth": {"candidates": {"8": "R9"}, "otherwise": "12"}}, "bench.choice.depth.candidates: 'R9' is no tested endpoint"),
        ({"depth": {"candidates": {"8": "P1"}}}, "bench.choice.depth.otherwise must be the value chosen"),
        ({"depth": {"candidates": {"8": "P1"}, "otherwise": "12", "first": 1}}, "unknown key bench.choice.depth.first"),
        ({"depth": {"candidates": ["P1"], "otherwise": "12"}}, "bench.choice.depth.candidates must map each value to the endpoint"),
    ],
)
def test_a_bad_choice_is_one_line(choice, message):
    with pytest.raises(ConfigError, match="^" + message.replace(".", r"\.")):
        parse_spec({"plan": {"P1": PLAN["P1"]}, "choice": choice})


def test_a_list_of_variants_or_gammas_declares_one_endpoint_each_named_by_both():
    spec = parse_spec({"plan": {"D": {"variant": ["erm", "primal-dual"], "gamma": [0.0, 1.0], "statistic": "rising"}, "P1": PLAN["P1"]}})
    assert [(e.name, e.variant, e.gamma) for e in spec.plan] == [
        ("D erm γ 0", "erm", 0.0),
        ("D erm γ 1", "erm", 1.0),
        ("D primal-dual γ 0", "primal-dual", 0.0),
        ("D primal-dual γ 1", "primal-dual", 1.0),
        ("P1", "primal-dual", 1.0),
    ]
    one = parse_spec({"plan": {"E": {**PLAN["P1"], "gamma": [0.0, 1.0]}}}).plan
    assert [e.name for e in one] == ["E γ 0", "E γ 1"] and all(e.metric == "mse" for e in one)


def test_a_plan_naming_a_variant_the_bench_lacks_is_refused():
    with pytest.raises(ConfigError, match=r"bench\.plan\.P2\.against: no variant is labelled 'erm'"):
        parse_spec({"plan": {"P2": PLAN["P2"]}}, ["primal-dual"])


def test_changes_name_each_key_that_differs():
    old = {"plan": {"P1": {"gamma": 0.5, "variant": "a"}}, "baselines": ["erm"]}
    new = {"plan": {"P1": {"gamma": 1.0, "variant": "a"}, "P2": {"gamma": 0.0}}, "baselines": ["erm"]}
    assert changes(old, new) == ["bench.plan.P1.gamma 0.5 -> 1.0", "bench.plan.P2.gamma added (0.0)"]


def _bench(tmp_path, tiny, gamma: float) -> str:
    table = {
        **tiny,
        "bench": {
            "seeds": [0, 1],
            "variants": {
                "erm": {"solver": {"name": "erm"}},
                "primal-dual": {},
                "tune-primal-dual": {"seeds": [100], "eval": {"split": "validation"}},
            },
            "tuning": {"primal-dual": 1},
            "plan": {"P1": {**PLAN["P1"], "gamma": gamma, "against": "erm"}},
        },
    }
    path = tmp_path / "bench.toml"
    path.write_text(tomli_w.dumps(table))
    return str(path)


def test_a_plan_changed_after_the_runs_began_makes_the_bench_exploratory_and_names_the_change(tmp_path, tiny, capsys):
    tiny["eval"]["gammas"] = [0.0, 0.5, 1.0]
    out = str(tmp_path / "out")
    # the tuning run first; then the plan moves its endpoint: tuning runs are made under the tuning budgets alone
    assert main(["bench", _bench(tmp_path, tiny, 0.5), "--out", out, "--only", "tune-*"]) == 0
    assert main(["bench", _bench(tmp_path, tiny, 1.0), "--out", out, "--only", "erm"]) == 0
    ledger = json.loads((tmp_path / "out" / LEDGER).read_text())
    assert sorted(ledger["runs"]) == ["erm/seed-0", "erm/seed-1", "tune-primal-dual/seed-100"]
    assert main(["bench", _bench(tmp_path, tiny, 1.0), "--out", out]) == 0
    page = (tmp_path / "out" / "endpoints.md").read_text()
    assert "every one of the 5 runs with a recorded plan was made under it" in page and "exploratory" not in page.split("##")[1]
    # the endpoint moved back after the main runs began: every report of these runs says so, naming the change
    assert main(["report", out, "--bench", _bench(tmp_path, tiny, 0.5)]) == 0
    summary, page = ((tmp_path / "out" / name).read_text() for name in ("summary.md", "endpoints.md"))
    assert "## Primary endpoints (plan changed after the runs began: exploratory)" in summary
    assert "bench.plan.P1.gamma 1.0 -> 0.5" in summary and "bench.plan.P1.gamma 1.0 -> 0.5" in page
    assert "## Family primary: the claim (exploratory: the plan changed)" in page
    capsys.readouterr()


def test_a_bench_with_a_plan_records_it_even_for_a_spec_remembered_by_report(tmp_path):
    spec = BenchSpec(("erm",), plan=(Endpoint("P1", "primal-dual", "mse", False, 1.0),))
    write_report(three_solvers(tmp_path), spec=spec)
    write_report(tmp_path)  # report without --bench: the judging keys it was given before
    assert "| P1 (mse, lower is better) | primal-dual |" in (tmp_path / "summary.md").read_text()


# every listed bench whose committed record has an endpoints.md, by its own bench file (a re-evaluation has none of its own)
ENDPOINT_PAGES = [
    (Path(entry["runs"]).name, Path(entry["file"]).stem)
    for entry in tomllib.loads((REPO / "benchmarks" / "claims.toml").read_text())["bench"]
    if "command" not in entry and (REPO / "benchmarks" / entry["runs"] / "endpoints.md").exists()
]


@pytest.mark.parametrize("bench, file", ENDPOINT_PAGES, ids=[runs for runs, _ in ENDPOINT_PAGES])
def test_report_remakes_the_committed_endpoints_from_the_bench_files_plan(tmp_path, bench, file, monkeypatch):
    # what benchmarks/shift_endpoints.py, figure2_panels.py and depth_rule.py computed by hand is the bench file's [bench.plan], judged by report
    monkeypatch.setattr(report_module, "plot", lambda *args, **kwargs: [])  # the plots (95% of the time) are not what it checks
    committed = (REPO / "benchmarks" / "results" / bench / "endpoints.md").read_text()
    spec = read_spec(REPO / "benchmarks" / f"{file}.toml")
    write_report(REPO / "benchmarks" / "results" / bench, tmp_path, spec=spec)
    made = (tmp_path / "endpoints.md").read_text()
    assert made.splitlines()[1:] == committed.splitlines()[1:]  # the title is the folder's report's own


@pytest.mark.parametrize(
    "ledger, needle",
    [
        ("[" * 200_000, "nests"),
        (json.dumps({"plans": {}, "runs": {"erm/seed-0": ["a"]}}), "records run 'erm/seed-0' under a plan it does not keep"),
        (json.dumps({"plans": {"0" * 64: {"baselines": ["erm"]}}, "runs": {}}), "keeps a plan that does not hash to its key"),
        (json.dumps({"plans": [], "runs": {}}), "is not a plan ledger"),
    ],
)
def test_a_damaged_or_forged_plan_ledger_is_one_line_never_a_verdict(tmp_path, ledger, needle):
    three_solvers(tmp_path / "runs")
    (tmp_path / "runs" / LEDGER).write_text(ledger)
    (tmp_path / "bench.toml").write_text(tomli_w.dumps({"bench": {"baselines": ["erm"], "plan": {"P1": PLAN["P1"]}}}))
    status, lines = cli("report", str(tmp_path / "runs"), "--bench", str(tmp_path / "bench.toml"))
    assert status == 2 and len(lines) == 1 and needle in lines[0] and LEDGER in lines[0]
    assert not (tmp_path / "runs" / "summary.md").exists()


def test_a_link_where_the_plan_ledger_is_kept_is_refused_not_replaced(tmp_path):
    from layerdescent.analysis.registration import record

    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text("{}")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / LEDGER).symlink_to(elsewhere)
    with pytest.raises(Exception, match="symbolic link") as caught:
        record(tmp_path / "out", [("erm/seed-0", False)], parse_spec({"plan": {"P1": PLAN["P1"]}}))
    assert "\n" not in str(caught.value) and elsewhere.read_text() == "{}" and (tmp_path / "out" / LEDGER).is_symlink()
