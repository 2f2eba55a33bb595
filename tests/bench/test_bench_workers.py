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
        deadline = time.time() + 20
        while time.time() < deadline and any(alive(pid) for pid in workers):
            time.sleep(0.1)
        assert not any(alive(pid) for pid in workers), "a worker outlived its bench"
        assert session_members(proc.pid) == [], "a process of the bench outlived it"
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
    assert ("erm", "trained") in told and any(v == "diverges" and s.startswith("failed: DivergenceError") for v, s in told)
    assert (out / "erm" / "seed-0" / "results.json").exists() and (out / "summary.md").exists()
