"""benchmarks/tuning_rule.py: video_deep's tuning rule adopts the lowest validation loss among the settings that qualify."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from helpers import REPO, assert_script_remakes, run_benchmark_script

spec = importlib.util.spec_from_file_location("tuning_rule", REPO / "benchmarks" / "tuning_rule.py")
tuning_rule = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tuning_rule)


def finished(root: Path, label: str, loss: float, lambdas: list[float] = ()) -> None:
    run = root / label / "seed-100"
    run.mkdir(parents=True)
    constraints = {"descent": {"labels": [f"l{i + 1}<=l{i}" for i in range(len(lambdas))], "lambda": list(lambdas)}} if lambdas else {}
    (run / "results.json").write_text(json.dumps({"train": {"best_val_loss": [1.0, loss]}, "constraints": constraints}))


def diverged(root: Path, label: str, step: int) -> None:
    run = root / label / "seed-100"
    run.mkdir(parents=True)
    record = {"epoch": 2, "step": step, "error": "DivergenceError: multiplier exploded; the last checkpoint is intact"}
    (run / "failure.json").write_text(json.dumps(record) + "\n")


def every_dust_run(root: Path, losses: dict[str, float], binding: dict[str, list[float]]) -> None:
    for label in [*tuning_rule.settings("dust")["primal-dual"], *tuning_rule.settings("dust")["penalty"]]:
        if label in losses:
            finished(root, label, losses[label], binding.get(label, [0.0, 0.0] if "primal-dual" in label else []))


def adopted(root: Path, solver: str) -> tuple[str | None, str]:
    labels = tuning_rule.settings("dust")[solver]
    return tuning_rule.decide({label: tuning_rule.read_run(root / label / "seed-100") for label in labels}, solver)


def test_primal_dual_adopts_the_lowest_loss_where_a_multiplier_binds_and_never_a_failed_run(tmp_path):
    pd = tuning_rule.settings("dust")["primal-dual"]  # 0.05 detached, 0.05 anchored, 0.2 detached, 0.2 anchored
    every_dust_run(tmp_path, {pd[0]: 0.003, pd[2]: 0.002, pd[3]: 0.001}, {pd[0]: [0.0, 0.4], pd[2]: [0.1, 0.2]})
    diverged(tmp_path, pd[1], 102)
    # pd[3] is lowest but binds nothing; pd[1] failed
    assert adopted(tmp_path, "primal-dual") == (pd[2], "")
    text = tuning_rule.markdown(tmp_path, "cmd")
    assert f"| {pd[1]} | failed at step 102: DivergenceError: multiplier exploded |  | no: failed |" in text
    assert f"| {pd[3]} | 0.001000 | 0 of 2 | no: no multiplier binds |" in text
    assert "- primal-dual: **primal-dual,alpha=0.2,detached**" in text


def test_ties_go_to_the_smaller_alpha_the_detached_reference_and_the_larger_rho(tmp_path):
    pd, penalty = tuning_rule.settings("dust")["primal-dual"], tuning_rule.settings("dust")["penalty"]
    bound = {label: [1.0] for label in pd}
    every_dust_run(tmp_path, {pd[0]: 0.0020005, pd[1]: 0.002, pd[2]: 0.002, pd[3]: 0.002, **{p: 0.01 for p in penalty}}, bound)
    assert adopted(tmp_path, "primal-dual") == (pd[0], "")  # within 1e-6 of the lowest
    assert adopted(tmp_path, "penalty") == (penalty[0], "")  # rho = 1


def test_the_rule_waits_for_every_run_of_a_family(tmp_path):
    pd = tuning_rule.settings("dust")["primal-dual"]
    every_dust_run(tmp_path, {pd[0]: 0.001}, {pd[0]: [1.0]})
    assert adopted(tmp_path, "primal-dual") == (None, "undecided: 3 of 4 runs unfinished")
    for label in pd[1:]:
        diverged(tmp_path, label, 5)
    assert adopted(tmp_path, "primal-dual") == (pd[0], "")


def test_the_script_writes_its_table_with_its_command(tmp_path):
    out = tmp_path / "tuning_rule.md"
    run_benchmark_script("tuning_rule.py", str(tmp_path), "--out", str(out)).check_returncode()
    text = out.read_text()
    assert f"python benchmarks/tuning_rule.py {tmp_path} --out {out}" in text
    assert text.count("undecided: 4 of 4 runs unfinished") == 4  # two solvers, two architectures, nothing run


def test_the_script_reproduces_the_committed_tuning_rule(tmp_path):
    root = REPO / "benchmarks/results/video_deep"
    assert_script_remakes(tmp_path, root / "tuning_rule.md", "tuning_rule.py", str(root))


def test_each_rule_reads_the_tuning_variants_its_bench_file_declares():
    from layerdescent.run.config_file import read_toml

    declared = {name: set(read_toml(REPO / "benchmarks" / f"{name}.toml")["bench"]["variants"]) for name in ("video_levels",)}
    video = {label for arch in tuning_rule.LEVELS_ARCHS for labels in tuning_rule.video_levels_settings(arch).values() for label in labels}
    assert video == {label for label in declared["video_levels"] if label.startswith("tune-")}
