"""docs/solvers.md's examples run as written, and its dual method, written only against the documented surface, does what the page says."""

from __future__ import annotations

import copy
import re
import sys
import types
from pathlib import Path

import pytest
import torch
from helpers import docs_block

import layerdescent as ld
from layerdescent.registry import Registry

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "solvers.md"


@pytest.fixture
def guide(monkeypatch) -> types.ModuleType:
    """The guide's dual method, as the module a user would write (dataclasses look their module up)."""
    module = types.ModuleType("capped_decay")
    monkeypatch.setitem(sys.modules, "capped_decay", module)
    exec(compile(docs_block("dual-method", GUIDE), "docs/solvers.md:capped_decay.py", "exec"), module.__dict__)
    return module


@pytest.fixture
def registry(guide) -> Registry:
    return Registry(extra_plugins=[("capped-decay", guide)])


def test_every_python_block_of_the_guide_runs_in_order():
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), re.S)
    assert len(blocks) >= 2
    module = types.ModuleType("solver_guide")
    sys.modules["solver_guide"] = module
    try:
        for k, block in enumerate(blocks):
            exec(compile(block, f"docs/solvers.md:block{k}", "exec"), module.__dict__)
    finally:
        del sys.modules["solver_guide"]
    assert module.update.solver.dual_steps == 20


def _update(registry, **options):
    param = torch.nn.Parameter(torch.zeros(1))
    return ld.LayerwiseUpdate(
        [ld.Descent(alpha=0.0)],
        num_layers=2,
        optimizer=torch.optim.SGD([param], lr=0.1),
        solver="capped-decay",
        registry=registry,
        **options,
    )


def _dual_steps(update, means, steps):
    history = []
    for _ in range(steps):
        update.zero_grad()
        update.forward(torch.tensor(means))
        update.step()
        history.append(update.multipliers()["descent"].tolist())
    return history


def test_the_guide_method_ascends_the_decayed_violation_and_projects_onto_the_cap(registry):
    # violations (1.0, -0.5): l1 rises by 1, l2 falls by 0.5; dual_lr 0.5, decay 0.2, cap 0.8
    update = _update(registry, dual_lr=0.5, dual_decay=0.2, cap=0.8)
    history = _dual_steps(update, [1.0, 2.0, 1.5], 3)
    lam = 0.0
    for got in history:
        lam = min(max(lam + 0.5 * (1.0 - 0.2 * lam), 0.0), 0.8)
        assert got[0] == pytest.approx(lam) and got[1] == 0.0  # a met constraint's lambda stays at 0
    assert history[-1][0] == pytest.approx(0.8)  # capped, where plain ascent would have passed it
    plain = ld.LayerwiseUpdate(
        [ld.Descent(alpha=0.0)], num_layers=2, optimizer=torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1), dual_lr=0.5
    )
    assert _dual_steps(plain, [1.0, 2.0, 1.5], 3)[-1][0] == pytest.approx(1.5)


def test_the_guide_method_keeps_its_own_state_across_a_checkpoint(registry):
    update = _update(registry, dual_lr=0.5, dual_every=2)
    _dual_steps(update, [1.0, 2.0, 1.5], 3)  # an odd count: the window holds a step when saved
    copy_ = _update(registry, dual_lr=0.5, dual_every=2)
    copy_.load_state_dict(update.state_dict())
    assert copy_.solver.dual_steps == update.solver.dual_steps == 1
    assert _dual_steps(copy_, [1.0, 2.0, 1.5], 1) == _dual_steps(update, [1.0, 2.0, 1.5], 1)
    assert copy_.solver.dual_steps == 2


@pytest.mark.parametrize("scheme", ["simultaneous", "alternating", "alternating-primal-dual", "extrapolation"])
def test_the_guide_method_runs_under_every_scheme_with_its_cap(registry, scheme):
    torch.manual_seed(0)
    layers = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(2))
    params = list(layers.parameters())
    primal = ld.PrimalDual.scheme_of(ld.PrimalDualOptions(scheme=scheme)).primal_optimizer(
        params,
        ld.config_from_dict({"task": {"name": "lista"}, "train": {"optimizer": "sgd", "lr": 0.05}}).train,
    )
    update = ld.LayerwiseUpdate(
        [ld.Descent(alpha=0.5)],
        num_layers=2,
        optimizer=primal,
        solver="capped-decay",
        registry=registry,
        scheme=scheme,
        dual_lr=1.0,
        cap=0.3,
    )
    x = torch.randn(16, 4)

    def backward():
        h, losses = x, [(x**2).mean(1)]
        for layer in layers:
            h = h + torch.tanh(layer(h))
            losses.append((h**2).mean(1))
        update.backward(torch.stack(losses, dim=1))

    for _ in range(6):
        update.zero_grad()
        backward()
        update.step(closure=backward)
    lam = update.multipliers()["descent"]
    assert bool((lam > 0).any()) and bool((lam <= 0.3).all()) and update.solver.dual_steps == 6


@pytest.mark.parametrize("scheme, primal_steps_before", [("simultaneous", [1, 2, 3]), ("alternating", [0, 1, 2])])
def test_under_alternating_a_steps_dual_step_comes_before_its_primal_step_as_the_guide_says(registry, scheme, primal_steps_before):
    # a warm-up that switches after n dual steps switches one primal step earlier under alternating
    param = torch.nn.Parameter(torch.ones(3))
    primal = torch.optim.SGD([param], lr=0.01)
    taken, seen = [0], []
    step = primal.step
    primal.step = lambda *a, **k: (taken.__setitem__(0, taken[0] + 1), step(*a, **k))[1]
    update = ld.LayerwiseUpdate(
        [ld.Descent(alpha=0.5)], num_layers=2, optimizer=primal, solver="capped-decay", registry=registry, scheme=scheme, dual_lr=1.0
    )
    dual_step = update.solver.dual_step
    update.solver.dual_step = lambda: (seen.append(taken[0]), dual_step())[1]
    for _ in range(3):
        update.zero_grad()
        update.backward((param * torch.tensor([1.0, 2.0, 3.0]))[None])  # every layer's loss above the last: each binds
        update.step()
    assert seen == primal_steps_before


def test_the_guide_method_trains_from_a_config_and_resumes_on_the_same_trajectory(tiny, tmp_path, registry, monkeypatch):
    from layerdescent.run.trainer import Trainer

    tiny["solver"] = {"name": "capped-decay", "dual_lr": 1.0, "cap": 0.05}
    tiny["constraints"] = [{"kind": "descent", "alpha": 0.5}]  # violated: lambda climbs to the cap
    tiny["train"].update(checkpoint_every=3)
    config = ld.config_from_dict(copy.deepcopy(tiny), registry)
    whole = ld.train(config, tmp_path / "whole", registry=registry)
    assert whole["solver"] == "capped-decay" and max(whole["constraints"]["descent"]["lambda"]) == pytest.approx(0.05)
    original, calls = Trainer.step, []

    def interrupted(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 11:
            raise KeyboardInterrupt
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Trainer, "step", interrupted)
    with pytest.raises(KeyboardInterrupt):
        ld.train(config, tmp_path / "resumed", registry=registry)
    monkeypatch.setattr(Trainer, "step", original)
    resumed = ld.train(config, tmp_path / "resumed", resume=True, registry=registry)
    assert resumed["constraints"] == whole["constraints"] and resumed["gammas"] == whole["gammas"]


def test_an_option_of_the_guide_method_is_checked_like_any_config_key(tiny, registry):
    tiny["solver"] = {"name": "capped-decay", "cap": -1.0}
    with pytest.raises(ld.ConfigError, match=r"solver.cap must be > 0, got -1.0"):
        ld.config_from_dict(tiny, registry)
    tiny["solver"] = {"name": "capped-decay", "dual_lr": -1.0}  # primal-dual's own check still runs
    with pytest.raises(ld.ConfigError, match=r"solver.dual_lr must be >= 0"):
        ld.config_from_dict(tiny, registry)
