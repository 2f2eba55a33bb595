"""The end of a run: its tested model and results.json, written once both check."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from layerdescent import __version__
from layerdescent.errors import DivergenceError
from layerdescent.results import RESULTS_SCHEMA, check
from layerdescent.run import provenance
from layerdescent.run.files import write_atomic
from layerdescent.run.layout import EVALUATION_PARTIAL, MODEL_FILE


def results_table(
    config: Any,
    task: Any,
    position: Any,
    step_times: list[float],
    skipped: int,
    update: Any,
    evaluation: dict[str, Any],
    satisfied: dict[str, float] | None = None,
) -> dict[str, Any]:
    """What results.json holds (schema ``RESULTS_SCHEMA``): the run, how it trained, its multipliers and its evaluation.

    A per-sample constraint records each entry's mean lambda over the training rows, with its
    maximum, the share of rows whose multiplier binds and the share that meet it at the end (``satisfied``).
    """

    from layerdescent.core.update import relaxations  # imports torch, which the executors loading this module do not need

    train = config.train
    relaxed = relaxations(update.problem.specs, update.multipliers())
    return {
        "schema": RESULTS_SCHEMA,
        "layerdescent": __version__,
        "code": provenance.code(),  # which code made it, so a report can flag pairs made by two versions
        "machine": provenance.machine(),  # where: float results differ in their last digits between CPU models
        "label": config.name,
        "task": task.name,
        "solver": config.solver.name,
        "seed": config.seed,
        "num_layers": task.num_layers,
        "split": config.eval.split,
        "perturbation": task.perturbation,
        "train": {
            "steps": position.step,
            "epochs": position.epoch,
            **({"best_epoch": position.best_epoch, "best_val_loss": position.best_val_loss} if train.early_stopping else {}),
            "step_time_median": statistics.median(step_times) if step_times else None,
            "skipped_steps": skipped,
        },
        "constraints": {
            name: _constraint_record(update.labels[name], value, relaxed.get(name), (satisfied or {}).get(name))
            for name, value in update.multipliers().items()
        },
        **evaluation,
    }


def _constraint_record(labels: list[str], value: Any, relaxation: Any, satisfied: float | None) -> dict[str, Any]:
    """results.json's entry for one constraint: labels and final lambdas (a per-sample table as its per-entry summary)."""
    if value.dim() != 2:
        return {"labels": labels, "lambda": value.tolist(), **({"relaxation": relaxation.tolist()} if relaxation is not None else {})}
    return {
        "labels": labels,
        "lambda": value.mean(dim=0).tolist(),
        **({"relaxation": relaxation.mean(dim=0).tolist()} if relaxation is not None else {}),
        "per_sample": {
            "rows": value.shape[0],
            "lambda_max": value.max(dim=0).values.tolist(),
            "binding_rows": float((value > 0).any(dim=1).double().mean()),
            "satisfied_rows": satisfied,
        },
    }


def finish(run_dir: Path, model_state: dict[str, Any], results: dict[str, Any], keep_checkpoint: bool, who: str = "the model") -> None:
    """Write the tested model and results.json; drop optimizer state unless asked to keep it (it is most of the bytes); ``who`` names the task in errors."""

    import torch  # this module is loaded by the registry's executors, where torch is not yet needed

    from layerdescent.run.checkpoint import previous_path, save_model_file  # imports torch too

    # A parameter the loss never reads escapes every check of the loss; the saved model must still load.
    nonfinite = next(
        (name for name, value in model_state.items() if value.is_floating_point() and not bool(torch.isfinite(value).all())), None
    )
    if nonfinite is not None:
        raise DivergenceError(
            f"{who}: parameter {nonfinite!r} holds non-finite (NaN or infinite) values after training, though the losses stayed finite (no loss reads it): "
            f"neither {MODEL_FILE} nor results.json was written; fix how the task builds or updates it"
        )
    save_model_file(run_dir / MODEL_FILE, model_state)
    write_results(run_dir / "results.json", results)
    (run_dir / EVALUATION_PARTIAL).unlink(missing_ok=True)  # results.json holds every record now
    if not keep_checkpoint:
        for stale in (run_dir / "checkpoint.pt", run_dir / "best.pt"):
            stale.unlink(missing_ok=True)
            previous_path(stale).unlink(missing_ok=True)


def write_results(path: Path, results: dict[str, Any]) -> None:
    """Write ``results`` to ``path`` once the schema every reader applies (:func:`layerdescent.results.check`) accepts them."""

    check(results, path)  # a run never writes what a report would refuse to read
    write_atomic(path, json.dumps(results, indent=2) + "\n")
