"""Non-finite numbers, exploding multipliers and bad data end in one clear message."""

from __future__ import annotations

import json

import pytest

import layerdescent as ld
from layerdescent.registry import Registry
from layerdescent.run.checkpoint import load_checkpoint


def poison(monkeypatch, steps, layer=2):
    """Make lista's loss NaN at ``layer`` during the given training steps (0-based)."""
    task_cls = ld.get_registry().task("lista")
    original = task_cls.layer_losses
    calls = {"n": -1}

    def layer_losses(self, model, batch, gamma=0.0):
        out = original(self, model, batch, gamma)
        if model.training:
            calls["n"] += 1
            if calls["n"] in steps:
                out.losses = out.losses.clone()
                out.losses[:, layer] = float("nan")
        return out

    monkeypatch.setattr(task_cls, "layer_losses", layer_losses)


def test_non_finite_loss_stops_and_leaves_the_last_checkpoint_intact(tiny, tmp_path, monkeypatch):
    tiny["train"]["checkpoint_every"] = 2
    poison(monkeypatch, steps={5})
    with pytest.raises(ld.DivergenceError, match=r"step 5: non-finite loss, l2 = nan; the last checkpoint is intact"):
        ld.train(ld.config_from_dict(tiny), tmp_path / "run")
    assert load_checkpoint(tmp_path / "run" / "checkpoint.pt", "lista")["position"]["step"] == 4


def test_a_non_finite_loss_before_any_checkpoint_does_not_claim_one(tiny, tmp_path, monkeypatch):
    poison(monkeypatch, steps={1})
    with pytest.raises(ld.DivergenceError, match=r"step 1: non-finite loss, l2 = nan; no checkpoint was written before it \(lower"):
        ld.train(ld.config_from_dict(tiny), tmp_path / "run")
    assert not (tmp_path / "run" / "checkpoint.pt").exists()


def test_skip_mode_drops_the_bad_step_logs_it_and_finishes(tiny, tmp_path, monkeypatch):
    tiny["train"]["on_nonfinite"] = "skip"
    poison(monkeypatch, steps={3})
    results = ld.train(ld.config_from_dict(tiny), tmp_path / "run")
    assert results["train"]["skipped_steps"] == 1
    events = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    skipped = [e for e in events if e["event"] == "skipped"]
    assert len(skipped) == 1 and skipped[0]["step"] == 3 and "l2 = nan" in skipped[0]["reason"]


def test_exploding_multiplier_stops_the_run_naming_constraint_and_layer(tiny, tmp_path):
    tiny["solver"].update(dual_lr=1000.0, max_multiplier=5.0)
    tiny["constraints"] = [{"kind": "bound", "name": "tight", "value": 0.0}]
    with pytest.raises(
        ld.DivergenceError, match=r"step 0: multiplier of constraint 'tight' exploded, l4<=0 = .* > solver.max_multiplier = 5"
    ):
        ld.train(ld.config_from_dict(tiny), tmp_path / "run")


def test_a_multiplier_that_explodes_at_an_epochs_dual_step_stops_the_run_there(tiny, tmp_path):
    tiny["solver"].update(dual_lr=1000.0, max_multiplier=5.0, dual_every="epoch")
    tiny["constraints"] = [{"kind": "bound", "name": "tight", "value": 0.0}]
    with pytest.raises(
        ld.DivergenceError, match=r"end of epoch 0: multiplier of constraint 'tight' exploded, l4<=0 = .* > solver.max_multiplier = 5"
    ):
        ld.train(ld.config_from_dict(tiny), tmp_path / "run")


def _lista_with(build):
    """A registry whose lista variant builds its splits with ``build(splits)``."""
    base = ld.get_registry().task("lista")

    class Broken(base):
        name = "broken-lista"

        def build_datasets(self):
            return build(super().build_datasets())

    class Plugin:
        @ld.hookimpl
        def register_tasks(self, register):
            register(Broken)

    return Registry(extra_plugins=[("broken", Plugin())])


def _nan_row(splits):
    import numpy as np

    train = splits["train"].with_format(None)
    y = np.array(train["y"], dtype=np.float32)
    y[7, 3] = np.nan
    splits["train"] = train.remove_columns("y").add_column("y", list(y)).with_format("torch")
    return splits


@pytest.mark.parametrize(
    "build, message",
    [
        (_nan_row, "split 'train', column 'y', row 7 holds a NaN or infinite value"),
        (lambda s: {**s, "test": s["test"].select([])}, "built an empty or missing 'test' split"),
        (lambda s: {k: v for k, v in s.items() if k != "validation"}, "built an empty or missing 'validation' split"),
    ],
    ids=["nan-input", "empty-split", "missing-split"],
)
def test_bad_data_is_one_error_before_training(tiny, tmp_path, build, message):
    registry = _lista_with(build)
    tiny["task"]["name"] = "broken-lista"
    with pytest.raises(ld.DataError, match=message):
        ld.train(ld.config_from_dict(tiny, registry), tmp_path / "run", registry=registry)
    assert not (tmp_path / "run" / "checkpoint.pt").exists()


def test_missing_optional_dependency_names_the_extra_to_install():
    with pytest.raises(
        ld.PluginError, match=r"needs the optional dependency 'no_such_module_xyz'; install it with: pip install 'layerdescent\[text\]'"
    ):
        ld.require("no_such_module_xyz", extra="text", purpose="task text-classification")
    assert ld.require("json", extra="text").dumps([]) == "[]"
