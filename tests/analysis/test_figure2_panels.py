"""benchmarks/figure2_panels.py: each Figure 2 panel's descent, cost, families and multipliers, and V2's mean over the unseen videos."""

from __future__ import annotations

import importlib.util

import pytest
from helpers import REPO, assert_script_remakes

from layerdescent.analysis.endpoints import rising_transitions

spec = importlib.util.spec_from_file_location("figure2_panels", REPO / "benchmarks" / "figure2_panels.py")
panels = importlib.util.module_from_spec(spec)
spec.loader.exec_module(panels)


def _record(gamma: float, rmse: float, layer_loss: list[float]) -> dict:
    return {"gamma": gamma, "metrics": {"rmse": rmse}, "layer_loss": layer_loss, "descent_rate": [1.0] * (len(layer_loss) - 1)}


def test_the_unseen_view_averages_each_gamma_over_the_domains_every_domain_has():
    run = {
        "label": "vtest-dust-erm",
        "gammas": [_record(0.13, 9.0, [9.0, 9.0])],
        "domains": {
            "carphone": [_record(0.0, 0.1, [1.0, 0.5]), _record(0.13, 0.2, [2.0, 1.0])],
            "bikes": [_record(0.13, 0.4, [4.0, 3.0])],
        },
    }
    (view,) = panels.unseen_mean([run, {"label": "no-domains", "gammas": []}])
    assert [g["gamma"] for g in view["gammas"]] == [0.13]  # 0.0 is carphone's alone
    assert view["gammas"][0]["metrics"]["rmse"] == pytest.approx(0.3)
    assert view["gammas"][0]["layer_loss"] == pytest.approx([3.0, 2.0])


def test_a_rise_is_counted_at_the_layer_it_reaches():
    assert rising_transitions([1.0, 0.8, 0.9, 0.7, 0.7, 0.75]) == [2, 5]  # equal is no rise


def test_a_panel_cell_names_the_rising_layers_and_the_largest_rise_relative_to_the_loss():
    groups = {"pd": {"gammas": {0.13: {"layer_loss": {"mean": [1.0, 0.8, 0.82, 0.5, 0.55]}}}}}
    assert panels.rises_cell(groups, "pd", 0.13) == "2 of 4 (l2, l4; at most +10%)"
    groups["pd"]["gammas"][0.13]["layer_loss"]["mean"] = [1.0, 0.8]
    assert panels.rises_cell(groups, "pd", 0.13) == "0 of 1"
    assert panels.rises_cell(groups, None, 0.13) == panels.rises_cell(groups, "pd", 0.5) == "–"


@pytest.mark.parametrize("bench", ["video_paper", "video_deep"])
def test_the_script_reproduces_the_committed_panels(tmp_path, bench):
    root = REPO / "benchmarks/results" / bench
    assert_script_remakes(tmp_path, root / "panels.md", "figure2_panels.py", str(root), "--bench", str(REPO / f"benchmarks/{bench}.toml"))
