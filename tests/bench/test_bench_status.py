"""``bench --status``: where each run of a bench stands, read from its directory while the bench trains or after it stopped."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import LAYERDESCENT
from helpers import RUN, config_file, with_

import layerdescent as ld
from layerdescent.bench.runner import run_bench
from layerdescent.cli import main
from layerdescent.run import layout, rundir

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="tells a live holder from a stale pid through /proc")


def status(path: Path, out: Path, *argv: str) -> list[str]:
    """The lines `layerdescent bench PATH --out OUT --status` prints."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["bench", str(path), "--out", str(out), "--status", *argv]) == 0
    return printed.getvalue().splitlines()


def files(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``root`` with its size and modification time."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(root.rglob("*")) if p.is_file()}


def test_bench_status_tells_each_run_done_training_failed_stopped_or_pending_and_writes_nothing(tmp_path):
    long = with_(with_(with_(RUN, "train.epochs", 10_000), "task.train_size", 512), "train.checkpoint_every", 2)
    bench = {
        **RUN,
        "bench": {
            "seeds": [0],
            "variants": {
                "erm": {"solver": {"name": "erm"}},
                # its multipliers pass 1e-9 on the first step, where alpha 0.9 binds
                "diverges": {"solver": {"max_multiplier": 1e-9}, "constraints": [{"kind": "descent", "alpha": 0.9}]},
                "long": {"train": long["train"], "task": long["task"]},
                "later": {"solver": {"name": "penalty"}},
            },
        },
    }
    path, out = config_file(tmp_path, bench, "bench.toml"), tmp_path / "out"
    with pytest.raises(ld.LayerdescentError, match="1 of 2 runs failed"):
        run_bench(path, out, only=["erm", "diverges"])
    # a pid that is alive but does not hold the directory, as after a crash and the pid's reuse
    (out / "later" / "seed-0").mkdir(parents=True)
    (out / "later" / "seed-0" / layout.LOCK).write_text(f"{os.getpid()}\n")

    proc = subprocess.Popen(
        [*LAYERDESCENT, "bench", str(path), "--out", str(out), "--only", "long"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        checkpoint, deadline = out / "long" / "seed-0" / "checkpoint.pt", time.time() + 240
        while time.time() < deadline and proc.poll() is None and not (checkpoint.exists() and rundir.last_record(checkpoint.parent)):
            time.sleep(0.2)
        assert checkpoint.exists(), "the long run should have checkpointed"
        before = {k: v for k, v in files(out).items() if not k.startswith("long/")}
        lines = status(path, out)
        assert {k: v for k, v in files(out).items() if not k.startswith("long/")} == before, "--status wrote to the bench"
        assert lines[0] == "erm seed 0: done"
        assert lines[1].startswith(
            "diverges seed 0: failed (at step 0, epoch 1 of 1: DivergenceError: step 0: multiplier of constraint 'descent' exploded"
        ), lines[1]
        assert lines[2].startswith(f"long seed 0: training (pid {proc.pid}, step "), lines[2]  # one worker: the bench's own process
        assert lines[2].endswith(" of 10000)")
        assert lines[3] == "later seed 0: pending"
        assert lines[4] == f"4 runs in {out}: 1 done, 1 training, 1 failed, 0 stopped, 1 pending"
        assert status(path, out, "--only", "erm")[1:] == [f"1 run in {out}: 1 done, 0 training, 0 failed, 0 stopped, 0 pending"]
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    lines = status(path, out, "--only", "l*")
    assert lines[0].startswith("long seed 0: stopped (at step ") and lines[0].endswith("; the bench resumes it)"), lines[0]
    assert lines[1:] == ["later seed 0: pending", f"2 runs in {out}: 0 done, 0 training, 0 failed, 1 stopped, 1 pending"]


def test_bench_status_estimates_the_training_left_from_the_finished_runs_step_times(tmp_path):
    import json

    bench = {**RUN, "bench": {"seeds": [0, 1], "variants": {"a": {"solver": {"name": "erm"}}, "b": {"solver": {"name": "penalty"}}}}}
    path, out = config_file(tmp_path, bench, "bench.toml"), tmp_path / "out"
    assert status(path, out)[-1].endswith("0 done, 0 training, 0 failed, 0 stopped, 4 pending")  # nothing finished: no estimate
    run_bench(path, out, only=["a"])
    finished = out / "a" / "seed-0" / "results.json"
    record = json.loads(finished.read_text())
    record["train"].update(steps=30, step_time_median=2.0)  # a run of 60 s
    finished.write_text(json.dumps(record))
    stopped = out / "a" / "seed-1"  # halfway through: 30 s left
    for name in list(stopped.iterdir()):
        name.unlink()
    (stopped / "checkpoint.pt").write_bytes(b"")
    (stopped / "metrics.jsonl").write_text(json.dumps({"event": "train", "epoch": 0, "step": 15}) + "\n")
    lines = status(path, out)
    assert lines[1].startswith("a seed 1: stopped (at step 15")
    # b has no finished run: each of its two runs is expected to take what a's did, 60 s
    assert lines[-1] == "about 2m30s of training left at 1 run at a time (from the step times of 1 finished run; evaluations not counted)"


def test_bench_status_names_a_run_under_another_config_which_the_bench_would_refuse(tmp_path):
    bench = {**RUN, "bench": {"seeds": [0], "variants": {"erm": {"solver": {"name": "erm"}}}}}
    path, out = config_file(tmp_path, bench, "bench.toml"), tmp_path / "out"
    run_bench(path, out)
    changed = config_file(tmp_path, with_(bench, "train.lr", 0.02), "changed.toml")
    assert status(changed, out) == [
        "erm seed 0: conflict (finished under another config, first at train.lr (recorded 0.01, asked 0.02))",
        f"1 run in {out}: 0 done, 0 training, 0 failed, 0 stopped, 0 pending, 1 conflict",
    ]


def test_a_failed_run_copied_without_its_lock_is_retried_and_its_failure_goes_once_it_trains(tmp_path):
    # alpha 0.9 binds on the first step; a multiplier limit of 1e-9 makes that a divergence
    diverging = {"solver": {"max_multiplier": 1e-9}, "constraints": [{"kind": "descent", "alpha": 0.9}]}
    bench = {**RUN, "bench": {"seeds": [0], "variants": {"diverges": diverging}}}
    path, out = config_file(tmp_path, bench, "bench.toml"), tmp_path / "out"
    run = out / "diverges" / "seed-0"
    with pytest.raises(ld.LayerdescentError, match="1 of 1 runs failed"):
        run_bench(path, out)
    (run / layout.LOCK).unlink()  # as `git clone` or a copy of the results leaves it
    assert sorted(p.name for p in run.iterdir()) == ["config.toml", "failure.json", "metrics.jsonl"]
    with pytest.raises(ld.LayerdescentError, match="diverges seed 0: DivergenceError: step 0"):
        run_bench(path, out)  # tried again and diverged again, not refused as a folder of someone's files
    assert status(path, out)[0].startswith("diverges seed 0: failed (at step 0")
    # trained again in its directory under a limit it stays within, the run finishes and its failure goes
    fixed = with_(with_(RUN, "solver.max_multiplier", 1e6), "constraints", diverging["constraints"])
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["run", str(config_file(tmp_path, fixed, "fixed.toml")), "--out", str(run)]) == 0
    assert (run / "results.json").exists() and not (run / layout.FAILURE).exists()


def test_skip_failed_leaves_a_failed_run_untouched_trains_the_rest_and_still_counts_it_failed(tmp_path, monkeypatch):
    diverging = {"solver": {"max_multiplier": 1e-9}, "constraints": [{"kind": "descent", "alpha": 0.9}]}  # diverges at step 0
    bench = {**RUN, "bench": {"seeds": [0], "variants": {"diverges": diverging, "erm": {"solver": {"name": "erm"}}}}}
    path, out = config_file(tmp_path, bench, "bench.toml"), tmp_path / "out"
    with pytest.raises(ld.LayerdescentError, match="1 of 1 runs failed"):
        run_bench(path, out, only=["diverges"])
    failed = out / "diverges" / "seed-0"
    before = files(failed)
    printed, error = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(error):
        assert main(["bench", str(path), "--out", str(out), "--skip-failed"]) != 0
    assert error.getvalue().startswith("layerdescent: error: 1 of 2 runs failed; ")
    assert "1 of them failed before and were left (--skip-failed): run without it to retry them" in error.getvalue()
    assert "diverges seed 0: DivergenceError: step 0" in error.getvalue()
    assert "diverges seed 0: failed before, left as it is (--skip-failed)" in printed.getvalue()
    assert files(failed) == before  # not retried: nothing in its directory was touched
    assert (out / "erm" / "seed-0" / "results.json").exists() and (out / "summary.md").exists()
    with pytest.raises(ld.LayerdescentError, match=r"^1 of 2 runs failed; .*run the same command again to retry them \(1 diverged"):
        run_bench(path, out)  # without the flag it is retried, and diverges again


def test_a_run_that_fails_in_its_final_evaluation_says_so_and_the_bench_resumes_it_at_the_evaluation(tmp_path, monkeypatch):
    from layerdescent.run.trainer import Trainer

    bench = {**RUN, "bench": {"seeds": [0], "variants": {"erm": {"solver": {"name": "erm"}}}}}
    path, out = config_file(tmp_path, bench, "bench.toml"), tmp_path / "out"

    def broken(*args, **kwargs):
        raise RuntimeError("the evaluation broke")

    monkeypatch.setattr(Trainer, "_evaluate", broken)
    with pytest.raises(ld.LayerdescentError, match="1 of 1 runs failed"):
        run_bench(path, out)
    steps = rundir.last_record(out / "erm" / "seed-0")["step"]
    assert status(path, out)[0] == f"erm seed 0: failed (in its final evaluation, after step {steps}: RuntimeError: the evaluation broke)"

    monkeypatch.undo()
    monkeypatch.setattr(Trainer, "step", lambda *args, **kwargs: pytest.fail("the resumed run trained again"))
    run_bench(path, out)  # the checkpoint holds the trained model: only the evaluation runs again
    assert status(path, out)[0] == "erm seed 0: done"
    assert not (out / "erm" / "seed-0" / layout.FAILURE).exists()
