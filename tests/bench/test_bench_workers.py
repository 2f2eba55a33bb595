"""``bench --workers N``: a killed bench leaves no worker training on, and a failed run stops no other (one worker or many)."""

from __future__ import annotations

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
from layerdescent.run import layout

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def session_members(sid: int) -> list[int]:
    """Every live process of session ``sid``."""
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (FileNotFoundError, ProcessLookupError):
                continue
            if int(fields[3]) == sid and alive(int(entry.name)):
                members.append(int(entry.name))
    return members


def test_killing_a_bench_with_two_workers_kills_its_workers(tmp_path):
    long = with_(with_(RUN, "train.epochs", 10_000), "task.train_size", 512)
    bench = {**long, "bench": {"seeds": [0], "variants": {"erm": {"solver": {"name": "erm"}}, "primal-dual": {}}}}
    path, out = config_file(tmp_path, bench, "bench.toml"), tmp_path / "out"
    proc = subprocess.Popen(
        [*LAYERDESCENT, "bench", str(path), "--out", str(out), "--workers", "2"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    locks = [out / variant / "seed-0" / layout.LOCK for variant in ("erm", "primal-dual")]
    try:
        deadline, workers = time.time() + 240, set()
        while time.time() < deadline and len(workers) < 2 and proc.poll() is None:
            workers = {int(text) for lock in locks if lock.exists() and (text := lock.read_text().strip())}
            time.sleep(0.2)
        assert len(workers) == 2 and proc.pid not in workers, "both workers should be training, each holding its run's lock"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        deadline = time.time() + 2  # the workers notice within 2 s
        while time.time() < deadline and any(alive(pid) for pid in workers):
            time.sleep(0.05)
        assert not any(alive(pid) for pid in workers), "a worker outlived its bench by 2 s"
        assert session_members(proc.pid) == [], "a process of the bench outlived it"
    finally:
        for pid in session_members(proc.pid):
            os.kill(pid, signal.SIGKILL)  # only the processes this test started
        if proc.poll() is None:
            proc.kill()


def _two_workers_training(tmp_path, *argv: str) -> tuple[subprocess.Popen, set[int], Path]:
    """``layerdescent ARGV`` started in a session of its own, once both of its workers train (each holds its run's lock)."""
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [*LAYERDESCENT, *argv, "--out", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    deadline, workers = time.time() + 240, set()
    while time.time() < deadline and len(workers) < 2 and proc.poll() is None:
        locks = list(out.glob(f"*/seed-*/{layout.LOCK}"))
        workers = {int(text) for lock in locks if lock.exists() and (text := lock.read_text().strip())}
        time.sleep(0.2)
    assert len(workers) == 2 and proc.pid not in workers, "both workers should be training, each holding its run's lock"
    return proc, workers, out


@pytest.mark.parametrize(
    "command, sig, status",
    [("bench", signal.SIGINT, 130), ("bench", signal.SIGTERM, 143), ("demo", signal.SIGINT, 130)],
    ids=["bench-SIGINT", "bench-SIGTERM", "demo-SIGINT"],
)
def test_a_signal_to_the_main_process_alone_stops_every_worker_within_seconds_and_leaves_the_runs_resumable(tmp_path, command, sig, status):
    if command == "bench":
        long = with_(with_(with_(RUN, "train.epochs", 10_000), "task.train_size", 512), "train.checkpoint_every", 5)
        bench = {**long, "bench": {"seeds": [0], "variants": {"erm": {"solver": {"name": "erm"}}, "primal-dual": {}}}}
        argv = ("bench", str(config_file(tmp_path, bench, "bench.toml")), "--workers", "2")
    else:
        argv = ("demo", "--task", "lista", "--workers", "2", "--set", "train.checkpoint_every=5")
    proc, workers, out = _two_workers_training(tmp_path, *argv)
    try:
        deadline = time.time() + 120  # a few steps, so each run has a checkpoint to resume from
        while time.time() < deadline and len(list(out.glob("*/seed-*/checkpoint.pt"))) < 2:
            time.sleep(0.2)
        proc.send_signal(sig)  # the main process alone, as `kill` sends it
        sent = time.time()
        _, err = proc.communicate(timeout=120)
        assert time.time() - sent < 15, f"stopping took {time.time() - sent:.0f} s"  # each worker stops at its run's next step
        assert proc.returncode == status, err
        assert "layerdescent: interrupted; the same command again continues from the last checkpoint" in err and "Traceback" not in err, err
        assert not any(alive(pid) for pid in workers), "a worker trained on after its parent was interrupted"
        assert not list(out.glob(f"*/seed-*/{layout.FAILURE}"))  # interrupted, not failed: the same command resumes them
        assert len(list(out.glob("*/seed-*/checkpoint.pt"))) >= 2  # the runs that were training resume from their checkpoints
    finally:
        for pid in session_members(proc.pid):
            os.kill(pid, signal.SIGKILL)  # only the processes this test started
        if proc.poll() is None:
            proc.kill()


@pytest.mark.parametrize("workers", [1, 2])
def test_a_failed_run_is_reported_as_it_ends_and_the_others_finish_with_a_summary(tmp_path, workers):
    # primal-dual's multipliers pass a limit of 1e-9 on the first step where a constraint binds (alpha 0.9);
    # it is planned first, so with one worker the run after it must still train
    bench = {
        **RUN,
        "bench": {
            "seeds": [0],
            "variants": {
                "diverges": {"solver": {"max_multiplier": 1e-9}, "constraints": [{"kind": "descent", "alpha": 0.9}]},
                "erm": {"solver": {"name": "erm"}},
            },
        },
    }
    path, out, told = config_file(tmp_path, bench, "bench.toml"), tmp_path / "out", []
    with pytest.raises(ld.LayerdescentError) as failed:
        run_bench(path, out, workers=workers, on_run=lambda run, status: told.append((run.variant, status)))
    assert str(failed.value).startswith(
        "1 of 2 runs failed; "
    ) and "diverges seed 0: DivergenceError: step 0: multiplier of constraint 'descent' exploded" in str(failed.value)
    assert "(1 diverged: retried, each diverges again where it did; change the setting its error names" in str(failed.value)
    assert ("erm", "trained") in told and any(
        v == "diverges" and s == "failed (DivergenceError; the error and its log close the bench's output)" for v, s in told
    )
    assert (out / "erm" / "seed-0" / "results.json").exists() and (out / "summary.md").exists()


def test_ctrl_c_while_a_worker_waits_for_work_prints_one_line_and_no_worker_traceback(tmp_path):
    long = with_(with_(with_(RUN, "train.epochs", 10_000), "task.train_size", 512), "train.checkpoint_every", 5)
    bench = {**long, "bench": {"seeds": [0], "variants": {"erm": {"solver": {"name": "erm"}}}}}  # one run: the second worker idles
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [*LAYERDESCENT, "bench", str(config_file(tmp_path, bench, "bench.toml")), "--workers", "2", "--out", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.time() + 240
        while time.time() < deadline and not (out / "erm" / "seed-0" / "checkpoint.pt").exists() and proc.poll() is None:
            time.sleep(0.2)
        workers = [pid for pid in session_members(proc.pid) if pid != proc.pid]
        assert len(workers) >= 2, "both workers should have started, one training and one waiting"
        os.killpg(proc.pid, signal.SIGINT)  # as Ctrl-C sends it: to every process of the terminal's group
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 130, err
        assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
        assert "layerdescent: interrupted; the same command again continues from the last checkpoint" in err, err
        assert not any(alive(pid) for pid in workers)
    finally:
        for pid in session_members(proc.pid):
            os.kill(pid, signal.SIGKILL)  # only the processes this test started
        if proc.poll() is None:
            proc.kill()
