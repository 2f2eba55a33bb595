"""Test a finished run's model again, under another perturbation or gamma grid, without retraining it."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import tomli_w

from layerdescent.errors import ConfigError
from layerdescent.registry import Registry
from layerdescent.results import read_results  # the same checks a summary makes
from layerdescent.run import files, finish, lock, provenance, rundir
from layerdescent.run.checkpoint import load_checkpoint, load_model_file
from layerdescent.run.config import RunConfig, load_config
from layerdescent.run.evaluator import evaluate_all
from layerdescent.run.progress import progress_bar
from layerdescent.run.stopping import check_finite_results
from layerdescent.run.trainer import Trainer

# What a re-evaluation may change: how the finished model is tested, never how it was trained.
REEVALUATE_KEYS = ("task.perturbation", "eval.")


def evaluate_config(run_dir: str | Path, overrides: Sequence[str] = (), registry: Registry | None = None) -> RunConfig:
    """The config a re-evaluation of ``run_dir`` runs under: its recorded one, with only task.perturbation and eval.* changed."""
    run_dir = Path(run_dir)
    if not (run_dir / "results.json").exists():
        raise ConfigError(f"{run_dir} holds no finished run (no results.json): train it to the end first")
    for override in overrides:
        key = override.partition("=")[0].strip()
        if not key.startswith(REEVALUATE_KEYS):
            raise ConfigError(f"re-evaluation can change only task.perturbation and eval.*, not {key} (that needs a new run)")
    return load_config(run_dir / "config.toml", list(overrides), registry)


def evaluate_run(
    run_dir: str | Path, out: str | Path, overrides: Sequence[str] = (), registry: Registry | None = None, threads: int | None = None
) -> dict[str, Any]:
    """Test a finished run's final model again (another perturbation or gamma grid) into ``out``; ``threads`` overrides train.threads."""

    run_dir, out = Path(run_dir), Path(out)
    config = evaluate_config(run_dir, overrides, registry)
    if threads is not None:  # an execution key: the numbers are the same on any thread count
        config = dataclasses.replace(config, train=dataclasses.replace(config.train, threads=threads))
    model_file = rundir.final_model_file(run_dir, config)
    if out.resolve() == run_dir.resolve():
        raise ConfigError(f"--out must differ from the run directory {run_dir}: its results would be overwritten")
    recorded = read_results(run_dir / "results.json")
    trainer = Trainer(config, out, registry)
    with lock.claim(out) as held:
        session = trainer.setup()
        # The model that was tested: the best validation epoch's when early stopping kept one.
        if model_file.suffix == ".safetensors":
            state = load_model_file(model_file)
        else:
            state = load_checkpoint(model_file, trainer.task.name, kind="model")["model"]
        trainer.load_model(model_file, session.model, state)
        shown = config.train.progress and session.world.is_main
        evaluation = evaluate_all(
            trainer.task,
            session.model,
            session.rows[config.eval.split],
            config.eval,
            session.world,
            lambda total: progress_bar(total, 0, f"{out} evaluation", shown, unit="batch"),
        )
        check_finite_results(evaluation, trainer.who)
        results = {
            **{k: v for k, v in recorded.items() if k != "domains"},
            "split": config.eval.split,
            "perturbation": trainer.task.perturbation,
            "evaluated_from": str(run_dir),
            "evaluated_by": provenance.code(),  # the training's code stays in "code"; this evaluation's may differ
            **evaluation,
        }
        if session.world.is_main:
            held.check()  # an --out moved or replaced while the model was tested is not written into
            files.write_atomic(out / "config.toml", tomli_w.dumps(config.as_dict()))
            finish.write_results(out / "results.json", results)
    session.world.close()
    return results
