"""Shared fixtures: tiny, fast configs on the bundled lista task, one torch thread."""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

torch.set_num_threads(1)


def lista_task(
    layers: int = 4, code_dim: int = 16, measure_dim: int = 12, train_size: int = 512, validation_size: int = 64, test_size: int = 128
) -> dict:
    """The bundled lista task's table at a test's sizes (two nonzeros per code)."""
    return {
        "name": "lista",
        "layers": layers,
        "code_dim": code_dim,
        "measure_dim": measure_dim,
        "sparsity": 2,
        "train_size": train_size,
        "validation_size": validation_size,
        "test_size": test_size,
    }


# the installed `layerdescent` command, or the module where it is not on PATH (a bare checkout)
LAYERDESCENT = [shutil.which("layerdescent") or sys.executable, *([] if shutil.which("layerdescent") else ["-m", "layerdescent.cli"])]
# the smallest lista that still trains: 3 layers, 64 training rows
SMALL_LISTA_TASK = lista_task(layers=3, code_dim=8, measure_dim=6, train_size=64, validation_size=16, test_size=16)

TINY = {
    "task": lista_task(),
    "train": {"epochs": 2, "batch_size": 64, "lr": 0.01, "progress": False, "log_every": 4},
    "solver": {"name": "primal-dual", "dual_lr": 1.0},
    "constraints": [{"kind": "descent", "alpha": 0.05}],
    "eval": {"gammas": [0.0, 0.5]},
}


@pytest.fixture
def tiny() -> dict:
    """A config table that trains lista in about a second."""
    return copy.deepcopy(TINY)


# The end of every script run_script starts under torchrun: the processes leave together, since a rank
# whose peer has gone can abort in gloo's teardown.
LEAVE_TOGETHER = """
if torch.distributed.is_initialized():
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
"""


def run_script(script: str, out, nproc: int, *argv: str, torchrun: bool = False) -> list[dict]:
    """Run ``script`` with ``out`` and ``argv`` in ``nproc`` processes (under torchrun when more than one, or asked); each rank's rank{R}.json."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "runner.py").write_text(script)
    args = [str(out / "runner.py"), str(out), *argv]
    if nproc > 1 or torchrun:
        args = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", *args]
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(nproc)]
