"""Per-layer metrics: a task's every-layer predictions give each metric at every layer."""

from __future__ import annotations

from typing import Any

import datasets
import torch
import torchmetrics

import layerdescent as ld
from layerdescent.run.evaluator import evaluate


class ThreeLayerVote(ld.Task):
    """Hand-made predictions: layer 0 always wrong, layer 1 right on even rows, layer 2 always right."""

    name = "vote"

    @property
    def num_layers(self) -> int:
        return 2

    def build_model(self) -> torch.nn.Module:
        return torch.nn.Linear(1, 1)

    def build_datasets(self) -> dict[str, datasets.Dataset]:
        split = datasets.Dataset.from_dict({"label": [0, 1, 1, 0, 1, 0]}).with_format("torch")
        return {"train": split, "validation": split, "test": split}

    def collate(self, rows: dict[str, Any]) -> dict[str, torch.Tensor]:
        return {"label": rows["label"], "row": torch.arange(len(rows["label"]))}

    def layer_losses(self, model, batch, gamma=0.0) -> ld.LayerOutput:
        label, even = batch["label"], batch["row"] % 2 == 0
        votes = torch.stack([1 - label, torch.where(even, label, 1 - label), label], dim=1)  # B x 3
        logits = torch.nn.functional.one_hot(votes, 2).float()
        losses = torch.zeros(len(label), 3)
        return ld.LayerOutput(losses, preds=logits[:, -1], target=label, layer_preds=logits)

    def metrics(self) -> torchmetrics.MetricCollection:
        return torchmetrics.MetricCollection({"accuracy": torchmetrics.classification.MulticlassAccuracy(num_classes=2, average="micro")})


def test_each_layer_gets_the_accuracy_of_its_own_predictions():
    task = ThreeLayerVote()
    record = evaluate(task, task.build_model(), task.build_datasets()["test"], [0.0], batch_size=4)[0]
    assert record["layer_metrics"] == {"accuracy": [0.0, 0.5, 1.0]}
    assert record["metrics"]["accuracy"] == 1.0


def test_a_task_without_layer_predictions_records_no_layer_metrics(tiny, tmp_path):
    tiny["train"]["epochs"] = 1
    results = ld.train(ld.config_from_dict(tiny), tmp_path / "run")
    assert "layer_metrics" not in results["gammas"][0]


def test_the_summary_has_a_table_of_each_metric_per_layer(tmp_path):
    import json

    from layerdescent.analysis.report import write_report

    for seed, accuracy in ((0, [0.5, 0.7, 0.9]), (1, [0.5, 0.8, 0.9])):
        run = tmp_path / f"s{seed}"
        run.mkdir()
        record = {
            "gamma": 0.0,
            "layer_loss": [0.7, 0.5, 0.3],
            "descent_rate": [0.9, 0.9],
            "metrics": {"accuracy": accuracy[-1]},
            "samples": 10,
            "layer_metrics": {"accuracy": accuracy},
        }
        (run / "results.json").write_text(
            json.dumps(
                {
                    "schema": 1,
                    "label": "erm",
                    "task": "t",
                    "solver": "erm",
                    "seed": seed,
                    "num_layers": 2,
                    "split": "test",
                    "train": {"steps": 1, "epochs": 1},
                    "constraints": {},
                    "gammas": [record],
                }
            )
        )
    text = write_report(tmp_path).read_text()
    table = text.split("## accuracy per layer at γ=0")[1].split("\n## ")[0]
    assert "| erm | 0.5 ± 0 | 0.75 ± 0.07 | 0.9 ± 0 |" in table
