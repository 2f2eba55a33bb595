"""A run killed at any moment resumes to exactly the result of an uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from conftest import lista_task
from helpers import RUNNER

import layerdescent as ld
from layerdescent.run.checkpoint import VERSION, load_checkpoint, previous_path, save_checkpoint

CONFIG = {
    "task": lista_task(test_size=64),
    "train": {
        "epochs": 3,
        "batch_size": 64,
        "lr": 0.01,
        "progress": False,
        "log_every": 3,
        "checkpoint_every": 3,
        "train_gamma": 0.1,
        "threads": 1,
        "keep_checkpoint": True,
    },
    "solver": {"name": "primal-dual", "dual_lr": 1.0},
    "constraints": [{"kind": "descent", "alpha": 0.05, "reference": "anchored"}],
    "eval": {"gammas": [0.0, 0.5]},
}


def run(tmp_path, out, mode="none", n=0, wait=True):
    script = tmp_path / "runner.py"
    script.write_text(RUNNER)
    args = [sys.executable, str(script), json.dumps(CONFIG), str(out), mode, str(n)]
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    if not wait:
        return subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return subprocess.run(args, env=env, capture_output=True, text=True)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("whole")
    proc = run(tmp_path, tmp_path / "run")
    assert proc.returncode == 0, proc.stderr
    return tmp_path / "run"


def assert_same_run(a, b):
    left = torch.load(a / "checkpoint.pt", weights_only=False)
    right = torch.load(b / "checkpoint.pt", weights_only=False)
    for key, value in left["model"].items():
        assert torch.equal(value, right["model"][key]), key
    assert torch.equal(
        left["problem"]["cmp"]["multipliers"]["descent"]["weight"], right["problem"]["cmp"]["multipliers"]["descent"]["weight"]
    )
    assert json.loads((a / "results.json").read_text())["gammas"] == json.loads((b / "results.json").read_text())["gammas"]
    assert (a / "metrics.jsonl").read_text() == (b / "metrics.jsonl").read_text()


@pytest.mark.parametrize(
    "mode, n",
    [("step", 2), ("step", 11), ("step", 17), ("checkpoint-write", 1), ("checkpoint-write", 4)],
    ids=["before-first-checkpoint", "mid-epoch", "after-an-epoch", "during-first-checkpoint-write", "during-a-later-checkpoint-write"],
)
def test_sigkill_then_resume_matches_the_uninterrupted_run_bit_for_bit(tmp_path, uninterrupted, mode, n):
    out = tmp_path / "run"
    killed = run(tmp_path, out, mode, n)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert not (out / "results.json").exists()
    resumed = run(tmp_path, out, "resume")
    assert resumed.returncode == 0, resumed.stderr
    assert_same_run(uninterrupted, out)


def test_sigkill_from_outside_at_an_arbitrary_moment_then_resume_matches(tmp_path, uninterrupted):
    out = tmp_path / "run"
    proc = run(tmp_path, out, wait=False)
    deadline = time.time() + 60
    while not (out / "checkpoint.pt").exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.01)
    time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    resumed = run(tmp_path, out, "resume")
    assert resumed.returncode == 0, resumed.stderr
    assert_same_run(uninterrupted, out)


def test_a_half_written_checkpoint_never_replaces_the_good_one(tmp_path, uninterrupted):
    out = tmp_path / "run"
    killed = run(tmp_path, out, "checkpoint-write", 2)
    assert killed.returncode == -signal.SIGKILL
    payload = load_checkpoint(out / "checkpoint.pt", "lista")  # the first one, whole
    assert payload["position"]["step"] == 3


def test_truncated_checkpoint_is_one_error_naming_the_file_and_the_previous_one_stays(tmp_path, tiny):
    config = ld.config_from_dict({**tiny, "train": {**tiny["train"], "epochs": 2, "keep_checkpoint": True}})
    ld.train(config, tmp_path / "run")
    path = tmp_path / "run" / "checkpoint.pt"
    previous = previous_path(path)
    good = previous.read_bytes()
    path.write_bytes(path.read_bytes()[:100])
    (tmp_path / "run" / "results.json").unlink()
    with pytest.raises(ld.CheckpointError, match=rf"checkpoint {path} cannot be read .* move {previous}"):
        ld.train(config, tmp_path / "run", resume=True)
    assert previous.read_bytes() == good
    os.replace(previous, path)  # what the message says to do
    results = ld.train(config, tmp_path / "run", resume=True)
    assert results["train"]["epochs"] == 2


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_an_interrupt_while_a_checkpoint_is_written_stops_after_it_is_whole_not_as_a_failed_write(tmp_path, monkeypatch, sig):
    real_save = torch.save

    class Interrupted:  # the file torch.save writes to, interrupted inside its zip writer (it made such a run "failed")
        def __init__(self, handle):
            self.handle, self.writes = handle, 0

        def write(self, data):
            self.writes += 1
            if self.writes == 2:
                os.kill(os.getpid(), sig)
            return self.handle.write(data)

        def __getattr__(self, name):
            return getattr(self.handle, name)

    def save(obj, handle):
        real_save(obj, Interrupted(handle))

    def terminated(signum, frame):
        raise KeyboardInterrupt("SIGTERM")  # as the CLI turns SIGTERM

    # the CLI's handlers (a background job starts with SIGINT ignored: the CLI installs Python's own)
    previous = {
        signal.SIGINT: signal.signal(signal.SIGINT, signal.default_int_handler),
        signal.SIGTERM: signal.signal(signal.SIGTERM, terminated),
    }
    try:
        path = tmp_path / "checkpoint.pt"
        save_checkpoint(path, {"task": "lista", "step": 1})
        monkeypatch.setattr(torch, "save", save)
        with pytest.raises(KeyboardInterrupt):
            save_checkpoint(path, {"task": "lista", "step": 2})
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler and signal.getsignal(signal.SIGTERM) is terminated
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    assert load_checkpoint(path, "lista")["step"] == 2  # written whole before the interrupt took effect
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.prev.pt", "checkpoint.pt"]


@pytest.mark.parametrize(
    "change, message",
    [
        ({"task": "other"}, "is for task 'other', not 'lista'"),
        ({"version": 99}, "has format version 99"),
        ({"format": "zip"}, "is not a layerdescent checkpoint"),
    ],
    ids=["wrong-task", "wrong-version", "not-a-checkpoint"],
)
def test_checkpoint_of_the_wrong_kind_is_refused_by_name(tmp_path, change, message):
    path = tmp_path / "checkpoint.pt"
    save_checkpoint(path, {"task": "lista"})
    payload = torch.load(path, weights_only=True)
    torch.save({**payload, **change}, path)
    with pytest.raises(ld.CheckpointError, match=message):
        load_checkpoint(path, "lista")


def test_checkpoint_is_loaded_as_data_not_code(tmp_path):
    class Payload:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    path = tmp_path / "checkpoint.pt"
    torch.save({"format": "layerdescent-checkpoint", "version": VERSION, "task": "lista", "evil": Payload()}, path)
    with pytest.raises(ld.CheckpointError, match="cannot be read"):
        load_checkpoint(path, "lista")
