"""Data-parallel primal-dual under torchrun: 2 CPU processes with gloo on lista."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from conftest import lista_task

import layerdescent as ld
from layerdescent.run.checkpoint import load_checkpoint

pytestmark = pytest.mark.skipif(
    not torch.distributed.is_available() or not torch.distributed.is_gloo_available(), reason="torch.distributed with gloo is not available"
)

CONFIG = {
    "task": lista_task(train_size=500, test_size=100),
    "train": {"epochs": 2, "batch_size": 64, "lr": 0.01, "progress": False, "log_every": 3, "threads": 1},
    "solver": {"name": "primal-dual", "dual_lr": 1.0},
    "constraints": [{"kind": "descent", "alpha": 0.05, "reference": "anchored"}],
    "eval": {"gammas": [0.0, 0.5], "batch_size": 32},
}

# Trains CONFIG on every rank, records lambda after every step, and can SIGKILL rank 0 at a step.
RUNNER = textwrap.dedent(
    """
    import json, os, signal, sys
    import layerdescent as ld
    from layerdescent.run.trainer import Trainer

    config, out, kill_at, resume = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4] == "resume"
    rank = int(os.environ.get("RANK", "0"))
    history = []
    original = Trainer.step

    def step(self, session, group, n, full=True, **kwargs):
        result = original(self, session, group, n, full, **kwargs)
        history.append(session.problem.multipliers()["descent"].tolist())
        if rank == 0 and n + 1 == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return result

    Trainer.step = step
    ld.train(ld.config_from_dict(config), out, resume=resume)
    with open(os.path.join(out, f"lambda-rank{rank}.json"), "w") as handle:
        json.dump(history, handle)
    """
)


def launch(tmp_path, config, out, nproc, kill_at=0, resume=False):
    script = tmp_path / "runner.py"
    script.write_text(RUNNER)
    args = [str(script), json.dumps(config), str(out), str(kill_at), "resume" if resume else "fresh"]
    if nproc > 1:
        args = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", *args]
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same config (global batch 64): on 2 ranks of 32 samples each, and in 1 process."""
    tmp = tmp_path_factory.mktemp("dist")
    two = launch(tmp, CONFIG, tmp / "two", 2)
    assert two.returncode == 0, two.stderr[-3000:]
    one = launch(tmp, CONFIG, tmp / "one", 1)
    assert one.returncode == 0, one.stderr[-3000:]
    return tmp


def params(run_dir):
    from safetensors.torch import load_file

    return load_file(run_dir / "model.safetensors")  # what a finished run keeps


def test_multipliers_are_identical_on_every_rank_at_every_step(runs):
    rank0 = json.loads((runs / "two" / "lambda-rank0.json").read_text())
    rank1 = json.loads((runs / "two" / "lambda-rank1.json").read_text())
    assert len(rank0) == len(rank1) == 2 * 8  # ceil(500 / 64) global steps per epoch
    assert rank0 == rank1
    assert any(max(values) > 0 for values in rank0), "the constraints never became active"


def test_two_ranks_of_half_a_batch_follow_the_trajectory_of_one_process(runs):
    one, two = params(runs / "one"), params(runs / "two")
    for key in one:
        torch.testing.assert_close(two[key], one[key], rtol=1e-4, atol=1e-6)
    lam_one = json.loads((runs / "one" / "lambda-rank0.json").read_text())
    lam_two = json.loads((runs / "two" / "lambda-rank0.json").read_text())
    torch.testing.assert_close(torch.tensor(lam_two), torch.tensor(lam_one), rtol=1e-4, atol=1e-6)


def test_sharded_evaluation_reduces_to_the_single_process_numbers(runs):
    one = json.loads((runs / "one" / "results.json").read_text())
    two = json.loads((runs / "two" / "results.json").read_text())
    for a, b in zip(one["gammas"], two["gammas"]):
        assert a["samples"] == b["samples"] == 100
        assert b["layer_loss"] == pytest.approx(a["layer_loss"], rel=1e-4)
        assert b["metrics"] == pytest.approx(a["metrics"], rel=1e-4)


def test_only_rank_zero_writes_the_run_directory(runs):
    names = sorted(p.name for p in (runs / "two").iterdir())
    assert names == [
        ".layerdescent.lock",
        "config.toml",
        "lambda-rank0.json",
        "lambda-rank1.json",
        "metrics.jsonl",
        "model.safetensors",
        "results.json",
    ]
    lines = (runs / "two" / "metrics.jsonl").read_text().splitlines()
    steps = [json.loads(line)["step"] for line in lines if json.loads(line)["event"] == "train"]
    assert steps == sorted(steps) and len(steps) == len(set(steps)), "each record written once"


def test_a_killed_distributed_run_resumes_in_a_single_process(tmp_path, runs):
    out = tmp_path / "run"
    config = json.loads(json.dumps(CONFIG))
    config["train"]["checkpoint_every"] = 4
    killed = launch(tmp_path, config, out, 2, kill_at=11)
    assert killed.returncode != 0
    assert load_checkpoint(out / "checkpoint.pt", "lista")["position"]["step"] == 8
    resumed = launch(tmp_path, config, out, 1, resume=True)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    whole = params(runs / "two")
    for key, value in params(out).items():
        torch.testing.assert_close(value, whole[key], rtol=1e-4, atol=1e-6)


# A plain DDP-style loop: each rank observes its own layer means; LayerwiseUpdate averages them before the dual step.
UPDATE_RUNNER = textwrap.dedent(
    """
    import json, os, sys
    import torch
    import torch.distributed as dist
    import layerdescent as ld

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    param = torch.nn.Parameter(torch.zeros(1))
    update = ld.LayerwiseUpdate([ld.Descent(alpha=0.0)], num_layers=1, optimizer=torch.optim.SGD([param], lr=0.1), dual_lr=1.0)
    update.zero_grad()
    update.forward(torch.tensor([1.0, 1.0 + 2.0 * rank]))  # violation 0 on rank 0, 2 on rank 1: mean 1
    update.step()
    with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as handle:
        json.dump(update.multipliers()["descent"].tolist(), handle)
    dist.barrier()  # both ranks have written their answer
    # Leave without gloo's teardown: under load a rank whose peer has already exited can abort in
    # its C++ destructors ("terminate called without an active exception") after the work is done.
    os._exit(0)
    """
)


def test_the_update_object_averages_layer_means_over_ranks_before_the_dual_step(tmp_path):
    script = tmp_path / "update.py"
    script.write_text(UPDATE_RUNNER)
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script), str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)] == [[1.0], [1.0]]


def test_a_per_sample_table_ends_the_same_on_two_ranks_as_in_one_process(tmp_path):
    # no perturbation: ranks draw their own noise, so only a clean run can follow one process exactly
    config = json.loads(json.dumps(CONFIG))
    config["train"]["epochs"] = 1
    config["constraints"] = [{"kind": "descent", "alpha": 0.05, "reference": "anchored", "per_sample": True, "resilience": 5.0}]
    two = launch(tmp_path, config, tmp_path / "two", 2)
    assert two.returncode == 0, two.stderr[-3000:]
    one = launch(tmp_path, config, tmp_path / "one", 1)
    assert one.returncode == 0, one.stderr[-3000:]
    rank0, rank1, single = (
        json.loads((tmp_path / run / f"lambda-rank{r}.json").read_text()) for run, r in (("two", 0), ("two", 1), ("one", 0))
    )
    assert rank0 == rank1  # each rank updated its own rows; the summed tables leave every rank the same
    table = torch.tensor(rank0[-1])
    assert table.shape == (500, 5) and int((table > 0).any(dim=1).sum()) > 100
    torch.testing.assert_close(table, torch.tensor(single[-1]), rtol=1e-4, atol=1e-6)


def test_a_per_level_per_sample_table_is_identical_on_every_rank(tmp_path):
    config = json.loads(json.dumps(CONFIG))
    config["train"].update(train_gamma=[0.0, 0.5, 1.0], epochs=1)
    config["constraints"] = [{"kind": "descent", "alpha": 0.05, "per_sample": True, "levels": "band"}]
    two = launch(tmp_path, config, tmp_path / "two", 2)
    assert two.returncode == 0, two.stderr[-3000:]
    rank0, rank1 = (json.loads((tmp_path / "two" / f"lambda-rank{r}.json").read_text()) for r in (0, 1))
    assert rank0 == rank1 and torch.tensor(rank0[-1]).shape == (500, 3 * 4)


def test_the_solver_reduces_over_ranks_through_the_worlds_one_all_reduce(monkeypatch):
    from layerdescent.distributed import World

    assert World.current() == World()  # no process group: one rank of one
    sums = []

    @dataclasses.dataclass(frozen=True)
    class TwoRanks(World):  # both ranks saw the same rows: a sum is twice one rank's
        def sum(self, tensor):
            sums.append(tensor.numel())
            return tensor * 2

    # as in a process group of two (no group is started: the World's sum stands for its all-reduce)
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(World, "current", classmethod(lambda cls: TwoRanks(0, 2)))
    head = torch.nn.Linear(1, 1)
    update = ld.LayerwiseUpdate([ld.Descent()], num_layers=2, optimizer=torch.optim.SGD(head.parameters(), lr=0.1))
    losses = torch.cat([head(torch.ones(4, 1)).abs() * k for k in (3.0, 2.0, 1.0)], dim=1)
    update.zero_grad()
    update.backward(losses)
    seen = update.step()
    assert sums == [4, 3]  # the anchors' weighted means, then the step's means: each one all-reduce of the World's
    torch.testing.assert_close(seen.means, losses.detach().mean(dim=0))
