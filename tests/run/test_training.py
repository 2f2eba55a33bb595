"""Training on lista through the public API: solvers, references, logs, resume, divergence."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import interrupt_at_step
from safetensors.torch import load_file

import layerdescent as ld


def _train(table, tmp_path, name="run"):
    return ld.train(ld.config_from_dict(table), tmp_path / name)


def _log(run_dir, event="train"):
    return [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if r["event"] == event]


def test_primal_dual_descent_makes_test_loss_fall_at_every_layer_and_records_lambdas(tiny, tmp_path):
    tiny["task"]["train_size"] = 1024
    tiny["train"]["epochs"] = 8
    results = _train(tiny, tmp_path)
    layer_loss = results["gammas"][0]["layer_loss"]
    assert all(b < a for a, b in zip(layer_loss, layer_loss[1:])), layer_loss
    assert len(results["constraints"]["descent"]["lambda"]) == 4
    lambdas = [r["lambda"]["descent"] for r in _log(tmp_path / "run")]
    assert any(max(values) > 0 for values in lambdas), "the constraints never became active"


def test_erm_measures_violations_but_never_moves_multipliers(tiny, tmp_path):
    tiny["solver"]["name"] = "erm"
    results = _train(tiny, tmp_path)
    records = _log(tmp_path / "run")
    assert all(len(r["violation"]["descent"]) == 4 and "lambda" not in r for r in records)
    assert results["constraints"]["descent"]["lambda"] == [0.0] * 4


@pytest.mark.parametrize(
    "constraint",
    [
        {"kind": "descent", "reference": "live"},
        {"kind": "descent", "reference": "detached"},
        {"kind": "descent", "reference": "anchored"},
        {"kind": "descent", "resilience": 1.0},
    ],
    ids=["live", "detached", "anchored", "resilient"],
)
def test_each_reference_mode_and_resilience_trains_and_is_reported(tiny, tmp_path, constraint):
    tiny["constraints"] = [constraint]
    results = _train(tiny, tmp_path)
    reported = results["constraints"]["descent"]
    expected = 5 if constraint.get("reference") == "anchored" else 4
    assert len(reported["lambda"]) == len(reported["labels"]) == expected
    assert ("relaxation" in reported) == bool(constraint.get("resilience"))
    assert all(torch.isfinite(torch.tensor(g["layer_loss"])).all() for g in results["gammas"])


def test_accumulation_and_clipping_match_one_big_batch_without_clipping_noise(tiny, tmp_path):
    tiny["train"].update(epochs=1, batch_size=64, optimizer="sgd", lr=0.01, momentum=0.0, validate=False)
    big = _train(tiny, tmp_path, "big")
    tiny["train"].update(batch_size=32, accumulate=2)
    small = _train(tiny, tmp_path, "accumulated")
    assert small["train"]["steps"] == big["train"]["steps"]
    assert small["gammas"][0]["layer_loss"] == pytest.approx(big["gammas"][0]["layer_loss"], rel=1e-4)
    tiny["train"]["grad_clip"] = 1e-6
    clipped = _train(tiny, tmp_path, "clipped")
    assert clipped["gammas"][0]["layer_loss"] != pytest.approx(big["gammas"][0]["layer_loss"], rel=1e-3)


def test_penalty_uses_given_weights_per_layer(tiny, tmp_path):
    tiny["solver"] = {"name": "penalty", "penalty_weights": [0, 0, 0, 0, 1]}
    only_last = _train(tiny, tmp_path, "penalty")
    tiny["solver"] = {"name": "erm"}
    erm = _train(tiny, tmp_path, "erm")
    assert only_last["gammas"][0]["layer_loss"] == pytest.approx(erm["gammas"][0]["layer_loss"], rel=1e-5)


def test_resume_after_interruption_gives_the_same_final_parameters(tiny, tmp_path, monkeypatch):
    tiny["train"].update(epochs=3, checkpoint_every=5, train_gamma=0.1, keep_checkpoint=True)
    config = ld.config_from_dict(tiny)
    ld.train(config, tmp_path / "whole")

    restore = interrupt_at_step(monkeypatch, 13)
    with pytest.raises(KeyboardInterrupt):
        ld.train(config, tmp_path / "resumed")
    restore()
    resumed = ld.train(config, tmp_path / "resumed", resume=True)
    whole = json.loads((tmp_path / "whole" / "results.json").read_text())

    a = torch.load(tmp_path / "whole" / "checkpoint.pt", weights_only=False)
    b = torch.load(tmp_path / "resumed" / "checkpoint.pt", weights_only=False)
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    assert torch.equal(a["problem"]["cmp"]["multipliers"]["descent"]["weight"], b["problem"]["cmp"]["multipliers"]["descent"]["weight"])
    assert resumed["gammas"] == whole["gammas"]
    assert (tmp_path / "whole" / "metrics.jsonl").read_text() == (tmp_path / "resumed" / "metrics.jsonl").read_text()


def test_existing_run_directory_is_not_overwritten_without_resume(tiny, tmp_path):
    tiny["train"]["epochs"] = 1
    _train(tiny, tmp_path)
    with pytest.raises(ld.ConfigError, match="--resume"):
        _train(tiny, tmp_path)


def test_non_finite_loss_stops_with_the_step_and_layer(tiny, tmp_path, monkeypatch):
    task_cls = ld.get_registry().task("lista")
    original = task_cls.layer_losses

    def poisoned(self, model, batch, gamma=0.0):
        out = original(self, model, batch, gamma)
        out.losses = out.losses.clone()
        out.losses[:, 2] = float("nan")
        return out

    monkeypatch.setattr(task_cls, "layer_losses", poisoned)
    with pytest.raises(ld.DivergenceError, match=r"step 0: non-finite loss, l2 = nan"):
        _train(tiny, tmp_path)


def test_evaluation_is_deterministic_and_records_every_gamma(tiny, tmp_path):
    tiny["train"]["epochs"] = 1
    tiny["eval"]["gammas"] = [0.0, 0.2, 1.0]
    results = _train(tiny, tmp_path)
    gammas = results["gammas"]
    assert [g["gamma"] for g in gammas] == [0.0, 0.2, 1.0]
    assert gammas[0]["samples"] == 128
    assert gammas[2]["metrics"]["mse"] > gammas[0]["metrics"]["mse"]
    assert all(len(g["descent_rate"]) == 4 and all(0 <= r <= 1 for r in g["descent_rate"]) for g in gammas)


def test_evaluating_a_finished_run_again_reproduces_it_and_tests_another_perturbation(tiny, tmp_path):
    original = _train(tiny, tmp_path)
    same = ld.evaluate_run(tmp_path / "run", tmp_path / "again")
    assert same["gammas"] == original["gammas"]  # the final model, the same data, the same noise seeds
    shifted = ld.evaluate_run(tmp_path / "run", tmp_path / "impulse", ["task.perturbation=impulse", "eval.gammas=[0.0, 0.2]"])
    assert shifted["perturbation"] == "impulse" and [g["gamma"] for g in shifted["gammas"]] == [0.0, 0.2]
    assert shifted["gammas"][0] == original["gammas"][0]
    assert shifted["gammas"][1]["layer_loss"] != original["gammas"][1]["layer_loss"]
    assert json.loads((tmp_path / "impulse" / "results.json").read_text())["evaluated_from"] == str(tmp_path / "run")


@pytest.mark.parametrize(
    "override, message",
    [("train.lr=0.1", "only task.perturbation and eval"), ("task.layers=3", "only task.perturbation and eval")],
)
def test_re_evaluation_refuses_to_change_how_the_model_was_trained(tiny, tmp_path, override, message):
    _train(tiny, tmp_path)
    with pytest.raises(ld.ConfigError, match=message):
        ld.evaluate_run(tmp_path / "run", tmp_path / "again", [override])


def test_re_evaluation_needs_a_finished_run_with_its_model(tiny, tmp_path):
    with pytest.raises(ld.ConfigError, match="no finished run"):
        ld.evaluate_run(tmp_path / "nothing", tmp_path / "again")
    _train(tiny, tmp_path)
    (tmp_path / "run" / "model.safetensors").unlink()
    with pytest.raises(ld.ConfigError, match="its model is gone"):
        ld.evaluate_run(tmp_path / "run", tmp_path / "again")


def test_early_stopping_ends_after_patience_epochs_and_tests_the_best_validation_model(tiny, tmp_path, monkeypatch):
    import layerdescent.run.trainer as trainer_module

    scripted = iter([1.0, 0.5, 0.7, 0.8, 0.9, 1.0])  # last-layer validation loss per epoch: best at epoch 1
    real = trainer_module.evaluate

    def evaluate(task, model, rows, gammas, *args):
        records = real(task, model, rows, gammas, *args)
        if len(rows) == tiny["task"]["validation_size"]:
            records[0]["layer_loss"][-1] = next(scripted)
        return records

    monkeypatch.setattr(trainer_module, "evaluate", evaluate)
    tiny["train"].update(epochs=6, early_stopping=2, keep_checkpoint=True)
    results = _train(tiny, tmp_path)
    assert results["train"]["epochs"] == 4 and results["train"]["best_epoch"] == 1
    assert results["train"]["best_val_loss"][-1] == 0.5 and len(results["train"]["best_val_loss"]) == 5  # the tested epoch's, every layer
    assert len(_log(tmp_path / "run", "epoch")) == 4
    monkeypatch.setattr(trainer_module, "evaluate", real)
    assert ld.evaluate_run(tmp_path / "run", tmp_path / "again")["gammas"] == results["gammas"]
    best = torch.load(tmp_path / "run" / "best.pt", weights_only=False)["model"]
    last = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=False)["model"]
    assert any(not torch.equal(best[k], last[k]) for k in best)
    kept = load_file(tmp_path / "run" / "model.safetensors")  # what evaluation reads: the best epoch's model
    assert all(torch.equal(best[k], kept[k]) for k in best)


def test_early_stopping_without_validation_is_a_config_error(tiny):
    tiny["train"].update(early_stopping=2, validate=False)
    with pytest.raises(ld.ConfigError, match="train.early_stopping needs train.validate"):
        ld.config_from_dict(tiny)


def test_dropout_on_a_model_without_dropout_layers_is_a_config_error(tiny, tmp_path):
    tiny["train"]["dropout"] = 0.1
    with pytest.raises(ld.ConfigError, match="train.dropout = 0.1, but task 'lista' builds a model with no dropout layer"):
        _train(tiny, tmp_path)
    tiny["train"]["dropout"] = 1.0
    with pytest.raises(ld.ConfigError, match=r"train.dropout must be in \[0, 1\)"):
        ld.config_from_dict(tiny)


def test_validation_runs_at_validation_gamma(tiny, tmp_path):
    tiny["train"]["epochs"] = 1
    clean = _log(_train(tiny, tmp_path, "clean") and tmp_path / "clean", "epoch")[0]["val_loss"]
    tiny["train"]["validation_gamma"] = 1.0
    noisy = _log(_train(tiny, tmp_path, "noisy") and tmp_path / "noisy", "epoch")[0]["val_loss"]
    assert noisy[-1] > clean[-1] and noisy[0] > clean[0]  # the same model, tested on noisier inputs


def test_a_cosine_schedule_anneals_the_learning_rate_to_zero_over_the_run(tiny, tmp_path, monkeypatch):
    import cooper

    seen = []
    real = cooper.optim.SimultaneousOptimizer.primal_step

    def primal_step(self):
        seen.append(self.primal_optimizers[0].param_groups[0]["lr"])
        return real(self)

    monkeypatch.setattr(cooper.optim.SimultaneousOptimizer, "primal_step", primal_step)
    tiny["train"].update(epochs=2, lr_schedule="cosine")
    _train(tiny, tmp_path)
    steps = 2 * 512 // 64
    assert len(seen) == steps and seen[0] == tiny["train"]["lr"]
    assert all(b < a for a, b in zip(seen, seen[1:])) and seen[-1] < 0.05 * seen[0]


@pytest.mark.parametrize("saved_schedule", [True, False])
def test_a_cosine_schedule_resumes_exactly_also_from_a_checkpoint_written_before_it_kept_its_state(
    tiny, tmp_path, monkeypatch, saved_schedule
):
    from layerdescent.run.checkpoint import load_checkpoint, save_checkpoint

    tiny["train"].update(epochs=2, lr_schedule="cosine", checkpoint_every=3)
    config = ld.config_from_dict(tiny)
    whole = ld.train(config, tmp_path / "whole")
    restore = interrupt_at_step(monkeypatch, 5)  # after the checkpoint at step 3
    with pytest.raises(KeyboardInterrupt):
        ld.train(config, tmp_path / "resumed")
    restore()
    checkpoint = tmp_path / "resumed" / "checkpoint.pt"
    state = load_checkpoint(checkpoint, "lista")
    assert state["position"]["step"] == 3 and "schedule" in state
    if not saved_schedule:  # as a checkpoint from before the schedule was a torch scheduler
        del state["schedule"]
        save_checkpoint(checkpoint, state)
    resumed = ld.train(config, tmp_path / "resumed", resume=True)
    assert resumed["gammas"] == whole["gammas"] and resumed["train"]["steps"] == whole["train"]["steps"]


@pytest.mark.parametrize("code_dim, threads", [(32, 1), (1024, 2)], ids=["small-model-one-thread", "large-model-every-core"])
def test_threads_0_trains_a_small_model_on_one_thread_and_a_large_one_on_every_core(code_dim, threads, monkeypatch):
    import copy

    from conftest import TINY

    table = copy.deepcopy(TINY)
    table["task"].update(code_dim=code_dim, measure_dim=code_dim, layers=2)
    torch.set_num_threads(2)
    try:
        ld.build_session(ld.config_from_dict(table))
        assert torch.get_num_threads() == threads
    finally:
        torch.set_num_threads(1)  # the suite's one thread
