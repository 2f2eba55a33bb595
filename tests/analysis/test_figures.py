"""The paper-layout figures of benchmarks/figures.py, drawn from small results trees."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "figures.py"


def _record(gamma: float, loss: float, metric: str, value: float) -> dict:
    return {
        "gamma": gamma,
        "layer_loss": [2 * loss, 1.5 * loss, loss],
        "descent_rate": [0.9, 0.8],
        "metrics": {metric: value},
        "samples": 10,
    }


def _run(root: Path, label: str, solver: str, seed: int, metric: str, config: str, domains=(), split: str = "test", **train) -> None:
    run = root / label / f"seed-{seed}"
    run.mkdir(parents=True)
    (run / "config.toml").write_text(f'seed = {seed}\nlabel = "{label}"\n{config}\n[solver]\nname = "{solver}"\n')
    records = [_record(g, 0.5 + g, metric, 0.9 - 0.1 * g - 0.01 * seed) for g in (0.0, 0.8, 1.6)]
    result = {
        "schema": 1,
        "label": label,
        "task": "t",
        "solver": solver,
        "seed": seed,
        "num_layers": 2,
        "split": split,
        "train": {"steps": 1, "epochs": 1, **train},
        "constraints": {},
        "gammas": records,
    }
    if domains:
        result["domains"] = {name: records for name in domains}
    (run / "results.json").write_text(json.dumps(result))


def _draw(bench: str, root: Path) -> list[str]:
    done = subprocess.run([sys.executable, str(SCRIPT), bench, "--root", str(root)], check=True, capture_output=True, text=True)
    names = done.stdout.split()
    assert names and all((root / name).stat().st_size > 0 for name in names)
    return names


def test_text_figures_give_one_figure_1_and_5_per_regime_and_a_figure_4_panel_per_domain(tmp_path):
    """A variant that names no regime (erm trained clean) is drawn in every regime's figures, not in a figure of its own."""
    for regime in ("0.2", "0.8"):
        for label, solver, alpha in (
            ("erm", "erm", 0.05),
            ("primal-dual", "primal-dual", 0.05),
            ("alpha=0.1", "primal-dual", 0.1),
            ("alpha=0.4", "primal-dual", 0.4),
        ):
            for seed in (0, 1):
                constraint = f'[[constraints]]\nkind = "descent"\nalpha = {alpha}'
                _run(
                    tmp_path,
                    f"{label},train_gamma={regime}",
                    solver,
                    seed,
                    "accuracy",
                    f"[train]\ntrain_gamma = {regime}\n{constraint}",
                    domains=("amazon", "nyt"),
                    best_val_loss=[0.7, 0.6, 0.5 - alpha],
                )
    _run(tmp_path, "erm-clean", "erm", 0, "accuracy", "[train]\ntrain_gamma = 0.0", domains=("amazon", "nyt"))
    names = _draw("text_paper", tmp_path)
    assert sorted(names) == sorted(
        [
            "figure1_train_gamma=0.2.png",
            "figure1_train_gamma=0.8.png",
            "figure4.png",
            "figure5_train_gamma=0.2.png",
            "figure5_train_gamma=0.8.png",
        ]
    )


def test_video_figures_are_a_grid_of_architectures_by_videos_and_rmse_against_depth(tmp_path):
    for video in ("vtest", "bikes"):
        for arch in ("dust", "l1l1"):
            for solver in ("erm", "primal-dual"):
                _run(
                    tmp_path / "paper",
                    f"{video}-{arch}-{solver}",
                    solver,
                    0,
                    "rmse",
                    f'[task]\nname = "t"\narch = "{arch}"\ndataset = "{video}"',
                    domains=("carphone",),
                )
    assert _draw("video_paper", tmp_path / "paper") == ["figure2.png", "figure2_domain=carphone.png"]
    for depth in (2, 4, 8):
        for solver in ("erm", "primal-dual"):
            _run(tmp_path / "depth", f"depth{depth}-{solver}", solver, 0, "rmse", f'[task]\nname = "t"\nlayers = {depth}')
    assert _draw("video_depth", tmp_path / "depth") == ["figure3.png"]
    assert _draw("video_depth_noisy", tmp_path / "depth") == ["figure3.png"]


def test_video_deep_figure_2_leaves_out_tuning_runs_and_draws_the_band_trained_forms_apart(tmp_path):
    import importlib.util

    from layerdescent.analysis.report import collect, summarize

    spec = importlib.util.spec_from_file_location("figures", SCRIPT)
    figures = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(figures)
    for arch in ("dust", "transformer"):
        for solver in ("erm", "penalty", "primal-dual"):
            task = f'[task]\nname = "t"\narch = "{arch}"\ndataset = "vtest"'
            _run(tmp_path, f"vtest-{arch}-{solver}", solver, 0, "rmse", f"{task}\n[train]\ntrain_gamma = 0.13", domains=("bikes",))
            _run(
                tmp_path,
                f"vtest-{arch}-{solver}-band",
                solver,
                0,
                "rmse",
                f"{task}\n[train]\ntrain_gamma = [0.0, 0.13]",
                domains=("bikes",),
            )
        _run(tmp_path, f"tune-{arch}-primal-dual", "primal-dual", 100, "rmse", f"{task}\n[train]\ntrain_gamma = 0.13", split="validation")
    groups = summarize(collect(tmp_path))
    assert sorted(figures.one_level(groups)) == sorted(
        f"vtest-{a}-{s}" for a in ("dust", "transformer") for s in ("erm", "penalty", "primal-dual")
    )
    assert sorted(figures.band(groups)) == sorted(
        f"vtest-{a}-{s}-band" for a in ("dust", "transformer") for s in ("erm", "penalty", "primal-dual")
    )
    assert _draw("video_deep", tmp_path) == ["figure2.png", "figure2_domain=bikes.png", "figure2_band.png"]
