"""The tests a plan declares: non-inferiority and equivalence within a margin, curve endpoints over a γ range, tested descent, and one verdict rule."""

from __future__ import annotations

import numpy as np
import pytest
import tomli_w
from helpers import write_gamma_runs as runs
from hypothesis import given, settings
from hypothesis import strategies as st

from layerdescent.analysis.endpoints_file import parse_spec
from layerdescent.analysis.judging import FAMILY_ALPHA, judge
from layerdescent.analysis.report import collect
from layerdescent.analysis.stats import holm, holm_levels, one_sided_p, paired_difference, sign_flip, sign_flip_p
from layerdescent.cli import main
from layerdescent.errors import ConfigError


def report(tmp_path, plan: dict, baselines=("erm",)) -> str:
    """endpoints.md as `layerdescent report RUNS --bench FILE` writes it for ``plan``."""
    (tmp_path / "bench.toml").write_text(tomli_w.dumps({"bench": {"baselines": list(baselines), "plan": plan}}))
    assert main(["report", str(tmp_path / "runs"), "--bench", str(tmp_path / "bench.toml")]) == 0
    return (tmp_path / "runs" / "endpoints.md").read_text()


def row(page: str, name: str) -> list[str]:
    """The cells of the endpoints.md row whose endpoint starts with ``name``."""
    line = next(line for line in page.splitlines() if line.startswith(f"| {name} ("))
    return [cell.strip() for cell in line.strip("|").split("|")]


PARITY = {"variant": "primal-dual", "metric": "mse", "higher_is_better": False, "gamma": 0.0, "test": "non-inferiority"}


def test_a_wide_interval_is_not_shown_non_inferior_never_parity(tmp_path):
    # the two sides differ by up to ±0.08 from seed to seed: the mean difference is 0, the interval wide
    runs(tmp_path / "runs", {"erm": [[0.5] * 4, [0.5] * 4, [0.5] * 4], "primal-dual": [[0.42] * 4, [0.58] * 4, [0.5] * 4]})
    page = report(tmp_path, {"parity": {**PARITY, "margin": 0.01}})
    cells = row(page, "parity")
    assert cells[8] == "not shown non-inferior" and "margin 0.01" in cells[5]
    assert "holds" not in page and "non-inferior |" not in page.replace("not shown non-inferior |", "")


def test_a_narrow_interval_within_the_margin_is_non_inferior_and_one_beyond_it_inferior(tmp_path):
    erm = [[0.50] * 4, [0.52] * 4, [0.51] * 4, [0.49] * 4]
    close = [[0.501] * 4, [0.519] * 4, [0.512] * 4, [0.491] * 4]  # a hair worse, far inside 2%
    far = [[0.60] * 4, [0.63] * 4, [0.61] * 4, [0.59] * 4]  # 20% worse, beyond it
    runs(tmp_path / "runs", {"erm": erm, "primal-dual": close, "penalty-like": far})
    plan = {"near": {**PARITY, "margin": "2%"}, "far": {**PARITY, "variant": "penalty-like", "against": "erm", "margin": "2%"}}
    page = report(tmp_path, plan)
    assert row(page, "near")[8] == "non-inferior" and row(page, "far")[8] == "inferior"
    # the relative margin is 2% of the baseline's mean mse at γ 0 (0.505)
    assert "margin 0.0101" in row(page, "near")[5]


def test_equivalence_needs_the_interval_inside_both_margins(tmp_path):
    erm = [[0.50] * 4, [0.52] * 4, [0.51] * 4, [0.49] * 4]
    same = [[0.501] * 4, [0.519] * 4, [0.511] * 4, [0.490] * 4]
    runs(tmp_path / "runs", {"erm": erm, "primal-dual": same})
    page = report(
        tmp_path, {"eq": {**PARITY, "test": "equivalence", "margin": 0.01}, "tight": {**PARITY, "test": "equivalence", "margin": 1e-5}}
    )
    assert row(page, "eq")[8] == "equivalent" and row(page, "tight")[8] == "not shown equivalent"


def test_an_area_endpoint_is_the_trapezoid_over_its_gammas_paired_by_seed(tmp_path):
    erm = [[0.1, 0.3, 0.6, 1.2], [0.1, 0.32, 0.62, 1.3], [0.1, 0.31, 0.61, 1.25]]
    pd = [[0.1, 0.2, 0.4, 0.9], [0.1, 0.25, 0.45, 1.0], [0.1, 0.21, 0.42, 0.92]]
    root = runs(tmp_path / "runs", {"erm": erm, "primal-dual": pd})
    spec = parse_spec(
        {
            "plan": {
                "A": {"variant": "primal-dual", "metric": "mse", "higher_is_better": False, "gamma": [0.5, 1.0, 2.0], "aggregate": "area"}
            }
        }
    )
    (cell,) = judge(collect(root), spec, spec.endpoints())

    def area(mse):  # by hand: trapezoids over [0.5, 1] and [1, 2]
        return 0.5 * (mse[1] + mse[2]) / 2 + 1.0 * (mse[2] + mse[3]) / 2

    by_hand = paired_difference([-area(m) for m in pd], [-area(m) for m in erm])
    assert cell["difference"]["mean"] == pytest.approx(by_hand["mean"]) and cell["difference"]["p"] == pytest.approx(by_hand["p"])
    assert cell["at"] == "area over γ 0.5–2" and cell["verdict"] == "better"


def test_a_mean_endpoint_averages_the_listed_gammas_and_is_one_test_in_its_family(tmp_path):
    erm = [[0.1, 0.3, 0.6, 1.2], [0.1, 0.32, 0.62, 1.3], [0.1, 0.31, 0.61, 1.25]]
    pd = [[0.1, 0.2, 0.4, 0.9], [0.1, 0.25, 0.45, 1.0], [0.1, 0.21, 0.42, 0.92]]
    root = runs(tmp_path / "runs", {"erm": erm, "primal-dual": pd})
    e = {"variant": "primal-dual", "metric": "mse", "higher_is_better": False}
    spec = parse_spec({"plan": {"M": {**e, "gamma": [1.0, 2.0], "aggregate": "mean"}, "P": {**e, "gamma": 0.5}}})
    m, _ = judge(collect(root), spec, spec.endpoints())
    by_hand = paired_difference([-(x[2] + x[3]) / 2 for x in pd], [-(x[2] + x[3]) / 2 for x in erm])
    assert m["difference"]["mean"] == pytest.approx(by_hand["mean"]) and m["m"] == 2


def test_tested_descent_counts_each_seeds_rising_transitions_against_the_baseline(tmp_path):
    flat = [[0.0] * 4] * 6
    descends = [[1.0, 0.8, 0.6, 0.5]] * 5 + [[1.0, 0.8, 0.9, 0.5]]  # one seed rises once
    rises = [[1.0, 1.2, 0.6, 0.7]] * 3 + [[1.0, 1.2, 0.6, 0.5]] * 2 + [[1.0, 1.2, 0.6, 0.7]]  # two rises, or one
    root = runs(tmp_path / "runs", {"erm": flat, "primal-dual": flat}, {"erm": rises, "primal-dual": descends})
    spec = parse_spec({"plan": {"D": {"variant": "primal-dual", "gamma": 0.5, "statistic": "rising", "test": "superiority"}}})
    (cell,) = judge(collect(root), spec, spec.endpoints())
    counts_pd, counts_erm = [0, 0, 0, 0, 0, 1], [2, 2, 2, 1, 1, 2]
    assert cell["a"] == [-c for c in counts_pd] and cell["b"] == [-c for c in counts_erm]
    assert cell["difference"]["p"] == sign_flip_p(np.subtract(counts_erm, counts_pd)) == pytest.approx(2 / 64)
    assert cell["verdict"] == "better"
    page = report(tmp_path, {"D": {"variant": "primal-dual", "gamma": 0.5, "statistic": "rising", "test": "superiority"}})
    assert row(page, "D")[0] == "D (rising transitions, fewer is better)" and row(page, "D")[8] == "better"


def test_a_rising_endpoint_without_a_test_is_still_described(tmp_path):
    root = runs(tmp_path / "runs", {"erm": [[0.0] * 4] * 2, "primal-dual": [[0.0] * 4] * 2})
    spec = parse_spec({"plan": {"D": {"variant": "primal-dual", "gamma": 0.5, "statistic": "rising"}}})
    (cell,) = judge(collect(root), spec, spec.endpoints())
    assert cell["rises"] == [] and "verdict" not in cell


def test_the_verdict_and_interval_belong_to_the_comparison_that_decided_a_cell_like_dose_dust_0_13(tmp_path):
    # video_levels' dose-dust-0.13: penalty-band had the best mean and the row showed its interval, while erm-band's
    # larger p decided the cell; here penalty is the strongest and levels beats it steadily, erm is close behind but noisy
    offsets = [0.004, -0.003, 0.005, -0.004, 0.002]
    penalty = [[0.1, 0.100 + 0.0002 * s + 0.0001 * (s % 2), 0.1, 0.1] for s in range(5)]
    erm = [[0.1, 0.1010 + offsets[s], 0.1, 0.1] for s in range(5)]
    levels = [[0.1, 0.097 + 0.0002 * s, 0.1, 0.1] for s in range(5)]
    root = runs(tmp_path / "runs", {"erm": erm, "penalty": penalty, "levels": levels})
    e = {"variant": "levels", "metric": "mse", "higher_is_better": False, "gamma": 0.5}
    spec = parse_spec({"baselines": ["erm", "penalty"], "plan": {"dose": e, "other": {**e, "gamma": 1.0, "against": "erm"}}})
    cell, _ = judge(collect(root), spec, spec.endpoints())
    assert cell["baseline"] == "penalty" and cell["decided_by"] == "erm"
    a, b = cell["a"], [-x[1] for x in erm]
    assert cell["difference"] == {**paired_difference(a, b), "p": paired_difference(a, b)["p"]}
    assert cell["simultaneous"] == paired_difference(a, b, 1 - cell["level"])  # erm's interval, at Holm's level for the cell
    page = report(tmp_path, {"dose": e, "other": {**e, "gamma": 1.0, "against": "erm"}}, baselines=("erm", "penalty"))
    assert row(page, "dose")[4] == "erm (strongest: penalty)"
    shown = cell["simultaneous"]
    assert (cell["verdict"] in ("better", "worse")) == (shown["low"] > 0 or shown["high"] < 0)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.lists(st.floats(-1, 1), min_size=6, max_size=6), min_size=1, max_size=5),
    st.sampled_from(["superiority", "non-inferiority", "rising"]),
)
def test_a_verdict_never_disagrees_with_the_interval_beside_it(differences, test):
    """Holm's step-down and the intervals at its levels decide alike, whatever the family."""
    pairs = [(np.asarray(d), np.zeros(6)) for d in differences]
    margin = 0.1
    if test == "superiority":
        ps = [paired_difference(a, b)["p"] for a, b in pairs]
    elif test == "non-inferiority":
        ps = [one_sided_p(a, b, margin) for a, b in pairs]
    else:
        pairs = [(np.round(a * 3), b) for a, b in pairs]
        ps = [sign_flip(a, b)["p"] for a, b in pairs]
    for (a, b), p, p_holm, level in zip(pairs, ps, holm(ps), holm_levels(ps, FAMILY_ALPHA)):
        if test == "superiority":
            d = paired_difference(a, b, 1 - level)
            excludes = d["low"] is not None and (d["low"] > 0 or d["high"] < 0)
        elif test == "non-inferiority":
            d = paired_difference(a, b, 1 - 2 * level)
            excludes = d["low"] is not None and d["low"] > -margin
        else:
            d = sign_flip(a, b, 1 - level)
            excludes = d["low"] > 0 or d["high"] < 0
        assert excludes == (p_holm is not None and p_holm <= FAMILY_ALPHA), (p, p_holm, level, d)


@pytest.mark.parametrize(
    "endpoint, message",
    [
        ({**PARITY}, "bench.plan.P: a non-inferiority test needs the margin it is judged within"),
        ({**PARITY, "margin": -0.1}, "bench.plan.P.margin must be > 0"),
        ({**PARITY, "margin": "two"}, "bench.plan.P.margin must be > 0"),
        ({**PARITY, "test": "superiority", "margin": 0.1}, "bench.plan.P.margin belongs to a non-inferiority or equivalence test"),
        ({**PARITY, "test": "parity", "margin": 0.1}, "bench.plan.P.test must be one of superiority, non-inferiority, equivalence"),
        ({**PARITY, "margin": 0.1, "gamma": [0.5], "aggregate": "area"}, "bench.plan.P.gamma: aggregate 'area' needs a list of 2"),
        ({**PARITY, "margin": 0.1, "gamma": [0.5, 1.0], "aggregate": "sum"}, "bench.plan.P.aggregate must be one of mean, area"),
        ({**PARITY, "margin": 0.1, "gamma": ["a", "b"]}, "bench.plan.P.gamma must be perturbation levels >= 0"),
        ({**PARITY, "margin": 0.1, "gamma": [[0.5], [0.0]]}, "bench.plan.P.gamma must be perturbation levels >= 0"),
        ({**PARITY, "margin": 0.1, "gamma": float("inf")}, "bench.plan.P.gamma must be one perturbation level >= 0"),
        ({**PARITY, "margin": 0.1, "gamma": [0.1] * 200_000}, "bench.plan.P.gamma lists 200,000 values; at most 1,000"),
        ({**PARITY, "margin": 0.1, "against": "primal-dual"}, "bench.plan.P.against names the endpoint's own variant"),
        (
            {"variant": "pd", "gamma": [0.5, 1.0], "statistic": "rising", "aggregate": "mean"},
            "bench.plan.P.aggregate: a rising endpoint reads one gamma",
        ),
        (
            {"variant": "pd", "gamma": 0.5, "statistic": "rising", "test": "equivalence"},
            "bench.plan.P.test must be one of described, superiority",
        ),
    ],
)
def test_a_bad_declared_test_is_one_line(endpoint, message):
    with pytest.raises(ConfigError, match="^" + message.replace(".", r"\.").replace("(", r"\(")) as caught:
        parse_spec({"plan": {"P": endpoint}})
    assert "\n" not in str(caught.value)


def test_an_endpoint_reports_rliables_iqm_and_probability_of_improvement_beside_its_test(tmp_path):
    erm = [[0.5] * 4, [0.52] * 4, [0.51] * 4, [0.49] * 4, [0.6] * 4]
    pd = [[0.48] * 4, [0.515] * 4, [0.50] * 4, [0.47] * 4, [0.45] * 4]
    runs(tmp_path / "runs", {"erm": erm, "primal-dual": pd})
    page = report(tmp_path, {"P": {**PARITY, "test": "superiority", "also": ["iqm", "probability of improvement"]}})
    a, b = [-x[0] for x in pd], [-x[0] for x in erm]
    # by hand: the middle half of five values is the middle three; of the 25 pairs, a tie (0.5 and 0.5) counts half
    iqm_by_hand = np.mean(sorted(a)[1:4]) - np.mean(sorted(b)[1:4])
    poi_by_hand = np.mean([(x > y) + 0.5 * (x == y) for x in a for y in b])
    rows = {line.split("|")[3].strip(): line for line in page.splitlines() if line.startswith("| P |")}
    assert f"{iqm_by_hand:+.3g} [" in rows["iqm"] and f"{poi_by_hand:+.3g} [" in rows["probability of improvement"]
    again = report(tmp_path, {"P": {**PARITY, "test": "superiority", "also": ["iqm", "probability of improvement"]}})
    assert again == page  # seeded: the record regenerates byte for byte
