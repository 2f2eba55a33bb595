"""train.precision: bf16 autocast around the training forward pass agrees with fp32; fp32 runs record the config they always did."""

from __future__ import annotations

import copy

import pytest
import tomllib
import torch
from conftest import TINY
from helpers import TEXT, run_benchmark_script

import layerdescent as ld
from layerdescent.errors import ConfigError

# bf16 keeps 8 bits of mantissa: a tiny run's evaluation losses moved by at most 0.1% (lista) and
# 0.03% (text) and its multipliers by at most 0.003, so a tenfold margin states the agreement.
RTOL, ATOL = 1e-2, 1e-2
SETTINGS = {"lista": TINY, "text": TEXT}


def _run(tmp_path, base: dict, precision: str | None, device: str = "cpu") -> dict:
    table = copy.deepcopy(base)
    table["train"] = {**table["train"], "device": device, "threads": 1}
    if precision is not None:
        table["train"]["precision"] = precision
    return ld.train(ld.config_from_dict(table), tmp_path / f"{precision}-{device}")


def _agree(fp32: dict, bf16: dict) -> None:
    for a, b in zip(fp32["gammas"], bf16["gammas"]):
        torch.testing.assert_close(torch.tensor(b["layer_loss"]), torch.tensor(a["layer_loss"]), rtol=RTOL, atol=0)
    for name, table in fp32["constraints"].items():
        torch.testing.assert_close(torch.tensor(bf16["constraints"][name]["lambda"]), torch.tensor(table["lambda"]), rtol=RTOL, atol=ATOL)
    assert bf16["gammas"][0]["layer_loss"] != fp32["gammas"][0]["layer_loss"], "bf16 changed nothing: the forward pass was not autocast"


@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_bf16_training_agrees_with_fp32_within_the_stated_tolerance(tmp_path, setting):
    if setting == "text":
        pytest.importorskip("transformers")
    _agree(_run(tmp_path, SETTINGS[setting], "fp32"), _run(tmp_path, SETTINGS[setting], "bf16"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="bf16 on CUDA needs a GPU; this machine has none")
def test_bf16_training_on_cuda_agrees_with_fp32(tmp_path):
    _agree(_run(tmp_path, TINY, "fp32", "cuda"), _run(tmp_path, TINY, "bf16", "cuda"))


def test_an_fp32_run_records_the_config_it_recorded_before_precision_existed(tmp_path):
    _run(tmp_path, TINY, "fp32")
    _run(tmp_path, TINY, "bf16")
    assert "precision" not in tomllib.loads((tmp_path / "fp32-cpu" / "config.toml").read_text())["train"]
    assert tomllib.loads((tmp_path / "bf16-cpu" / "config.toml").read_text())["train"]["precision"] == "bf16"


def test_an_fp32_run_gives_the_numbers_of_a_run_that_does_not_name_precision(tmp_path):
    named, unnamed = _run(tmp_path, TINY, "fp32"), _run(tmp_path, TINY, None)
    assert named["gammas"] == unnamed["gammas"] and named["constraints"] == unnamed["constraints"]


def test_an_unknown_precision_is_refused_naming_the_choices():
    table = copy.deepcopy(TINY)
    table["train"]["precision"] = "fp16"
    with pytest.raises(ConfigError, match=r"train.precision = 'fp16' is not allowed.*'fp32' or 'bf16'"):
        ld.config_from_dict(table)


def test_the_cost_benchmark_times_each_solver_in_bf16_beside_fp32(tmp_path):
    out = tmp_path / "cost_precision.md"
    run_benchmark_script(
        "cost.py", "--task", "precision", "--setup", "lista small", "--rounds", "1", "--steps", "1", "--out", str(out)
    ).check_returncode()
    rows = {cells[2]: cells for cells in (line.split(" | ") for line in out.read_text().splitlines() if line.startswith("| lista small"))}
    assert list(rows) == ["erm, fp32", "erm, bf16", "primal-dual, fp32", "primal-dual, bf16"]
    assert rows["erm, fp32"][4] == "1.000"  # every ratio is to float32 erm
    assert all(float(cells[3]) > 0 for cells in rows.values())
