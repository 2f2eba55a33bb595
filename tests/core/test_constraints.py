"""Descent and bound specs: their violations, gradients and Cooper compilation."""

from __future__ import annotations

import pytest
import torch

import layerdescent as ld
from layerdescent import Bound, ConfigError, Descent
from layerdescent.core.problem import LayerwiseProblem


def test_descent_violation_is_each_layer_against_the_previous_one_shrunk_by_alpha():
    means = torch.tensor([4.0, 3.0, 3.5])
    violation = Descent(alpha=0.5).violation(means, {})
    assert torch.allclose(violation, torch.tensor([3.0 - 2.0, 3.5 - 1.5]))


def test_descent_layers_select_transitions_and_accept_negative_indices():
    spec = Descent(layers=(1, -1))
    assert spec.transitions(4) == [1, 4]
    assert spec.labels(4) == ["l1<=l0", "l4<=l3"]


def test_descent_layer_outside_the_model_is_a_config_error():
    with pytest.raises(ConfigError, match="out of range"):
        Descent(layers=(9,)).check_layers(4)


@pytest.mark.parametrize("alpha", [-0.1, 1.0, 2.0])
def test_alpha_outside_unit_interval_is_rejected(alpha):
    with pytest.raises(ConfigError, match="alpha"):
        Descent(alpha=alpha)


def test_detached_reference_gives_no_gradient_to_the_previous_layer():
    for reference, expected in (("detached", 0.0), ("live", -0.9)):
        means = torch.tensor([2.0, 1.0], requires_grad=True)
        Descent(alpha=0.1, reference=reference).violation(means, {}).sum().backward()
        assert means.grad[0].item() == pytest.approx(expected)
        assert means.grad[1].item() == pytest.approx(1.0)


def test_anchored_reference_adds_an_entry_bounding_layer_zero_by_its_start_value():
    spec = Descent(reference="anchored")
    state = spec.initial_state(torch.tensor([2.0, 1.0]))
    violation = spec.violation(torch.tensor([2.5, 1.0]), state)
    assert spec.labels(1) == ["l1<=l0", "l0<=anchor"]
    assert violation[-1].item() == pytest.approx(0.5)


def test_anchored_reference_takes_a_given_bound():
    spec = Descent(reference="anchored", anchor=1.5)
    assert spec.initial_state(torch.tensor([9.0, 1.0]))["anchor"].item() == 1.5


def test_bound_violation_at_one_layer():
    assert Bound(value=0.5, layer=1).violation(torch.tensor([3.0, 1.0, 0.2]), {}).item() == pytest.approx(0.5)


def _update(specs, **options):
    primal = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    return ld.LayerwiseUpdate(specs, num_layers=2, optimizer=primal, **options)


def _step(update, means):
    """One step whose batch had these layer means (nothing to train: the primal step moves nothing)."""
    update.zero_grad()
    update.forward(torch.tensor(means))
    update.step()


def test_each_spec_compiles_to_one_multiplier_sized_to_its_violation():
    update = _update((Descent(name="d"), Bound(name="b", value=1.0)))
    sizes = {name: value.numel() for name, value in update.multipliers().items()}
    assert sizes == {"d": 2, "b": 1}


def test_dual_step_raises_lambda_by_the_violation_and_clips_the_other_at_zero():
    update = _update((Descent(alpha=0.0),), dual_lr=0.5)
    _step(update, [1.0, 2.0, 0.0])  # l1 violates by 1, l2 is 2 below l1: its ascent would go to -1
    assert update.multipliers()["descent"].tolist() == [0.5, 0.0]


def test_resilience_is_dual_weight_decay_and_logs_the_relaxation():
    update = _update((Descent(alpha=0.0, resilience=2.0),), dual_lr=1.0)
    for _ in range(200):
        _step(update, [1.0, 2.0, 2.0])  # a constant violation of 1 at l1
    # lambda climbs until the relaxation u = lambda / c absorbs the violation: lambda* = c * 1
    assert update.multipliers()["descent"][0].item() == pytest.approx(2.0, rel=1e-3)
    assert update.record()["relaxation"]["descent"][0] == pytest.approx(1.0, rel=1e-3)


def test_dual_every_epoch_moves_lambda_once_per_epoch_by_the_mean_of_the_epoch():
    update = _update((Descent(alpha=0.0),), dual_lr=1.0, dual_every="epoch")
    _step(update, [1.0, 2.0, 0.0])
    _step(update, [1.0, 0.0, 0.0])
    assert update.multipliers()["descent"].tolist() == [0.0, 0.0]  # nothing moves within the epoch
    update.end_epoch()
    assert update.multipliers()["descent"].tolist() == [0.0, 0.0]  # mean violation of l1 is 0
    _step(update, [1.0, 3.0, 0.0])
    update.end_epoch()
    assert update.multipliers()["descent"][0].item() == pytest.approx(2.0)


def test_a_spec_whose_violation_size_breaks_its_labels_is_refused_by_name():
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class Sloppy(Bound):
        kind = "sloppy"

        def violation(self, means, state):
            return means[1:] - self.value  # L entries, but labels() promises 1

    problem = LayerwiseProblem((Sloppy(name="mine"),), num_layers=2)
    with pytest.raises(
        ld.PluginError, match=r"constraint 'mine' \(sloppy\) returned a violation of shape \(2,\); its labels\(\) promise 1"
    ):
        problem.violations(torch.tensor([1.0, 2.0, 3.0]))
