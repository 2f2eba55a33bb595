"""Evaluation domains: extra test sets that share a task's labels, tested at every gamma without retraining."""

from __future__ import annotations

import json

import pytest

import layerdescent as ld
from layerdescent.analysis.report import write_report


def _domains(tiny, names=("denser", "noisier"), samples=0):
    tiny["train"]["epochs"] = 1
    tiny["eval"]["domains"] = list(names)
    tiny["eval"]["domain_samples"] = samples
    return tiny


def test_every_named_domain_is_tested_at_every_gamma_beside_the_test_split(tiny, tmp_path):
    results = ld.train(ld.config_from_dict(_domains(tiny)), tmp_path / "run")
    assert list(results["domains"]) == ["denser", "noisier"]
    for records in results["domains"].values():
        assert [r["gamma"] for r in records] == [0.0, 0.5] and records[0]["samples"] == 128
        assert len(records[0]["layer_loss"]) == 5
    # Twice the non-zeros is a harder problem than the test split's: a real shift, not a copy.
    assert results["domains"]["denser"][0]["metrics"]["mse"] > results["gammas"][0]["metrics"]["mse"]
    assert json.loads((tmp_path / "run" / "results.json").read_text())["domains"] == results["domains"]


def test_a_run_without_domains_records_none(tiny, tmp_path):
    tiny["train"]["epochs"] = 1
    assert "domains" not in ld.train(ld.config_from_dict(tiny), tmp_path / "run")


def test_domain_samples_keeps_a_fixed_random_subset(tiny, tmp_path):
    first = ld.train(ld.config_from_dict(_domains(tiny, ["denser"], samples=50)), tmp_path / "a")
    again = ld.evaluate_run(tmp_path / "a", tmp_path / "b")
    assert first["domains"]["denser"][0]["samples"] == 50
    assert again["domains"] == first["domains"]


def test_re_evaluation_tests_a_finished_run_on_domains_it_was_not_trained_with(tiny, tmp_path):
    tiny["train"]["epochs"] = 1
    original = ld.train(ld.config_from_dict(tiny), tmp_path / "run")
    shifted = ld.evaluate_run(tmp_path / "run", tmp_path / "shift", ['eval.domains=["noisier"]'])
    assert list(shifted["domains"]) == ["noisier"] and shifted["gammas"] == original["gammas"]


def test_an_unknown_domain_is_one_config_error_with_the_closest_name(tiny):
    with pytest.raises(ld.ConfigError, match="did you mean 'denser'") as caught:
        ld.config_from_dict(_domains(tiny, ["dense"]))
    assert "it offers: denser, noisier" in str(caught.value)


def test_a_domain_named_twice_is_a_config_error(tiny):
    with pytest.raises(ld.ConfigError, match="names a domain twice"):
        ld.config_from_dict(_domains(tiny, ["denser", "denser"]))


def test_the_summary_has_a_table_with_paired_differences_and_a_plot_panel_per_domain(tiny, tmp_path):
    for solver in ("erm", "primal-dual"):
        for seed in (0, 1):
            table = _domains(dict(tiny, seed=seed, label=solver, solver={**tiny["solver"], "name": solver}))
            ld.train(ld.config_from_dict(table), tmp_path / "bench" / solver / f"seed-{seed}")
    text = write_report(tmp_path / "bench").read_text()
    for name in ("denser", "noisier"):
        section = text.split(f"## Paired differences over seeds on domain {name}")[1].split("\n## ")[0]
        assert "primal-dual − erm | 2 |" in section
        assert f"## Loss per layer at γ=0 on domain {name}" in text
    assert (tmp_path / "bench" / "metric_vs_gamma_domains.png").stat().st_size > 0
    assert "metric_vs_gamma_domains.png" in text


def test_runs_of_two_training_regimes_pair_with_the_erm_of_their_own_regime(tiny, tmp_path):
    for label, solver, gamma in [
        ("erm,train_gamma=0.1", "erm", 0.1),
        ("erm,train_gamma=0.3", "erm", 0.3),
        ("primal-dual,train_gamma=0.3", "primal-dual", 0.3),
    ]:
        for seed in (0, 1):
            table = dict(
                tiny,
                seed=seed,
                label=label,
                solver={**tiny["solver"], "name": solver},
                train={**tiny["train"], "epochs": 1, "train_gamma": gamma},
            )
            ld.train(ld.config_from_dict(table), tmp_path / "bench" / label / f"seed-{seed}")
    text = write_report(tmp_path / "bench").read_text()
    assert "primal-dual,train_gamma=0.3 − erm,train_gamma=0.3" in text
    assert "primal-dual,train_gamma=0.3 − erm,train_gamma=0.1" not in text
