"""One schema for a bench file: bench, bench --status, report --bench and plan read it alike; its reference page is generated from it."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tomli_w
from helpers import REPO, cli, write_gamma_runs

from layerdescent.analysis.endpoints import CHOICE_HELP, ENDPOINT_KEYS, JUDGING_KEYS, PRIMARY_HELP, PRIMARY_KEYS
from layerdescent.analysis.endpoints_file import parse_spec
from layerdescent.analysis.judging import FAMILY_ALPHA
from layerdescent.analysis.stats import paired_power, seeds_for_power
from layerdescent.analysis.tuning_search import SEARCH_HELP, SEARCH_KEYS
from layerdescent.bench.plan import BENCH_KEYS, RUN_HELP, plan
from layerdescent.bench.reference import plan_reference
from layerdescent.cli import main

CLAIMS_LIST = REPO / "benchmarks" / "claims.toml"  # the list of benches REPORT.md judges, not a bench file
BENCHES = sorted(set((REPO / "benchmarks").glob("*.toml")) - {CLAIMS_LIST})


@pytest.mark.parametrize("path", BENCHES, ids=[p.stem for p in BENCHES])
def test_every_committed_bench_file_passes_the_one_schema(path, tmp_path):
    # what `bench --status` reads, without the tasks' assets: every key, variant, gamma and domain its plan names
    runs = plan(path, tmp_path / "out", build_tasks=False)
    assert runs and parse_spec(__import__("tomllib").loads(path.read_text())["bench"], [r.variant for r in runs])


def test_the_claims_list_names_every_committed_bench_file():
    listed = {REPO / "benchmarks" / entry["file"] for entry in __import__("tomllib").loads(CLAIMS_LIST.read_text())["bench"]}
    assert set(BENCHES) - listed == set(), "add the bench to benchmarks/claims.toml, so REPORT.md and its summary are made from it"


def test_the_bench_file_reference_page_is_what_the_code_generates():
    assert (REPO / "docs" / "reference" / "plan.md").read_text() == plan_reference(), (
        "docs/reference/plan.md is stale: run `layerdescent plan --reference > docs/reference/plan.md`"
    )


def test_every_key_the_readers_accept_has_a_meaning_on_the_reference_page():
    assert BENCH_KEYS == set(RUN_HELP) | JUDGING_KEYS and SEARCH_KEYS == set(SEARCH_HELP)
    assert ENDPOINT_KEYS == set(__import__("layerdescent.analysis.endpoints", fromlist=["ENDPOINT_HELP"]).ENDPOINT_HELP)
    assert PRIMARY_KEYS == set(PRIMARY_HELP) and {"candidates", "otherwise"} == set(CHOICE_HELP)
    page = plan_reference()
    assert all(f"| `{key}` |" in page for key in BENCH_KEYS | ENDPOINT_KEYS | SEARCH_KEYS)


def bench_file(tmp_path, tiny, plan_table: dict, name: str = "bench.toml") -> str:
    table = {
        **tiny,
        "eval": {**tiny["eval"], "gammas": [0.0, 0.5]},
        "bench": {"seeds": [0, 1], "variants": {"erm": {"solver": {"name": "erm"}}, "primal-dual": {}}, "plan": plan_table},
    }
    path = tmp_path / name
    path.write_text(tomli_w.dumps(table))
    return str(path)


P1 = {"variant": "primal-dual", "metric": "mse", "higher_is_better": False, "gamma": 0.0, "against": "erm"}


def test_report_bench_refuses_what_bench_refuses_before_it_writes_anything(tmp_path, tiny):
    # `report --bench` accepted on = "mean(gamma)", wrote "not run" cells and overwrote the remembered judging keys
    runs = tmp_path / "runs"
    runs.mkdir()
    for plan_table, needle in (
        ({"P1": {**P1, "on": "mean(gamma)"}}, "bench.plan.P1.on: variant 'erm' is not evaluated on 'gamma'"),
        ({"P1": {**P1, "gamma": 3.0}}, "bench.plan.P1.gamma: variant 'erm' is not evaluated at γ 3"),
    ):
        path = bench_file(tmp_path, tiny, plan_table)
        status, lines = cli("report", str(runs), "--bench", path)
        assert status == 2 and len(lines) == 1 and needle in lines[0]
        status, lines = cli("bench", path, "--out", str(tmp_path / "out"), "--status")
        assert status == 2 and len(lines) == 1 and needle in lines[0]
    assert not list(runs.iterdir())


def test_a_margin_declared_after_the_first_run_is_flagged(tmp_path, tiny, capsys):
    out = str(tmp_path / "out")
    assert main(["bench", bench_file(tmp_path, tiny, {"P1": P1}), "--out", out]) == 0
    later = {"P1": P1, "parity": {**P1, "test": "non-inferiority", "margin": "5%"}}
    assert main(["report", out, "--bench", bench_file(tmp_path, tiny, later, "later.toml")]) == 0
    page = (tmp_path / "out" / "endpoints.md").read_text()
    assert "**Plan changed after the runs began: exploratory.**" in page
    assert "bench.plan.parity.margin" in page and "## Family primary: the claim (exploratory: the plan changed)" in page
    capsys.readouterr()


def test_the_plan_command_gives_each_endpoint_the_power_its_seeds_have_from_a_pilot(tmp_path, capsys):
    erm = [[0.5] * 4, [0.52] * 4, [0.51] * 4, [0.49] * 4]
    pd = [[0.48] * 4, [0.515] * 4, [0.50] * 4, [0.47] * 4]
    write_gamma_runs(tmp_path / "pilot", {"erm": erm, "primal-dual": pd})
    (tmp_path / "bench.toml").write_text(
        tomli_w.dumps(
            {
                "task": {"name": "lista"},
                "eval": {"gammas": [0.0, 0.5]},
                "bench": {
                    "seeds": [0, 1, 2, 3, 4, 5],
                    "variants": {"erm": {"solver": {"name": "erm"}}, "primal-dual": {}},
                    "plan": {"P1": {**P1, "gamma": 0.5, "effect": 0.01}, "P2": {**P1, "test": "non-inferiority", "margin": 0.02}},
                },
            }
        )
    )
    assert main(["plan", str(tmp_path / "bench.toml"), "--pilot", str(tmp_path / "pilot")]) == 0
    text = capsys.readouterr().out
    sd = float(np.std(np.subtract([0.5, 0.52, 0.51, 0.49], [0.48, 0.515, 0.50, 0.47]), ddof=1))
    alpha = FAMILY_ALPHA / 2
    p1 = next(line for line in text.splitlines() if line.strip().startswith("P1:"))
    p2 = next(line for line in text.splitlines() if line.strip().startswith("P2:"))
    assert f"6 seeds; power {100 * paired_power(0.01, sd, 6, alpha):.0f}%" in p1
    assert f"80% needs {seeds_for_power(0.01, sd, alpha)} seeds" in p1
    assert f"power {100 * paired_power(0.02, sd, 6, alpha, one_sided=True):.0f}%" in p2 and "non-inferiority within 0.02" in p2


def test_the_plan_commands_power_reads_what_the_endpoint_reads_a_mean_over_domains(tmp_path, capsys):
    # the pilot's power ignored `on`: an endpoint on mean(a, b) was given the test split's spread
    erm = [[0.5] * 4, [0.52] * 4, [0.51] * 4, [0.49] * 4]
    pd = [[0.48] * 4, [0.515] * 4, [0.50] * 4, [0.47] * 4]
    write_gamma_runs(tmp_path / "pilot", {"erm": erm, "primal-dual": pd})
    shift = {"erm": [0.0, 0.03, -0.02, 0.01], "primal-dual": [0.0, -0.01, 0.02, 0.0]}  # per seed, the domains' mean moves
    for path in (tmp_path / "pilot").glob("*/seed-*/results.json"):
        run = json.loads(path.read_text())
        moved = [{**g, "metrics": {"mse": g["metrics"]["mse"] + 2 * shift[run["label"]][run["seed"]]}} for g in run["gammas"]]
        run["domains"] = {"denser": moved, "noisier": run["gammas"]}  # their mean: the test's mse + shift
        path.write_text(json.dumps(run))
    endpoint = {**P1, "gamma": 0.5, "effect": 0.01, "on": "mean(denser, noisier)"}
    bench = {
        "task": {"name": "lista"},
        "eval": {"gammas": [0.0, 0.5], "domains": ["denser", "noisier"]},
        "bench": {
            "seeds": [0, 1, 2, 3, 4, 5],
            "variants": {"erm": {"solver": {"name": "erm"}}, "primal-dual": {}},
            "plan": {"P1": endpoint, "big": {**endpoint, "on": "test", "effect": 1.0}},
        },
    }
    (tmp_path / "bench.toml").write_text(tomli_w.dumps(bench))
    assert main(["plan", str(tmp_path / "bench.toml"), "--pilot", str(tmp_path / "pilot")]) == 0
    lines = capsys.readouterr().out.splitlines()
    mean_a_b = np.add([0.5, 0.52, 0.51, 0.49], shift["erm"]) - np.add([0.48, 0.515, 0.50, 0.47], shift["primal-dual"])
    sd, alpha = float(np.std(mean_a_b, ddof=1)), FAMILY_ALPHA / 2
    p1 = next(line for line in lines if line.strip().startswith("P1:"))
    assert f"pilot spread {sd:.3g}" in p1 and f"power {100 * paired_power(0.01, sd, 6, alpha):.0f}%" in p1
    # a large effect over a small spread: full power, where scipy's lower tail alone gives nan
    big = next(line for line in lines if line.strip().startswith("big:"))
    assert "power 100%" in big and "80% needs 2 seeds" in big


def test_the_paired_t_tests_power_is_finite_where_scipys_lower_tail_is_not():
    for ncp in np.linspace(0, 60, 121):
        power = paired_power(ncp * 0.01 / np.sqrt(10), 0.01, 10, 0.003125)
        assert 0.0 <= power <= 1.0
    assert paired_power(0.003, 0.0006, 10, 0.003125) > 0.999


def test_the_plan_command_prints_the_reference_and_refuses_a_file_beside_it(capsys):
    assert main(["plan", "--reference"]) == 0 and capsys.readouterr().out == plan_reference()
    status, lines = cli("plan", "x.toml", "--reference")
    assert status == 2 and lines == ["layerdescent: error: --reference prints the keys of every bench file; give it no FILE"]
