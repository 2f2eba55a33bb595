"""The final evaluation: what it computed and how long it took in results.json, without autograd, resumable record by record."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch

import layerdescent as ld
from layerdescent.analysis.report import collect, summarize
from layerdescent.errors import LayerdescentError
from layerdescent.results import check
from layerdescent.run import layout, rundir
from layerdescent_lista import SparseCoding

GAMMAS = [0.0, 0.5, 1.0]


def _config(tiny, **train):
    tiny["eval"] = {"gammas": GAMMAS, "batch_size": 50}
    tiny["train"] = {**tiny["train"], "epochs": 1, **train}
    return ld.config_from_dict(tiny)


def _numbers(results: dict) -> dict:
    """results without its wall times and provenance."""
    return {k: {**v, "step_time_median": None} if k == "train" else v for k, v in results.items() if k not in ("eval_seconds", "code")}


def test_results_record_the_evaluation_workload_and_its_wall_time(tmp_path, tiny):
    results = ld.train(_config(tiny), tmp_path / "run")
    assert results["eval_workload"] == {"rows": {"test": 128}, "gammas": 3, "records": 3, "forward_rows": 384}
    assert isinstance(results["eval_seconds"], float) and results["eval_seconds"] > 0
    written = json.loads((tmp_path / "run" / "results.json").read_text())
    assert written["eval_workload"] == results["eval_workload"]
    check(written, tmp_path / "run" / "results.json")


def test_the_evaluation_runs_in_inference_mode(tmp_path, tiny, monkeypatch):
    modes = []
    original = SparseCoding.layer_losses

    def spy(self, model, batch, gamma=0.0):
        modes.append(torch.is_inference_mode_enabled())
        return original(self, model, batch, gamma)

    monkeypatch.setattr(SparseCoding, "layer_losses", spy)
    ld.train(_config(tiny), tmp_path / "run")
    evaluated = len(GAMMAS) * 3  # the last layer_losses calls: 128 test rows in batches of 50, at each gamma
    assert modes[-evaluated:] == [True] * evaluated
    assert modes[0] is False  # a training step keeps autograd


def _cut_after_two_records(tiny, run_dir, monkeypatch) -> None:
    """Train into ``run_dir``, stopped by a Ctrl-C right after the final evaluation saved its second record."""
    original = rundir.save_partial_evaluation

    def save_then_die(run_dir, key, evaluation):
        original(run_dir, key, evaluation)
        if len(evaluation["gammas"]) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(rundir, "save_partial_evaluation", save_then_die)
    with pytest.raises(KeyboardInterrupt):
        ld.train(_config(tiny), run_dir)
    monkeypatch.setattr(rundir, "save_partial_evaluation", original)


def _count_evaluated(monkeypatch) -> list[float]:
    """The gamma of every batch the task reads from now on."""
    evaluated, original = [], SparseCoding.layer_losses

    def count(self, model, batch, gamma=0.0):
        evaluated.append(gamma)
        return original(self, model, batch, gamma)

    monkeypatch.setattr(SparseCoding, "layer_losses", count)
    return evaluated


def test_an_evaluation_interrupted_after_a_record_resumes_at_the_next_with_the_same_results(tmp_path, tiny, monkeypatch, capsys):
    whole = ld.train(_config(tiny), tmp_path / "whole")

    _cut_after_two_records(tiny, tmp_path / "cut", monkeypatch)
    assert (tmp_path / "cut" / layout.EVALUATION_PARTIAL).exists()

    evaluated = _count_evaluated(monkeypatch)
    capsys.readouterr()
    resumed = ld.train(_config(tiny, progress=True), tmp_path / "cut", resume=True)
    assert evaluated == [GAMMAS[2]] * 3  # only the third record's three batches
    assert "evaluation: resumed after 2 of 3 records" in capsys.readouterr().err
    assert _numbers(resumed) == _numbers(whole)
    assert not (tmp_path / "cut" / layout.EVALUATION_PARTIAL).exists()  # results.json holds every record now


def _record(gamma: float) -> dict:
    return {"gamma": gamma, "layer_loss": [1.0, 0.5], "descent_rate": [1.0], "metrics": {}}


def test_a_saved_evaluation_of_another_model_is_not_reused(tmp_path):
    key = {"step": 8, "epoch": 1, "eval": {}}
    rundir.save_partial_evaluation(tmp_path, key, {"gammas": [_record(0.0)]})
    assert rundir.partial_evaluation(tmp_path, key, [0.0, 1.0], [], 1) == ({"gammas": [_record(0.0)], "eval_seconds": 0.0}, None)
    assert rundir.partial_evaluation(tmp_path, {"step": 16, "epoch": 2, "eval": {}}, [0.0, 1.0], [], 1) == (None, None)
    (tmp_path / layout.EVALUATION_PARTIAL).write_text("{not json")
    done, line = rundir.partial_evaluation(tmp_path, key, [0.0, 1.0], [], 1)
    assert done is None and "is not valid JSON" in line and line.endswith(": the evaluation starts again")


def _edit_loss(saved):
    saved["evaluation"]["gammas"][0]["layer_loss"][0] = 0.0  # the checksum no longer matches


def _forge_checksum(saved):
    """Recompute the checksum over the edited records, as anyone can: the records alone are then checked."""
    saved["sha256"] = hashlib.sha256(json.dumps(saved["evaluation"], sort_keys=True).encode()).hexdigest()


def _edit_loss_without_checksum(saved):
    _edit_loss(saved)
    del saved["sha256"]


def _append_gamma(saved):
    saved["evaluation"]["gammas"].insert(1, {**saved["evaluation"]["gammas"][0], "gamma": 0.9})
    _forge_checksum(saved)


def _mistype(saved):
    saved["evaluation"]["gammas"][1]["layer_loss"] = "x"
    _forge_checksum(saved)


def _unknown_domain(saved):
    saved["evaluation"]["domains"] = {"elsewhere": saved["evaluation"]["gammas"]}
    _forge_checksum(saved)


TAMPERED = {
    "loss-edited-to-0": (_edit_loss, "was changed since it was written (its checksum differs), so its records are not used", 3),
    "checksum-removed-and-loss-edited-to-0": (_edit_loss_without_checksum, "has no checksum, so its records are not used", 3),
    "a-record-for-gamma-0.9-appended": (_append_gamma, "gammas[1] is a record for gamma 0.9, where eval.gammas[1] is 0.5", 2),
    "a-mistyped-field": (_mistype, "gammas[1].layer_loss is 'x', not a list of numbers", 2),
    "a-domain-not-asked-for": (_unknown_domain, "domain 'elsewhere' was not asked for (eval.domains)", 1),
}


@pytest.mark.parametrize("edit, line, again", TAMPERED.values(), ids=TAMPERED.keys())
def test_a_saved_evaluation_that_does_not_fit_is_evaluated_again_with_one_line(tmp_path, tiny, monkeypatch, capsys, edit, line, again):
    whole = ld.train(_config(tiny), tmp_path / "whole")
    _cut_after_two_records(tiny, tmp_path / "cut", monkeypatch)
    partial = tmp_path / "cut" / layout.EVALUATION_PARTIAL
    saved = json.loads(partial.read_text())
    edit(saved)
    partial.write_text(json.dumps(saved))
    evaluated = _count_evaluated(monkeypatch)
    capsys.readouterr()
    resumed = ld.train(_config(tiny), tmp_path / "cut", resume=True)
    err = capsys.readouterr().err
    assert line in err and err.count("layerdescent: ") == 1, err
    assert evaluated == [g for g in GAMMAS[3 - again :] for _ in range(3)]  # what did not fit, and what follows it, again
    assert _numbers(resumed) == _numbers(whole)


def test_a_report_reads_runs_with_and_without_the_evaluation_cost(tmp_path, tiny):
    ld.train(_config(tiny), tmp_path / "bench" / "new")
    old = json.loads((tmp_path / "bench" / "new" / "results.json").read_text())
    for key in ("eval_workload", "eval_seconds"):
        old.pop(key)
    (tmp_path / "bench" / "old").mkdir()
    (tmp_path / "bench" / "old" / "results.json").write_text(json.dumps({**old, "seed": 1}))
    (tmp_path / "bench" / "old" / "metrics.jsonl").write_text((tmp_path / "bench" / "new" / "metrics.jsonl").read_text())
    runs = collect(tmp_path / "bench")
    assert len(runs) == 2
    assert summarize(runs)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"eval_seconds": -1.0}, "eval_seconds is -1.0, outside 0..inf"),
        ({"eval_workload": {"rows": {"test": "many"}}}, "eval_workload.rows.test is 'many', not an integer >= 0"),
        ({"eval_workload": {"forward_rows": 1.5}}, "eval_workload.forward_rows is 1.5, not an integer >= 0"),
    ],
)
def test_a_damaged_evaluation_cost_is_named_by_the_results_check(tmp_path, tiny, change, message):
    results = ld.train(_config(tiny), tmp_path / "run")
    with pytest.raises(LayerdescentError, match=message):
        check({**json.loads(json.dumps(results)), **change}, tmp_path / "results.json")
