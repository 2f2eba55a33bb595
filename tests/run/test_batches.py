"""A loop of one's own that follows layerdescent.batches takes a run's steps in its order, and ends with its multipliers bit for bit."""

from __future__ import annotations

import copy

import pytest
import torch
from helpers import REPO, RUN, docs_block

import layerdescent as ld


def _own_loop(config: ld.RunConfig) -> dict[str, list]:
    """The docs' loop: build_session, then every step of layerdescent.batches through the update; the final multipliers."""
    session = ld.build_session(config)
    task, model, update = session.task, session.model, session.update
    for epoch in range(config.train.epochs):
        for step in ld.batches(session, epoch):
            update.zero_grad()
            for micro in step:
                losses = torch.cat([task.layer_losses(model, micro.batch, gamma=g).losses for g in micro.gammas])
                update.backward(losses, micro.weight, rows=micro.rows, levels=micro.levels)
            update.step()
        update.end_epoch()
    # results.json records a per-sample table as its mean over the rows
    return {name: (value.mean(dim=0) if value.dim() == 2 else value).tolist() for name, value in update.multipliers().items()}


@pytest.mark.parametrize(
    "change",
    [
        pytest.param({}, id="defaults"),
        pytest.param(
            {
                "train": {"epochs": 2, "train_gamma": [0.0, 0.5, 1.0], "accumulate": 3},
                "constraints": [{"kind": "descent", "alpha": 0.05, "levels": "band"}],
            },
            id="levels-on-a-band-accumulated",
        ),
        pytest.param(
            {
                "train": {"train_gamma": [0.0, 0.5], "gamma_sampling": "all"},
                "constraints": [{"kind": "descent", "alpha": 0.05, "per_sample": True}],
            },
            id="per-sample-every-level",
        ),
        pytest.param({"train": {"epochs": 2}, "solver": {"dual_every": "epoch"}}, id="dual-step-per-epoch"),
    ],
)
def test_own_loop_over_batches_reproduces_a_runs_multipliers_bit_for_bit(tmp_path, change):
    table = copy.deepcopy(RUN)
    for section, value in change.items():
        table[section] = value if isinstance(value, list) else {**table.get(section, {}), **value}
    config = ld.config_from_dict(table)
    results = ld.train(config, tmp_path / "run")
    recorded = {name: entry["lambda"] for name, entry in results["constraints"].items()}
    assert any(v > 0 for values in recorded.values() for v in values)  # a multiplier moved, so equality says something
    assert _own_loop(config) == recorded


def test_batches_follow_the_runs_order_levels_and_shares():
    table = copy.deepcopy(RUN)
    table["train"] = {**table["train"], "train_gamma": [0.0, 0.5, 1.0], "accumulate": 2, "batch_size": 48}
    config = ld.config_from_dict(table)
    session = ld.build_session(config)
    steps = list(ld.batches(session, 0))
    rows = torch.cat([micro.rows for step in steps for micro in step])
    assert sorted(rows.tolist()) == list(range(len(session.rows["train"])))  # every training row once per epoch
    assert [sum(m.weight for m in step) for step in steps] == pytest.approx([1.0] * len(steps))
    assert all(len(step) <= 2 and all(len(m.gammas) == 1 for m in step) for step in steps)
    assert {m.gammas[0] for step in steps for m in step} <= {0.0, 0.5, 1.0}
    assert [m.rows.tolist() for m in steps[0]] == [m.rows.tolist() for m in next(ld.batches(session, 0))]  # drawn from seed and epoch
    assert [m.rows.tolist() for m in steps[0]] != [m.rows.tolist() for m in next(ld.batches(session, 1))]


def test_collate_rows_takes_a_dataloaders_batches_and_collate_names_it_for_a_list():
    session = ld.build_session(ld.config_from_dict(RUN))
    task, split = session.task, session.task.build_datasets()["train"]
    loader = torch.utils.data.DataLoader(split, batch_size=8, collate_fn=task.collate_rows)
    batch, expected = next(iter(loader)), task.collate(split[list(range(8))])
    assert batch.keys() == expected.keys() and all(torch.equal(batch[k], expected[k]) for k in batch)
    with pytest.raises(ld.ConfigError, match=r"not a list of rows: use task.collate_rows"):
        task.collate([split[0], split[1]])


def test_docs_reproduce_example_runs_as_written_and_matches_the_run(tmp_path):
    namespace: dict = {}
    exec(compile(docs_block("reproduce-example", REPO / "docs" / "own-loop.md"), "docs/own-loop.md:reproduce", "exec"), namespace)
    results = ld.train(namespace["config"], tmp_path / "run")
    assert namespace["update"].multipliers()["descent"].tolist() == results["constraints"]["descent"]["lambda"]
