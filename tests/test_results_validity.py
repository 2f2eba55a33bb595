"""Results that would look valid but are not are refused, naming the cause, before results.json is written."""

from __future__ import annotations

import datasets
import pytest
import torch

import layerdescent as ld
from layerdescent import LayerOutput, Task, hookimpl
from layerdescent.registry import Registry


class Quirky(Task):
    """A regression task whose ``mode`` option makes its losses wrong in one way."""

    name = "quirky"
    options = {"mode": "none"}

    @property
    def num_layers(self):
        return 2

    def build_model(self):
        return torch.nn.ModuleList([torch.nn.Linear(3, 1) for _ in range(3)])

    def build_datasets(self):
        x = torch.randn(48, 3, generator=torch.Generator().manual_seed(0))
        ds = datasets.Dataset.from_dict({"x": x.numpy(), "y": x.sum(1, keepdim=True).numpy()}).with_format("torch")
        return {"train": ds, "validation": ds, "test": ds}

    def collate(self, rows):
        return rows

    def layer_losses(self, model, batch, gamma=0.0):
        mode = self.options["mode"]
        with torch.set_grad_enabled(mode != "no-grad" and torch.is_grad_enabled()):
            losses = torch.stack([(layer(batch["x"]) - batch["y"]).pow(2).squeeze(1) for layer in model], 1)
        if mode == "nan-at-evaluation" and not model.training:
            losses = losses * float("nan")
        if mode == "nan-always":
            losses = losses * float("nan")
        if mode == "negative":
            losses = losses - 100.0
        return LayerOutput(losses)


class QuirkyPlugin:
    @hookimpl
    def register_tasks(self, register):
        register(Quirky)


REGISTRY = Registry(extra_plugins=[("quirky-plugin", QuirkyPlugin())])


def run(tmp_path, mode, **sections):
    table = {
        "task": {"name": "quirky", "mode": mode},
        "train": {"epochs": 1, "batch_size": 16, "progress": False, "validate": False, **sections.pop("train", {})},
        "solver": {"name": "primal-dual"},
        "constraints": [{"kind": "descent"}],
        **sections,
    }
    return ld.train(ld.config_from_dict(table, REGISTRY), tmp_path / "run", registry=REGISTRY)


def test_losses_that_are_nan_only_at_evaluation_are_refused_naming_the_plugin(tmp_path):
    with pytest.raises(
        ld.DataError, match=r"task 'quirky' \(plugin 'quirky-plugin'\): layer_losses gave a non-finite evaluation loss .* gamma 0, l0 = nan"
    ):
        run(tmp_path, "nan-at-evaluation")
    assert not (tmp_path / "run" / "results.json").exists()


def test_a_run_whose_every_step_was_skipped_is_refused(tmp_path):
    with pytest.raises(ld.DivergenceError, match="every one of the 3 training steps was skipped"):
        run(tmp_path, "nan-always", train={"on_nonfinite": "skip"})
    assert not (tmp_path / "run" / "results.json").exists()


def test_negative_losses_under_a_descent_constraint_are_refused(tmp_path):
    with pytest.raises(
        ld.PluginError,
        match=r"plugin 'quirky-plugin'\): layer_losses returned a negative mean loss, l0 = .*constraint 'descent' \(descent\) needs losses >= 0",
    ):
        run(tmp_path, "negative")


def test_a_bound_alone_may_see_negative_losses(tmp_path):
    results = run(tmp_path, "negative", constraints=[{"kind": "bound", "value": -50.0}])
    assert results["gammas"][0]["layer_loss"][-1] < 0


def test_losses_without_gradients_are_refused_because_nothing_would_train(tmp_path):
    with pytest.raises(ld.PluginError, match="layer_losses returned losses without gradients"):
        run(tmp_path, "no-grad")


def test_an_infinite_gamma_is_a_config_error():
    with pytest.raises(ld.ConfigError, match=r"eval.gammas\[0\] must be a finite number, got inf"):
        ld.config_from_dict({"task": {"name": "quirky"}, "solver": {"name": "erm"}, "eval": {"gammas": [float("inf")]}}, REGISTRY)
