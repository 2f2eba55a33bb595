"""Judging a bench: named baselines, pre-registered primary endpoints with Holm's adjustment, tuning budgets, provenance, compare."""

from __future__ import annotations

import json
import subprocess

import pytest
from helpers import AT_GAMMA_1, REPO, fake_results, three_solvers, write_run

from layerdescent.analysis.endpoints import BenchSpec, Primary
from layerdescent.analysis.endpoints_file import parse_spec
from layerdescent.analysis.formatting import format_difference, format_stat
from layerdescent.analysis.groups import ablated_keys, ablations
from layerdescent.analysis.judging import judge_cells
from layerdescent.analysis.report import collect, summarize, write_report
from layerdescent.analysis.stats import holm, paired_difference
from layerdescent.cli import main
from layerdescent.errors import ConfigError


def test_holm_matches_the_worked_example():
    # Wikipedia, "Holm–Bonferroni method", example: four hypotheses at alpha 0.05; H4 and H1 are rejected
    adjusted = holm([0.01, 0.04, 0.03, 0.005])
    assert adjusted == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert [p <= 0.05 for p in adjusted] == [True, False, False, True]


def test_holm_keeps_a_test_without_p_in_the_family_size():
    assert holm([0.01, None]) == [pytest.approx(0.02), None]


def test_a_bench_without_a_primary_table_is_labelled_exploratory(tmp_path):
    three_solvers(tmp_path / "results" / "lista")
    summary = write_report(tmp_path / "results" / "lista").read_text()
    assert (
        "None pre-registered (no `[bench.primary]` in the bench file" in summary
        and "every verdict on these runs is exploratory." in summary
    )


def test_the_primary_family_leads_the_summary_with_holm_adjusted_p_values(tmp_path):
    bench = three_solvers(tmp_path)
    spec = BenchSpec(("erm", "penalty"), Primary("mse", False, (0.0, 1.0), ("primal-dual",)))
    text = write_report(bench, spec=spec).read_text()
    assert text.index("## Primary endpoints (pre-registered)") < text.index("## Metric at each gamma")
    assert "a family of 2" in text and "at the level Holm's step-down tested the cell at" in text
    cells = judge_cells(collect(bench), spec, ("primal-dual",), "mse", False, (0.0, 1.0), ("test",))
    assert [c["p_holm"] for c in cells] == holm([c["difference"]["p"] for c in cells])
    assert cells[1]["baseline"] == "penalty"  # the lower mse at gamma 1 (at gamma 0 all tie)
    assert all(c["verdict"] == "no difference" for c in cells)


def test_a_primary_cell_of_one_seed_is_undecided_not_no_difference(tmp_path):
    for solver, values in AT_GAMMA_1.items():  # seed 0 alone: primal-dual 0.301 against erm 0.50, penalty 0.300
        write_run(tmp_path, solver, solver, 0, 0.1, values[0])
    spec = BenchSpec(("erm", "penalty"), Primary("mse", False, (1.0,), ("primal-dual",)))
    (cell,) = judge_cells(collect(tmp_path), spec, ("primal-dual",), "mse", False, (1.0,), ("test",))
    assert cell["baseline"] == "penalty" and cell["verdict"] == "undecided: one seed" and cell["p_holm"] is None
    text = write_report(tmp_path, spec=spec).read_text()
    assert "| undecided: one seed |" in text and "One seed gives no test" in text


def test_one_seed_values_show_four_significant_digits_trailing_zeros_kept():
    assert [format_stat(x) for x in (0.825, 0.8325, 12.0)] == ["0.8250", "0.8325", "12.00"]
    assert format_difference(paired_difference([0.5], [0.5])) == "+0.00"


def test_better_must_hold_against_every_baseline(tmp_path):
    bench = three_solvers(tmp_path)
    results = collect(bench)
    against_erm = judge_cells(results, BenchSpec(("erm",)), ("primal-dual",), "mse", False, (1.0,), ("test",))
    both = judge_cells(results, BenchSpec(("erm", "penalty")), ("primal-dual",), "mse", False, (1.0,), ("test",))
    assert against_erm[0]["verdict"] == "better" and against_erm[0]["baseline"] == "erm"
    assert both[0]["verdict"] == "no difference"


def test_a_pair_made_by_two_code_versions_is_flagged(tmp_path, capsys):
    for seed in (0, 1):
        write_run(tmp_path, "erm", "erm", seed, 1.0 + seed, 2.0 + seed, code="aaaaaaa1")
        write_run(tmp_path, "primal-dual", "primal-dual", seed, 0.5, 1.5 + 0.1 * seed, code="bbbbbbb2")
    text = write_report(tmp_path).read_text()
    assert "| primal-dual − erm ‡ |" in text
    assert "## Provenance" in text and "| aaaaaaa | erm |" in text and "| bbbbbbb | primal-dual |" in text
    assert main(["compare", str(tmp_path), "primal-dual", "erm"]) == 0
    assert "**primal-dual and erm were made by different code**" in capsys.readouterr().out


def test_runs_of_one_commit_are_not_flagged(tmp_path):
    for seed in (0, 1):
        write_run(tmp_path, "erm", "erm", seed, 1.0 + seed, 2.0 + seed, code="aaaaaaa1")
        write_run(tmp_path, "primal-dual", "primal-dual", seed, 0.5, 1.5 + 0.1 * seed, code="aaaaaaa1")
    text = write_report(tmp_path).read_text()
    assert "| primal-dual − erm |" in text and "## Provenance" not in text


@pytest.mark.parametrize("diffs, flagged", [(("d1", "d1"), False), (("d1", "d2"), True), ((None, None), True)])
def test_runs_of_one_dirty_tree_are_one_code_version_only_when_their_change_is(diffs, flagged):
    from layerdescent.run.provenance import differ

    made = [{"version": "0.1.0", "commit": "c0ffee", "dirty": True, "diff": d, "fingerprint": "f"} for d in diffs]
    assert differ(made) is flagged


def test_a_trained_run_records_the_code_that_made_it(tmp_path, tiny):
    import layerdescent as ld

    results = ld.train(ld.config_from_dict(tiny), tmp_path / "run")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True)
    assert results["code"]["version"] == ld.__version__
    if head.returncode == 0:  # a checkout: its commit, and a bool for the tree's state
        assert results["code"]["commit"] == head.stdout.strip() and isinstance(results["code"]["dirty"], bool)
    assert json.loads((tmp_path / "run" / "results.json").read_text())["code"] == results["code"]


def test_a_trained_run_records_the_machine_whose_floats_it_holds(tmp_path, tiny):
    import torch

    import layerdescent as ld

    results = ld.train(ld.config_from_dict(tiny), tmp_path / "run")
    recorded = json.loads((tmp_path / "run" / "results.json").read_text())["machine"]
    assert recorded == results["machine"] and recorded["torch"] == torch.__version__
    assert recorded["capability"] == torch.backends.cpu.get_cpu_capability() and recorded["cpu"]


def test_compare_remakes_the_committed_readouts_byte_for_byte(tmp_path, capsys):
    # the command readouts.md names, run again into another file: everything but that --out is the same
    committed = REPO / "benchmarks/results/llm/readouts.md"
    out = tmp_path / "readouts.md"
    assert main(["compare", "benchmarks/results/llm", "primal-dual", "primal-dual,lens_vocab=all", "--out", str(out)]) == 0
    capsys.readouterr()
    assert out.read_text() == committed.read_text().replace("--out benchmarks/results/llm/readouts.md", f"--out {out}")


@pytest.mark.parametrize(
    "bench, message",
    [
        ('baselines = ["ermm"]', "bench.baselines: 'ermm' is no registered solver"),
        ('baselines = ["primal-dual"]', "enforces the constraints"),
        ('[bench.primary]\nmetric = "mse"\nhigher_is_better = false\ngammas = [1.0]', "bench.primary lacks 'variants'"),
        (
            '[bench.primary]\nmetric = "mse"\nhigher_is_better = false\ngammas = [1.0]\nvariants = ["pd"]\nsplit = ["test"]',
            "unknown key bench.primary.split",
        ),
        (
            '[bench.primary]\nmetric = "mse"\nhigher_is_better = "no"\ngammas = [1.0]\nvariants = ["pd"]',
            "higher_is_better must be true or false",
        ),
        ('[bench.tuning]\npd = "lots"', "bench.tuning must map variant labels"),
    ],
)
def test_a_bad_judging_key_is_one_line_and_exit_2(tmp_path, capsys, bench, message):
    three_solvers(tmp_path / "runs")
    (tmp_path / "bench.toml").write_text(f"[bench]\n{bench}\n")
    assert main(["report", str(tmp_path / "runs"), "--bench", str(tmp_path / "bench.toml")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_a_primary_variant_the_bench_does_not_have_is_refused():
    table = {"primary": {"metric": "mse", "higher_is_better": False, "gammas": [1.0], "variants": ["primal-dul"]}}
    with pytest.raises(ConfigError, match="bench.primary: no variant is labelled 'primal-dul'"):
        parse_spec(table, ["erm", "primal-dual"])


def test_report_bench_reads_the_judging_keys_of_a_bench_file(tmp_path, capsys):
    three_solvers(tmp_path / "runs")
    (tmp_path / "bench.toml").write_text(
        '[bench]\nbaselines = ["erm", "penalty"]\n[bench.primary]\nmetric = "mse"\nhigher_is_better = false\n'
        'gammas = [1.0]\nvariants = ["primal-dual"]\n[bench.tuning]\nprimal-dual = 4\n'
    )
    assert main(["report", str(tmp_path / "runs"), "--bench", str(tmp_path / "bench.toml")]) == 0
    text = (tmp_path / "runs" / "summary.md").read_text()
    assert "| primal-dual | test | 1 | penalty |" in text
    assert "penalty untuned" in text  # primal-dual had 4 tuning runs, penalty (which has layer weights to tune) none
    assert "| primal-dual | 4 |" in text and "| penalty | 0 |" in text


def test_a_bench_names_its_baselines_and_every_constrained_variant_is_paired_with_each(tmp_path):
    three_solvers(tmp_path)
    text = write_report(tmp_path, spec=BenchSpec(("erm", "penalty"))).read_text()
    assert "| primal-dual − erm |" in text and "| primal-dual − penalty |" in text


def test_the_ablated_keys_are_the_numeric_settings_groups_differ_in_alone(tmp_path):
    for alpha in (0.05, 0.1, 0.2):
        write_run(tmp_path, f"alpha={alpha}", "primal-dual", 0, 1.0, 2.0)
        config = tmp_path / f"alpha={alpha}" / "seed-0" / "config.toml"
        config.write_text(config.read_text() + f'[[constraints]]\nkind = "descent"\nalpha = {alpha}\n')
    groups = summarize(collect(tmp_path))
    assert ablated_keys(groups)["constraints.0.alpha"] == "alpha"
    assert ablations(groups) == {"constraints.0.alpha": [["alpha=0.05", "alpha=0.1", "alpha=0.2"]]}
    assert "## Ablation: alpha (primal-dual)" in write_report(tmp_path).read_text()


def test_the_trade_off_plot_is_drawn_and_shown(tmp_path):
    three_solvers(tmp_path)
    text = write_report(tmp_path).read_text()
    assert (tmp_path / "tradeoff.png").stat().st_size > 0 and "![tradeoff](tradeoff.png)" in text


@pytest.mark.parametrize(
    "primary, message",
    [
        ({"variants": ["primal-dul"]}, "bench.primary: no variant is labelled 'primal-dul' (the bench's are: erm, primal-dual)"),
        ({"metric": "acuracy"}, "bench.primary.metric: 'acuracy' is not a metric of task 'lista' (it reports: "),
        ({"splits": ["test", "denser"]}, "bench.primary.splits: variant 'primal-dual' is not evaluated on 'denser'"),
        ({"splits": ["mean(denser, noisier)"]}, "bench.primary.splits: variant 'primal-dual' is not evaluated on 'denser'"),
    ],
)
def test_a_bench_with_a_bad_primary_table_stops_before_anything_trains(tmp_path, tiny, capsys, primary, message):
    import tomli_w

    table = {
        **tiny,
        "bench": {
            "seeds": [0],
            "variants": {"erm": {"solver": {"name": "erm"}}, "primal-dual": {}},
            "primary": {"metric": "mse", "higher_is_better": False, "gammas": [0.5], "variants": ["primal-dual"], **primary},
        },
    }
    (tmp_path / "bench.toml").write_text(tomli_w.dumps(table))
    assert main(["bench", str(tmp_path / "bench.toml"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"layerdescent: error: {message}")
    assert not (tmp_path / "out").exists()


def test_a_primary_split_on_a_mean_over_domains_the_variants_are_evaluated_on_is_planned(tmp_path, tiny):
    import tomli_w

    from layerdescent.bench.plan import plan

    tiny["eval"]["domains"] = ["denser", "noisier"]
    primary = {
        "metric": "mse",
        "higher_is_better": False,
        "gammas": [0.5],
        "variants": ["primal-dual"],
        "splits": ["mean(denser, noisier)"],
    }
    table = {**tiny, "bench": {"seeds": [0], "variants": {"erm": {"solver": {"name": "erm"}}, "primal-dual": {}}, "primary": primary}}
    (tmp_path / "bench.toml").write_text(tomli_w.dumps(table))
    assert [run.variant for run in plan(tmp_path / "bench.toml", tmp_path / "out")] == ["erm", "primal-dual"]


def test_a_bench_summary_opens_with_the_bench_files_primary_family(tmp_path, tiny, capsys):
    import tomli_w

    table = {
        **tiny,
        "bench": {
            "seeds": [0, 1],
            "baselines": ["erm", "penalty"],
            "variants": {"erm": {"solver": {"name": "erm"}}, "penalty": {"solver": {"name": "penalty"}}, "primal-dual": {}},
            "primary": {"metric": "mse", "higher_is_better": False, "gammas": [0.5], "variants": ["primal-dual"]},
        },
    }
    (tmp_path / "bench.toml").write_text(tomli_w.dumps(table))
    assert main(["bench", str(tmp_path / "bench.toml"), "--out", str(tmp_path / "out")]) == 0
    text = (tmp_path / "out" / "summary.md").read_text()
    assert "## Primary endpoints (pre-registered)" in text and "| primal-dual | test | 0.5 |" in text
    assert "| primal-dual − penalty |" in text


def test_a_tuned_variant_against_an_untuned_penalty_is_flagged_whatever_the_labels(tmp_path):
    for solver, values in AT_GAMMA_1.items():
        for seed, mse1 in enumerate(values):
            write_run(tmp_path, f"vtest-{solver}", solver, seed, 0.1 + 0.01 * seed, mse1)
    spec = BenchSpec(("erm", "penalty"), tuning={"vtest-primal-dual": 27})
    text = write_report(tmp_path, spec=spec).read_text()
    assert "| vtest-primal-dual − vtest-penalty § |" in text  # penalty has layer weights nobody tuned
    assert "| vtest-primal-dual − vtest-erm |" in text  # erm has no settings of its own to tune


def test_a_primary_cell_on_a_mean_over_domains_pairs_each_runs_own_mean_within_the_family():
    from layerdescent.analysis.stats import paired_difference

    # per seed, each run's mse at gamma 1 on domains a and b: primal-dual lower on their mean in every seed
    domain_mse = {"erm": [(0.50, 0.70), (0.52, 0.66), (0.49, 0.71)], "primal-dual": [(0.40, 0.61), (0.44, 0.58), (0.41, 0.60)]}
    results = []
    for label, per_seed in domain_mse.items():
        for seed, (a, b) in enumerate(per_seed):
            r = fake_results(label, label, seed, 0.1, 0.5, 0.002)
            r["domains"] = {
                name: [{**g, "metrics": {"mse": value if g["gamma"] == 1.0 else 0.1}} for g in r["gammas"]]
                for name, value in (("a", a), ("b", b))
            }
            results.append(r)
    cells = judge_cells(results, BenchSpec(("erm",)), ("primal-dual",), "mse", False, (1.0,), ("test", "mean(a, b)"))
    mean_cell = cells[1]
    assert [c["split"] for c in cells] == ["test", "mean(a, b)"] and mean_cell["baseline"] == "erm"
    ours = [-(x + y) / 2 for x, y in domain_mse["primal-dual"]]
    theirs = [-(x + y) / 2 for x, y in domain_mse["erm"]]
    assert mean_cell["difference"]["mean"] == pytest.approx(paired_difference(ours, theirs)["mean"])
    assert mean_cell["simultaneous"] == pytest.approx(paired_difference(ours, theirs, level=1 - 0.05 / 2))  # a family of 2
    assert mean_cell["verdict"] == "better"
    missing = judge_cells(results, BenchSpec(("erm",)), ("primal-dual",), "mse", False, (1.0,), ("mean(a, nowhere)",))
    assert missing[0]["verdict"] == "missing"  # no run was evaluated on every domain it names
