"""Descent that holds under the shift: a training perturbation band, constraints held per level and per sample."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch
from helpers import RUNNER, assert_one_line, cli, config_file

import layerdescent as ld
from layerdescent.run.checkpoint import load_checkpoint
from layerdescent.run.config import config_from_dict

BAND = [0.0, 0.5, 1.0]


def _loop_update(constraint: dict, rows: int | None = None, **options):
    """A LayerwiseUpdate over a 2-layer toy model, as a user's own loop builds it."""
    model = torch.nn.Linear(3, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # the model stays put: only the multipliers are under test
    spec = ld.Descent(alpha=0.1, **constraint)
    update = ld.LayerwiseUpdate([spec], num_layers=2, optimizer=optimizer, dual_lr=1.0, band=BAND, rows=rows, **options)
    return model, update


def _losses(model, n: int) -> torch.Tensor:
    """n x 3 per-row layer losses whose layers all rise: every descent entry is violated."""
    base = model(torch.ones(n, 3)).sum(dim=1, keepdim=True) * 0 + torch.tensor([[1.0, 2.0, 3.0]])
    return base + 0.01 * torch.arange(n, dtype=torch.float32)[:, None]


def test_a_level_multiplier_moves_only_on_batches_drawn_at_its_level():
    model, update = _loop_update({"levels": "band"})
    before = update.multipliers()["descent"].clone()
    update.zero_grad()
    update.backward(_losses(model, 4), levels=torch.full((4,), 1))  # every row drawn at level 0.5
    update.step()
    moved = (update.multipliers()["descent"] != before).reshape(len(BAND), 2)
    assert update.labels["descent"] == ["l1<=l0@0", "l2<=l1@0", "l1<=l0@0.5", "l2<=l1@0.5", "l1<=l0@1", "l2<=l1@1"]
    assert moved.tolist() == [[False, False], [True, True], [False, False]]


def test_a_per_sample_multiplier_moves_only_for_the_rows_in_the_batch():
    # resilience decays lambda, but only where a row was seen: the others keep their value
    model, update = _loop_update({"per_sample": True, "resilience": 2.0}, rows=6)
    for rows in ([0, 1, 2, 3, 4, 5], [1, 4]):
        before = update.multipliers()["descent"].clone()
        update.zero_grad()
        update.backward(_losses(model, len(rows)), rows=torch.tensor(rows))
        update.step()
    table = update.multipliers()["descent"]
    assert table.shape == (6, 2)
    moved = (table != before).any(dim=1).tolist()
    assert moved == [False, True, False, False, True, False]
    assert bool((before[[0, 2, 3, 5]] > 0).all())  # so the rows left alone had a lambda weight decay would have shrunk


def test_a_per_sample_primal_term_is_the_mean_over_the_rows_of_lambda_times_their_violation():
    _, update = _loop_update({"per_sample": True}, rows=4)
    table = torch.tensor([[1.0, 2.0], [0.0, 1.0], [3.0, 0.0], [0.5, 0.5]])
    update.problem.constraints["descent"].multiplier.weight.data = table.reshape(-1, 1).clone()
    losses = torch.tensor([[1.0, 2.0, 2.5], [2.0, 1.0, 1.5]], requires_grad=True)
    rows = torch.tensor([2, 0])
    loss = update.forward(losses, rows=rows)
    violation = losses[:, 1:] - 0.9 * losses[:, :-1].detach()
    expected = losses.mean(dim=0)[-1] + (table[rows] * violation).sum() / 2
    assert torch.allclose(loss, expected)


def test_constraints_held_per_sample_need_each_rows_index():
    model, update = _loop_update({"per_sample": True}, rows=4)
    with pytest.raises(ld.ConfigError, match="needs each row's index"):
        update.backward(_losses(model, 2))
    with pytest.raises(ld.ConfigError, match="outside 0..3"):
        update.backward(_losses(model, 2), rows=torch.tensor([1, 4]))
    with pytest.raises(ld.ConfigError, match="per_sample = true needs the training rows' count"):
        _loop_update({"per_sample": True})


def test_a_third_party_kind_opts_in_to_per_sample_by_a_violation_taken_per_row():
    @dataclass(frozen=True)
    class Gap(ld.ConstraintSpec):
        kind: ClassVar[str] = "gap"
        per_row: ClassVar[bool] = True

        def labels(self, num_layers):
            return ["l0<=l1+1"]

        def violation(self, means, state):
            return means[..., :1] - means[..., 1:2] - 1.0

    @dataclass(frozen=True)
    class Opaque(Gap):
        kind: ClassVar[str] = "opaque"
        per_row: ClassVar[bool] = False

    model = torch.nn.Linear(3, 3)
    update = ld.LayerwiseUpdate([Gap(per_sample=True)], 2, torch.optim.SGD(model.parameters(), lr=0.0), dual_lr=1.0, rows=3)
    update.backward(torch.tensor([[5.0, 1.0, 0.0], [0.0, 1.0, 0.0]]), rows=torch.tensor([0, 2]))
    update.step()
    assert update.multipliers()["gap"].flatten().tolist() == [3.0, 0.0, 0.0]  # row 2 met it: projected to 0
    with pytest.raises(ld.ConfigError, match="'opaque' does not declare"):
        Opaque(per_sample=True)


def _band_config(tiny, constraint: dict, sampling: str = "draw") -> dict:
    tiny["train"].update(train_gamma=BAND, gamma_sampling=sampling)
    tiny["constraints"] = [{"kind": "descent", "alpha": 0.05, **constraint}]
    return tiny


def _gammas_seen(monkeypatch) -> list[float]:
    """Record the gamma of every training forward pass."""
    from layerdescent_lista import SparseCoding

    seen, original = [], SparseCoding.layer_losses

    def layer_losses(self, model, batch, gamma=0.0):
        if model.training:
            seen.append(gamma)
        return original(self, model, batch, gamma)

    monkeypatch.setattr(SparseCoding, "layer_losses", layer_losses)
    return seen


def test_a_band_draws_one_level_per_micro_batch_the_same_for_every_solver(tiny, tmp_path, monkeypatch):
    seen = _gammas_seen(monkeypatch)
    ld.train(config_from_dict(_band_config(copy.deepcopy(tiny), {})), tmp_path / "pd")
    drawn = list(seen)
    seen.clear()
    erm = _band_config(copy.deepcopy(tiny), {})
    erm["solver"] = {"name": "penalty"}
    ld.train(config_from_dict(erm), tmp_path / "penalty")
    assert drawn == seen  # augmentation is the same for every solver: any gain is the constraint's
    assert len(drawn) == 2 * 8 and set(drawn) == set(BAND)


def test_gamma_sampling_all_takes_every_micro_batch_at_every_level(tiny, tmp_path, monkeypatch):
    seen = _gammas_seen(monkeypatch)
    results = ld.train(config_from_dict(_band_config(tiny, {"levels": "band"}, "all")), tmp_path / "run")
    assert seen == BAND * 16
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in lines if r["event"] == "train"]
    assert all(None not in r["violation"]["descent"] for r in train)  # every level is seen at every step
    assert len(results["constraints"]["descent"]["lambda"]) == 3 * 4


def test_a_levels_run_logs_and_records_its_multipliers_per_level(tiny, tmp_path):
    tiny["train"]["log_every"] = 1
    results = ld.train(config_from_dict(_band_config(tiny, {"levels": [0.5, 1.0]})), tmp_path / "run")
    record = results["constraints"]["descent"]
    assert record["labels"][:2] == ["l1<=l0@0.5", "l2<=l1@0.5"] and len(record["lambda"]) == 2 * 4
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    violations = [r["violation"]["descent"] for r in lines if r["event"] == "train"]
    # one level a step: a step drawn at 0 observes no held level, one drawn at 0.5 only that level's entries
    assert any(v == [None] * 8 for v in violations)
    assert any(v[:4] != [None] * 4 and v[4:] == [None] * 4 for v in violations)


def test_a_per_sample_run_records_the_share_of_rows_that_meet_it(tiny, tmp_path):
    tiny["constraints"] = [{"kind": "descent", "alpha": 0.05, "per_sample": True, "resilience": 5.0}]
    results = ld.train(config_from_dict(tiny), tmp_path / "run")
    summary = results["constraints"]["descent"]["per_sample"]
    assert summary["rows"] == 512
    assert 0.0 <= summary["satisfied_rows"] <= 1.0 and 0.0 < summary["binding_rows"] <= 1.0
    assert len(summary["lambda_max"]) == 4
    assert max(results["constraints"]["descent"]["lambda"]) <= max(summary["lambda_max"])


def _killed_and_resumed(tmp_path, config: dict, kill_at: int) -> tuple:
    script = tmp_path / "runner.py"
    script.write_text(RUNNER)
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}

    def run(out, mode, n=0):
        return subprocess.run(
            [sys.executable, str(script), json.dumps(config), str(out), mode, str(n)], env=env, capture_output=True, text=True
        )

    whole = run(tmp_path / "whole", "none")
    assert whole.returncode == 0, whole.stderr
    killed = run(tmp_path / "killed", "step", kill_at)
    assert killed.returncode == -9
    resumed = run(tmp_path / "killed", "resume")
    assert resumed.returncode == 0, resumed.stderr
    return tmp_path / "whole", tmp_path / "killed"


@pytest.mark.parametrize("constraint", [{"levels": "band"}, {"per_sample": True, "resilience": 5.0}], ids=["levels", "per-sample"])
def test_a_shift_robust_run_resumes_bit_identically_after_sigkill(tiny, tmp_path, constraint):
    config = _band_config(tiny, constraint)
    # killed mid-epoch, between checkpoints: the resumed run redraws the same levels for the steps it repeats
    config["train"].update(epochs=3, checkpoint_every=3, keep_checkpoint=True, threads=1, log_every=2)
    whole, killed = _killed_and_resumed(tmp_path, config, kill_at=13)
    assert json.loads((whole / "results.json").read_text()) | {"train": None, "eval_seconds": None} == json.loads(
        (killed / "results.json").read_text()
    ) | {"train": None, "eval_seconds": None}
    a, b = load_checkpoint(whole / "checkpoint.pt", "lista", kind="run"), load_checkpoint(killed / "checkpoint.pt", "lista", kind="run")
    assert torch.equal(_table(a), _table(b))
    assert (whole / "metrics.jsonl").read_text() == (killed / "metrics.jsonl").read_text()


def _table(state: dict) -> torch.Tensor:
    """The descent constraint's multiplier table in a run checkpoint."""
    return state["problem"]["cmp"]["multipliers"]["descent"]["weight"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"constraints": [{"kind": "descent", "levels": "band"}]},
            "constraints[0].levels needs a training band: set train.train_gamma to a list",
        ),
        (
            {"train": {"train_gamma": [0.0, 0.5]}, "constraints": [{"kind": "descent", "levels": [0.5, 2.0]}]},
            "constraints[0].levels: 2 not in train.train_gamma's band (0, 0.5)",
        ),
        (
            {"train": {"train_gamma": [0.0, 0.5]}, "constraints": [{"kind": "descent", "levels": "all"}]},
            "constraints[0].levels must be 'band' or a list of numbers, got 'all'",
        ),
        ({"train": {"gamma_sampling": "all"}}, "train.gamma_sampling = 'all' needs a band"),
        ({"train": {"train_gamma": [0.0, -1.0]}}, "train.train_gamma must be >= 0 (every level of the band)"),
        ({"train": {"train_gamma": [0.5, 0.5]}}, "train.train_gamma names a level twice"),
        ({"train": {"train_gamma": []}}, "train.train_gamma must hold at least one level"),
        ({"constraints": [{"kind": "descent", "per_sample": "yes"}]}, "constraints[0].per_sample must be true or false"),
    ],
)
def test_every_mistake_in_the_shift_options_is_one_line_naming_the_key(tiny, tmp_path, change, message):
    for section, value in change.items():
        if isinstance(value, dict):
            tiny[section] = {**tiny.get(section, {}), **value}
        else:
            tiny[section] = value
    status, lines = cli("run", config_file(tmp_path, tiny), "--out", tmp_path / "out")
    assert_one_line(status, lines, message)
    assert not (tmp_path / "out").exists()


def test_the_augmented_lagrangian_refuses_a_grouped_constraint_in_one_line(tiny, tmp_path):
    _band_config(tiny, {"levels": "band"})
    tiny["solver"].update(formulation="augmented-lagrangian")
    with pytest.raises(ld.ConfigError, match="use solver.formulation = 'lagrangian'"):
        ld.train(config_from_dict(tiny), tmp_path / "run")


@pytest.mark.parametrize("scheme", ["alternating", "alternating-primal-dual", "extrapolation"])
def test_shift_robust_constraints_compose_with_every_scheme(tiny, tmp_path, scheme):
    config = _band_config(tiny, {"levels": "band", "per_sample": True, "reference": "anchored"})
    config["constraints"].append({"kind": "bound", "value": 1.0, "per_sample": True})
    config["solver"].update(scheme=scheme)
    results = ld.train(config_from_dict(config), tmp_path / "run")
    assert max(results["constraints"]["descent"]["per_sample"]["lambda_max"]) > 0
    assert len(results["constraints"]["descent"]["labels"]) == 3 * 5  # 4 transitions and the anchor, at 3 levels


def test_a_recorded_config_without_the_shift_options_is_unchanged(tiny):
    table = config_from_dict(tiny).as_dict()
    assert (
        "gamma_sampling" not in table["train"] and "per_sample" not in table["constraints"][0] and "levels" not in table["constraints"][0]
    )
