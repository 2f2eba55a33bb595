"""The cross-bench claim table `layerdescent report --claims LIST` writes: each claim decided by the endpoints its bench's plan declares."""

from __future__ import annotations

import pytest
import tomli_w
from helpers import three_solvers, write_gamma_runs

from layerdescent.analysis.endpoints_file import parse_spec
from layerdescent.analysis.registration import plan_status, record
from layerdescent.analysis.report import collect
from layerdescent.cli import main
from layerdescent.errors import ConfigError

SEEDS = 7  # the fewest whose sign-flip test of rising counts can pass Holm's first step in a family of 3 (2/2^7 < 0.05/3)
MSE = "mse"


def claim_plan(after_runs: bool = False, family: str = "primary") -> dict:
    """The three claims for primal-dual, declared as their tests."""
    extra = {"after_runs": True, "family": "claims (after the runs)"} if after_runs else {"family": family}
    difference = {"variant": "primal-dual", "metric": MSE, "higher_is_better": False, **extra}
    return {
        "parity": {**difference, "claim": "parity", "gamma": 0.0, "test": "non-inferiority", "margin": "2%"},
        "degradation": {**difference, "claim": "degradation", "gamma": [0.5, 1.0, 2.0], "aggregate": "area"},
        "descent": {"variant": "primal-dual", "claim": "descent", "statistic": "rising", "test": "superiority", "gamma": 0.0, **extra},
    }


def bench_runs(root) -> None:
    """primal-dual level with erm in distribution, clearly better beyond it, and without erm's rising layer, in every seed."""
    erm = [[0.50 + 0.01 * s, 0.6 + 0.01 * s, 0.8 + 0.02 * s, 1.2 + 0.01 * s] for s in range(SEEDS)]
    pd = [[0.50 + 0.01 * s + 0.0002 * (s % 2), 0.5 + 0.01 * s, 0.6 + 0.02 * s, 0.9 + 0.012 * s] for s in range(SEEDS)]
    write_gamma_runs(root, {"erm": erm, "primal-dual": pd}, {"erm": [[1.0, 1.2, 0.9]] * SEEDS, "primal-dual": [[1.0, 0.8, 0.6]] * SEEDS})


def claims(tmp_path, plan: dict | None, entries: list[dict] | None = None, baselines=("erm",)) -> str:
    """REPORT.md as `layerdescent report --claims` writes it for one lista bench whose plan is ``plan``."""
    folder = tmp_path / "benchmarks"
    bench = {"seeds": list(range(SEEDS)), "baselines": list(baselines), **({"plan": plan} if plan else {})}
    folder.mkdir(exist_ok=True)
    (folder / "lista.toml").write_text(tomli_w.dumps({"bench": bench}))
    entries = entries or [{"title": "lista", "file": "lista.toml", "runs": "results/lista"}]
    (folder / "claims.toml").write_text(tomli_w.dumps({"bench": entries}))
    assert main(["report", "--claims", str(folder / "claims.toml")]) == 0
    return (folder / "REPORT.md").read_text()


def claim_row(text: str, title: str = "lista") -> list[str]:
    """The claim table's row of ``title``: family, then descent, degradation and parity."""
    line = next(line for line in text.splitlines() if line.startswith(f"| {title} |"))
    return [cell.strip() for cell in line.strip("|").split("|")][1:]


def test_each_claim_is_decided_by_the_test_its_endpoint_declares(tmp_path):
    bench_runs(tmp_path / "benchmarks" / "results" / "lista")
    family, descent, degradation, parity = claim_row(claims(tmp_path, claim_plan()))
    assert family == "pre-registered"
    assert descent.startswith("holds: better, rising transitions") and "vs erm, at γ 0" in descent
    assert degradation.startswith("holds: better, mse") and "area over γ 0.5–2" in degradation
    assert parity.startswith("holds: non-inferior, mse") and "margin 0.0" in parity


def test_claims_declared_after_the_runs_are_exploratory_and_parity_stays_undecided(tmp_path):
    bench_runs(tmp_path / "benchmarks" / "results" / "lista")
    text = claims(tmp_path, claim_plan(after_runs=True))
    family, descent, degradation, parity = claim_row(text)
    assert family == "exploratory (declared after the runs)"
    assert descent.startswith("exploratory: holds") and degradation.startswith("exploratory: holds")
    assert parity.startswith("undecided (margin declared after the runs); exploratory: holds: non-inferior")
    assert "| parity | after the runs |" in text


def test_a_wide_parity_interval_is_not_shown_and_a_bench_without_claims_says_so(tmp_path):
    wide = {"erm": [[0.5] * 4, [0.5] * 4, [0.5] * 4], "primal-dual": [[0.42] * 4, [0.58] * 4, [0.5] * 4]}
    write_gamma_runs(tmp_path / "benchmarks" / "results" / "lista", wide)
    parity = claim_row(claims(tmp_path, {"parity": claim_plan()["parity"]}))[3]
    assert parity.startswith("not shown: not shown non-inferior") and "holds" not in parity
    family, descent, _, parity = claim_row(claims(tmp_path, None))
    assert (family, descent, parity) == ("no claim declared", "no endpoint declared", "undecided (no margin declared)")


def test_degradation_against_the_strongest_baseline_is_not_shown_where_penalty_matches_it(tmp_path):
    three_solvers(tmp_path / "benchmarks" / "results" / "lista")  # primal-dual beats erm at gamma 1, ties penalty
    plan = {"degradation": {**claim_plan()["degradation"], "gamma": 1.0}}
    plan["degradation"].pop("aggregate")
    assert claim_row(claims(tmp_path, plan))[2].startswith("holds: better")
    against_both = claim_row(claims(tmp_path, plan, baselines=("erm", "penalty")))[2]
    assert against_both.startswith("not shown: no difference") and "vs penalty" in against_both


def test_an_endpoint_declared_after_the_runs_stays_out_of_the_plan_record_and_one_added_without_saying_so_is_flagged(tmp_path):
    root = tmp_path / "benchmarks" / "results" / "lista"
    bench_runs(root)
    before = parse_spec({"plan": {"degradation": claim_plan()["degradation"]}})
    record(root, [(f"{label}/seed-{s}", False) for label in ("erm", "primal-dual") for s in range(SEEDS)], before)
    later = {"degradation": claim_plan()["degradation"], "parity": claim_plan(after_runs=True)["parity"]}
    assert plan_status(root, collect(root), parse_spec({"plan": later})).changed == ()
    unmarked = {**later, "parity": claim_plan(family="primary")["parity"]}
    assert any("bench.plan.parity" in change for change in plan_status(root, collect(root), parse_spec({"plan": unmarked})).changed)
    family, *cells = claim_row(claims(tmp_path, unmarked))
    assert family == "exploratory (plan changed)" and all(c.startswith(("exploratory", "undecided")) for c in cells)


@pytest.mark.parametrize(
    "edit, message",
    [
        ({"test": "superiority"}, "claim = 'parity' is decided by a non-inferiority or equivalence test within a margin"),
        ({"claim": "monotone"}, "claim must be one of descent, degradation, parity"),
        ({"after_runs": "yes"}, "after_runs must be true or false"),
        ({"after_runs": True}, "cannot join the pre-registered family 'primary'"),
    ],
)
def test_a_claim_endpoint_of_the_wrong_kind_is_one_line(edit, message):
    parity = {**claim_plan()["parity"], **edit}
    if edit.get("test") == "superiority":
        parity.pop("margin")
    with pytest.raises(ConfigError, match=message):
        parse_spec({"plan": {"parity": parity}})


def test_re_evaluations_and_earlier_benches_are_listed_not_judged_and_summaries_name_the_command(tmp_path):
    bench_runs(tmp_path / "benchmarks" / "results" / "lista")
    entries = [
        {"title": "lista", "file": "lista.toml", "runs": "results/lista"},
        {"title": "lista, salt", "file": "lista.toml", "runs": "results/lista", "command": "layerdescent evaluate X --out Y"},
        {"title": "old lista", "file": "lista.toml", "runs": "results/lista", "superseded_by": "lista"},
    ]
    text = claims(tmp_path, claim_plan(), entries)
    assert (
        "### lista, salt\n\nRuns: `layerdescent evaluate X --out Y`" in text
        and "| old lista | lista | [summary](results/lista/summary.md) |" in text
    )
    assert [line.split("|")[1].strip() for line in text.split("\n## ")[0].splitlines() if line.startswith("| ")][1:] == ["lista"]
    folder = tmp_path / "benchmarks"
    assert main(["report", "--claims", str(folder / "claims.toml"), "--summaries"]) == 0
    summary = (folder / "results" / "lista" / "summary.md").read_text()
    assert f"this summary by `layerdescent report --claims {folder / 'claims.toml'} --summaries`" in summary


@pytest.mark.parametrize(
    "entries, message",
    [
        ([{"title": "lista", "file": "lista.toml"}], "missing key 'runs'"),
        ([{"title": "lista", "file": "lista.toml", "runs": "r", "extra": 1}], "unknown key 'extra'"),
        ([{"title": "lista", "file": "lista.toml", "runs": "r", "workers": "2"}], "workers = '2' has the wrong type"),
    ],
)
def test_a_bad_claims_list_is_one_line(tmp_path, capsys, entries, message):
    (tmp_path / "claims.toml").write_text(tomli_w.dumps({"bench": entries}))
    assert main(["report", "--claims", str(tmp_path / "claims.toml")]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_a_claim_in_a_larger_pre_registered_family_is_adjusted_over_the_whole_family(tmp_path):
    bench_runs(tmp_path / "benchmarks" / "results" / "lista")
    others = {f"dose-{g:g}": {**claim_plan()["degradation"], "gamma": g} for g in (0.5, 1.0)}
    for e in others.values():
        e.pop("claim"), e.pop("aggregate")
    text = claims(tmp_path, {"degradation": claim_plan()["degradation"], **others})
    row = next(line for line in text.splitlines() if line.startswith("| degradation ("))
    judged = parse_spec({"plan": {"degradation": claim_plan()["degradation"], **others}})
    from layerdescent.analysis.judging import judge

    (alone,) = [
        c for c in judge(collect(tmp_path / "benchmarks" / "results" / "lista"), judged, judged.endpoints()) if c["name"] == "degradation"
    ]
    assert alone["m"] == 3 and f"| {alone['p_holm']:.2g} |" in row
    assert "Its pre-registered family (`primary`, Holm over its 3 endpoints" in text and "): 1 better, 2 no difference." in text
