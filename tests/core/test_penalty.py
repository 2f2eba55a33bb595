"""Deep supervision's layer weights as a family and its parameters: torchtune's early-exit scales, and geometric."""

from __future__ import annotations

import math

import pytest
import torch

import layerdescent as ld
from layerdescent.core.penalty import Penalty, PenaltyOptions, layer_weights


def normalized(raw: list[float]) -> list[float]:
    return [w / sum(raw) for w in raw]


# Readout k = 0..3 of a 3-layer model is torchtune's layer n = k + 1 (its layer_ids + 1).
FORMULAS = {
    "uniform": [1, 1, 1, 1],
    "linear": [1, 2, 3, 4],
    "sum": [1, 3, 6, 10],  # torchtune's cumsum(layer_ids + 1)
    "sqrt": [math.sqrt(n) for n in (1, 2, 3, 4)],
    "inv": [1 / n for n in (1, 2, 3, 4)],
    "inv_sqrt": [1 / math.sqrt(n) for n in (1, 2, 3, 4)],
    "geometric": [0.5**3, 0.5**2, 0.5, 1],  # rho^(L - k), rho 0.5
}


@pytest.mark.parametrize("family", sorted(FORMULAS))
def test_each_weight_family_is_its_formula_normalized_to_one(family):
    assert layer_weights(family, 3, rho=0.5) == pytest.approx(normalized(FORMULAS[family]), rel=1e-12)


def test_scale_multiplies_every_layer_but_the_last_as_torchtune_e_scale_does():
    raw = [1 * 0.1, 2 * 0.1, 3 * 0.1, 4]
    assert layer_weights("linear", 3, scale=0.1) == pytest.approx(normalized(raw), rel=1e-12)
    assert layer_weights("uniform", 3, scale=0.0) == (0.0, 0.0, 0.0, 1.0)  # the last layer alone: erm's objective


def test_a_family_weighs_the_layer_means_as_its_list_written_out_does():
    means = torch.tensor([4.0, 3.0, 2.0, 1.5, 1.0], dtype=torch.float64)
    family = Penalty(PenaltyOptions(weights="geometric", rho=0.7), problem=None).objective(means)
    listed = Penalty(PenaltyOptions(penalty_weights=tuple(0.7 ** (4 - k) for k in range(5))), problem=None).objective(means)
    assert family.item() == pytest.approx(listed.item(), rel=1e-12)
    assert Penalty(PenaltyOptions(), problem=None).objective(means).item() == means.mean().item()  # the default, as before


@pytest.mark.parametrize(
    "solver, message",
    [
        ({"weights": "cubic"}, "solver.weights = 'cubic' is not allowed"),
        ({"weights": "geometric", "rho": 0.0}, "solver.rho must be > 0, got 0.0"),
        ({"scale": -1.0}, "solver.scale must be >= 0, got -1.0"),
        ({"weights": "linear", "penalty_weights": [1, 1, 1, 1, 1]}, "give one or the other"),
    ],
)
def test_a_weight_family_mistake_is_one_line(tiny, solver, message):
    tiny["solver"] = {"name": "penalty", **solver}
    with pytest.raises(ld.ConfigError, match=message):
        ld.config_from_dict(tiny)


def test_a_penalty_run_trains_with_a_family_and_records_it_in_its_config(tiny, tmp_path):
    tiny["solver"] = {"name": "penalty", "weights": "inv_sqrt", "scale": 0.5}
    config = ld.config_from_dict(tiny)
    results = ld.train(config, tmp_path / "run")
    assert all(math.isfinite(v) for v in results["gammas"][0]["layer_loss"])
    assert 'weights = "inv_sqrt"' in (tmp_path / "run" / "config.toml").read_text()
