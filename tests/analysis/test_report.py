"""Report: grouping runs by label, mean ± std over seeds, cost ratio to erm, markdown and plots."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from helpers import fake_results

from layerdescent.analysis.report import collect, format_difference, paired_difference, summarize, write_report
from layerdescent.cli import main
from layerdescent.errors import LayerdescentError

# label -> solver, then per seed: (mse at gamma 0, mse at gamma 1, step time in seconds)
RUNS = {
    ("erm", "erm"): {0: (1.0, 4.0, 0.002), 1: (3.0, 6.0, 0.004)},
    ("primal-dual", "primal-dual"): {0: (0.5, 2.0, 0.006), 1: (0.5, 3.0, 0.006)},
}


def fake_log(solver: str) -> str:
    lines = []
    for step in (10, 20):
        record = {"event": "train", "step": step, "loss": [0.3, 0.2, 0.1], "violation": {"descent": [0.0, 0.0]}, "feasible": 1.0}
        if solver == "primal-dual":
            record["lambda"] = {"descent": [0.01 * step, 0.0]}
        lines.append(json.dumps(record))
    lines.append(json.dumps({"event": "epoch", "epoch": 0}))
    return "\n".join(lines) + "\n"


@pytest.fixture
def bench(tmp_path):
    for (label, solver), seeds in RUNS.items():
        for seed, (mse0, mse1, step_time) in seeds.items():
            run = tmp_path / "bench" / f"{label}-s{seed}"
            run.mkdir(parents=True)
            (run / "config.toml").write_text(f'solver = "{solver}"\nseed = {seed}\n')
            (run / "results.json").write_text(json.dumps(fake_results(label, solver, seed, mse0, mse1, step_time)))
            (run / "metrics.jsonl").write_text(fake_log(solver))
    return tmp_path / "bench"


def test_collect_finds_every_run_and_records_its_directory(bench):
    results = collect(bench)
    assert len(results) == 4
    assert [r["run_dir"] for r in results] == sorted(str(p.parent) for p in bench.rglob("results.json"))


def test_summarize_gives_mean_and_sample_std_over_seeds(bench):
    groups = summarize(collect(bench))
    assert list(groups) == ["erm", "primal-dual"]
    erm = groups["erm"]
    assert erm["n"] == 2 and erm["solver"] == "erm"
    mse = erm["gammas"][0.0]["metrics"]["mse"]
    assert mse["mean"] == pytest.approx(2.0)
    assert mse["std"] == pytest.approx(math.sqrt(2.0))
    assert erm["gammas"][1.0]["layer_loss"]["mean"] == pytest.approx([10.0, 7.5, 5.0])
    assert erm["gammas"][0.0]["descent_rate"]["std"] == pytest.approx([0.0, math.sqrt(0.005)])


def test_summarize_reports_zero_std_for_a_single_seed(bench):
    groups = summarize([r for r in collect(bench) if r["seed"] == 0])
    assert groups["erm"]["gammas"][0.0]["metrics"]["mse"] == {"mean": 1.0, "std": 0.0, "n": 1}


def test_summarize_gives_step_time_ratio_to_erm(bench):
    groups = summarize(collect(bench))
    assert groups["erm"]["step_time"] == pytest.approx(0.003)
    assert groups["erm"]["step_time_ratio"] == pytest.approx(1.0)
    assert groups["primal-dual"]["step_time_ratio"] == pytest.approx(2.0)


def test_summarize_has_no_ratio_without_an_erm_group(bench):
    groups = summarize([r for r in collect(bench) if r["solver"] != "erm"])
    assert groups["primal-dual"]["step_time_ratio"] is None


def test_write_report_writes_tables_and_all_plots(bench, tmp_path):
    out = tmp_path / "report"
    summary = write_report(bench, out=out, title="Fake bench")
    assert summary == out / "summary.md"
    text = summary.read_text()
    assert text.startswith("# Fake bench")
    assert "4 runs" in text
    assert "| erm | 2.0 ± 1.4 | 5.0 ± 1.4 |" in text  # mse at gamma 0 and 1, to the precision the spread supports
    assert "| primal-dual | 0.5 ± 0 | 2.5 ± 0.7 |" in text
    assert "| primal-dual | descent | 0.15, 0 |" in text  # final lambda, mean over seeds
    assert "| primal-dual | primal-dual | 6 | 2 |" in text  # step time in ms and ratio to erm
    for name in ("loss_vs_layer.png", "metric_vs_gamma.png", "descent_rate.png", "traces.png"):
        assert (out / name).stat().st_size > 0
        assert f"]({name})" in text


def test_a_report_shows_the_plots_it_is_told_to_and_names_the_others_it_drew(bench, tmp_path):
    summary = write_report(bench, out=tmp_path / "report", shown={"traces.png"})
    text = summary.read_text()
    assert "![traces](traces.png)" in text and "](loss_vs_layer.png)" not in text
    named = text.rstrip().splitlines()[-1]  # the plots close the page
    assert named.startswith("Also drawn beside this page, not shown here: `loss_vs_layer.png`") and "`traces.png`" not in named
    assert (tmp_path / "report" / "loss_vs_layer.png").stat().st_size > 0  # drawn all the same


def test_write_report_defaults_to_the_root_directory(bench):
    assert write_report(bench) == bench / "summary.md"


def test_collect_on_an_empty_directory_raises(tmp_path):
    with pytest.raises(LayerdescentError, match="no results.json under"):
        collect(tmp_path)


def test_a_known_paired_difference_is_detected_and_a_null_one_is_not():
    rng = np.random.default_rng(0)
    base = rng.normal(0.8, 0.05, size=5)  # seeds differ a lot; pairing removes that
    shifted = paired_difference(base + 0.02 + rng.normal(0, 0.002, 5), base)
    assert shifted["distinct"] and shifted["low"] > 0 and shifted["mean"] == pytest.approx(0.02, abs=0.003)
    null = paired_difference(base + np.array([0.01, -0.01, 0.005, -0.005, 0.0]), base)
    assert not null["distinct"] and null["low"] < 0 < null["high"]
    single = paired_difference([0.9], [0.8])
    assert single["mean"] == pytest.approx(0.1) and single["low"] is None and not single["distinct"]


def test_pairs_that_all_differ_alike_have_no_interval_and_are_not_called_distinct():
    # two seeds' accuracies on 300 sentences, each 0.011 apart: t's interval would be a point
    alike = paired_difference([0.713 + 0.011, 0.702 + 0.011], [0.713, 0.702])
    assert alike["low"] is None and not alike["distinct"] and alike["mean"] == pytest.approx(0.011)
    assert format_difference(alike) == "+0.0110 (alike in all 2 pairs)"


def test_summary_pairs_seeds_against_erm_and_bolds_only_intervals_that_exclude_zero(bench):
    text = write_report(bench).read_text()
    section = text.split("## Paired differences over seeds")[1].split("\n## ")[0]
    row = next(line for line in section.splitlines() if line.startswith("| primal-dual − erm"))
    # mse at gamma 0: seeds give 0.5 - 1.0 and 0.5 - 3.0: mean -1.5 within +-12.7, so no decimal, and undecided
    assert row.split("|")[2].strip() == "2" and row.split("|")[3].strip() == "-2 [-14, +11]"
    assert "**" not in row


def test_runs_pair_with_the_erm_run_of_their_own_dataset_and_plot_one_panel_row_each(tmp_path):
    mse = {("erm", "a"): 1.0, ("primal-dual", "a"): 0.9, ("erm", "b"): 5.0, ("primal-dual", "b"): 4.0}
    for (solver, dataset), value in mse.items():
        for seed in (0, 1):
            run = tmp_path / f"{dataset}-{solver}" / f"seed-{seed}"
            run.mkdir(parents=True)
            (run / "config.toml").write_text(f'seed = {seed}\n[task]\nname = "lista"\ndataset = "{dataset}"\n[solver]\nname = "{solver}"\n')
            noise = 0.01 * seed * (2 if solver == "primal-dual" else 1)  # seeds differ, and pairs differ a little
            result = fake_results(f"{dataset}-{solver}", solver, seed, value + noise, value + noise, 0.002 if solver == "erm" else 0.003)
            (run / "results.json").write_text(json.dumps(result))
    groups = summarize(collect(tmp_path))
    assert groups["b-primal-dual"]["step_time_ratio"] == pytest.approx(1.5)
    text = write_report(tmp_path).read_text()
    rows = {
        line.split("|")[1].strip(): line.split("|")[3].strip("* ")
        for line in text.split("### mse")[1].split("###")[0].splitlines()
        if line.startswith("| ")
    }
    assert rows["a-primal-dual − a-erm"] == "-0.09 [-0.16, -0.03]" and rows["b-primal-dual − b-erm"] == "-1.00 [-1.06, -0.93]"
    assert "b-primal-dual − a-erm" not in rows


def alpha_sweep(root, alphas: dict[str, float], train_extra: dict[str, str]) -> None:
    """Primal-dual runs at several alphas (two seeds each), each label's config.toml as a bench writes it."""
    for label, alpha in alphas.items():
        for seed in (0, 1):
            run = root / label / f"seed-{seed}"
            run.mkdir(parents=True)
            train = "".join(f"{k} = {v}\n" for k, v in train_extra.get(label, {}).items())
            (run / "config.toml").write_text(
                f'seed = {seed}\nlabel = "{label}"\n[task]\nname = "lista"\n[train]\nepochs = 1\n{train}[solver]\nname = "primal-dual"\n'
                f'[[constraints]]\nkind = "descent"\nalpha = {alpha}\n'
            )
            (run / "results.json").write_text(json.dumps(fake_results(label, "primal-dual", seed, 1.0 + alpha, 2.0 + alpha, 0.003)))
            (run / "metrics.jsonl").write_text(fake_log("primal-dual"))


def test_runs_that_differ_only_in_alpha_get_an_ablation_table_and_plot(tmp_path):
    # One run recorded its train.early_stopping default, the others predate the option: still one sweep.
    alpha_sweep(tmp_path, {"a0": 0.0, "a1": 0.1, "a2": 0.2}, {"a1": {"early_stopping": 0}})
    text = write_report(tmp_path).read_text()
    section = text.split("## Ablation: alpha (primal-dual)")[1].split("\n## ")[0]
    rows = [line.split("|")[1:4] for line in section.splitlines() if line.startswith("| 0")]
    assert [[c.strip() for c in row] for row in rows] == [["0", "a0", "2"], ["0.1", "a1", "2"], ["0.2", "a2", "2"]]
    assert "| 0.1 | a1 | 2 | 1.1 ± 0 | 2.1 ± 0 |" in section  # mse at both gammas
    assert (tmp_path / "ablation_alpha.png").stat().st_size > 0 and "](ablation_alpha.png)" in text


def test_two_values_or_another_changed_setting_make_no_ablation(tmp_path):
    alpha_sweep(tmp_path, {"a0": 0.0, "a1": 0.1, "a2": 0.2}, {"a2": {"lr": 0.5}})
    text = write_report(tmp_path).read_text()
    assert "## Ablation" not in text and not (tmp_path / "ablation_alpha.png").exists()


def test_a_run_evaluated_on_validation_joins_no_ablation_of_test_runs(tmp_path):
    alpha_sweep(tmp_path, {"a0": 0.0, "a1": 0.1, "a2": 0.2}, {})
    for config in (tmp_path / "a2").rglob("config.toml"):
        config.write_text(config.read_text() + '[eval]\nsplit = "validation"\n')
    assert "## Ablation" not in write_report(tmp_path).read_text()


def test_traces_plot_the_multipliers_and_violations_of_constrained_runs_only(bench):
    from layerdescent.analysis.plots import _traces

    traces = _traces(summarize(collect(bench)))
    assert list(traces) == [("primal-dual", "descent")]
    steps, lam, violation = traces["primal-dual", "descent"]
    assert steps.tolist() == [10, 20] and lam[:, 0].tolist() == pytest.approx([0.1, 0.2]) and violation.shape == (2, 2)


def two_seeds(root, label: str, solver: str, mse: float, task: str = "", train: str = "") -> None:
    """Seeds 0 and 1 of a lista run labelled ``label``, with extra ``[task]`` and ``[train]`` lines in its config.toml."""
    for seed in (0, 1):
        run = root / label / f"seed-{seed}"
        run.mkdir(parents=True)
        (run / "config.toml").write_text(f'seed = {seed}\n[task]\nname = "lista"\n{task}[train]\n{train}[solver]\nname = "{solver}"\n')
        (run / "results.json").write_text(json.dumps(fake_results(label, solver, seed, mse + 0.01 * seed, mse, 0.002)))


def test_erm_variants_trained_otherwise_share_the_context_and_pair_with_the_erm_label(tmp_path):
    for label, gamma, mse in (("erm-clean", 0.0, 2.0), ("erm", 0.1, 1.0), ("primal-dual", 0.1, 0.5)):
        two_seeds(tmp_path, label, "primal-dual" if label == "primal-dual" else "erm", mse, train=f"train_gamma = {gamma}\n")
    text = write_report(tmp_path).read_text()
    rows = {line.split("|")[1].strip() for line in text.split("### mse")[1].split("###")[0].splitlines() if line.startswith("| ")}
    assert {"erm-clean − erm", "primal-dual − erm"} <= rows and not any("− erm-clean" in row for row in rows)


def test_a_run_recorded_before_a_task_option_existed_pairs_with_one_that_records_its_default(tmp_path):
    from layerdescent_lista import SparseCoding

    option, default = next((k, v) for k, v in SparseCoding.options.items() if isinstance(v, (int, float)) and not isinstance(v, bool))
    two_seeds(tmp_path, "erm", "erm", 1.0)
    two_seeds(tmp_path, "primal-dual", "primal-dual", 0.5, task=f"{option} = {default!r}\n")
    text = write_report(tmp_path).read_text()
    # paired, and flagged: a run that records an option the other lacks was made by other code
    assert "| primal-dual − erm ‡ |" in text.split("### mse")[1]


def no_metric_run(root, label: str, solver: str, seed: int, task: str = "refine") -> None:
    """A finished run of a task that reports no metrics, as the README's plugin example writes it."""
    run = root / label / f"seed-{seed}"
    run.mkdir(parents=True)
    (run / "config.toml").write_text(f'seed = {seed}\n[task]\nname = "{task}"\n[solver]\nname = "{solver}"\n')
    result = fake_results(label, solver, seed, 1.0, 2.0, 0.002)
    result["task"] = task
    for g in result["gammas"]:
        g["metrics"] = {}
    (run / "results.json").write_text(json.dumps(result))
    (run / "metrics.jsonl").write_text(fake_log(solver))


def test_a_task_without_metrics_gets_layer_tables_and_plots_but_no_metric_sections(tmp_path):
    for solver in ("erm", "primal-dual"):
        no_metric_run(tmp_path, solver, solver, 0)
    text = write_report(tmp_path).read_text()
    assert "reports no metrics" in text and "## Metric at each gamma" not in text
    assert "## Test loss per layer at γ=0" in text and "| erm | 2.000 | 1.500 | 1.000 |" in text
    assert (tmp_path / "loss_vs_layer.png").exists() and not (tmp_path / "metric_vs_gamma.png").exists()


def test_runs_of_two_tasks_sharing_a_label_are_told_apart_and_never_compared(tmp_path, bench):
    for solver in ("erm", "primal-dual"):
        no_metric_run(tmp_path / "bench", f"refine-{solver}", solver, 0)
    for path in (tmp_path / "bench").rglob("results.json"):  # the refine runs reuse lista's labels
        data = json.loads(path.read_text())
        data["label"] = data["solver"]
        path.write_text(json.dumps(data))
    text = write_report(bench).read_text()
    assert "**These runs come from 2 tasks**: lista (4 runs), refine (2 runs)" in text
    assert "| lista: erm | 2.0 ± 1.4 |" in text and "| refine: erm | 2.000 | 1.500 | 1.000 |" in text
    assert "lista: primal-dual − lista: erm" in text and "refine: primal-dual − lista: erm" not in text


def test_one_seed_shows_means_alone_and_says_n_is_1(bench):
    for path in bench.rglob("results.json"):
        if '"seed": 1' in path.read_text():
            path.unlink()
    text = write_report(bench).read_text()
    assert "2 runs of 2 variants; seed 0. One seed per variant (n = 1)" in text
    assert "| erm | 1.000 | 4.000 |" in text and "±" not in text.split("## Final multipliers")[0]


def test_runs_evaluated_on_validation_are_named_and_pair_with_no_test_run(bench):
    for path in bench.rglob("results.json"):
        if '"primal-dual"' in path.read_text():
            data = json.loads(path.read_text())
            path.write_text(json.dumps({**data, "split": "validation"}))
            config = path.parent / "config.toml"
            config.write_text(config.read_text() + '\n[eval]\nsplit = "validation"\n')
    text = write_report(bench).read_text()
    assert (
        "**Evaluated on another split than test** (their tables' numbers are on that split; they pair with no test run): primal-dual (validation)."
        in text
    )
    assert "primal-dual − erm" not in text


def test_plots_name_the_split_of_runs_evaluated_on_validation(bench, monkeypatch):
    from layerdescent.analysis import plots

    for path in bench.rglob("results.json"):
        if '"primal-dual"' in path.read_text():
            path.write_text(json.dumps({**json.loads(path.read_text()), "split": "validation"}))
    shown = {}  # file name -> the legend's entries and the y labels, as each figure is saved
    monkeypatch.setattr(
        plots,
        "save_png",
        lambda fig, path, **_: shown.__setitem__(
            Path(path).name, ([t.get_text() for legend in fig.legends for t in legend.get_texts()], [ax.get_ylabel() for ax in fig.axes])
        ),
    )
    write_report(bench)
    legend, ylabels = shown["loss_vs_layer.png"]
    assert legend == ["erm", "primal-dual (validation)"] and ylabels[0] == "loss (test unless the legend names a split)"
    assert shown["descent_rate.png"][0] == ["erm", "primal-dual (validation)"]


def test_compare_pairs_two_labels_over_shared_seeds_on_the_test_split_and_each_domain(bench, capsys):
    for path in bench.rglob("results.json"):
        data = json.loads(path.read_text())
        path.write_text(
            json.dumps({**data, "domains": {"shifted": [{**g, "metrics": {"mse": 2 * g["metrics"]["mse"]}} for g in data["gammas"]]}})
        )
    assert main(["compare", str(bench), "primal-dual", "erm"]) == 0
    text = capsys.readouterr().out
    # the summary's pairing (test_summary_pairs_seeds_against_erm...): mse at gamma 0 is -2 [-14, +11];
    # on the domain every value is doubled, and so is the difference
    assert "## mse: primal-dual − erm" in text and "| test | -2 [-14, +11] | -2 [-9, +4] |" in text
    assert "| shifted | -3 [-28, +22] | -5 [-18, +8] |" in text


def test_compare_names_the_labels_there_are_when_one_is_missing(bench, capsys):
    assert main(["compare", str(bench), "primal-dual", "erm-clean"]) == 2
    err = capsys.readouterr().err
    assert err == "layerdescent: error: no runs labelled 'erm-clean'; the bench's labels are: erm, primal-dual\n"


@pytest.mark.parametrize(
    "content, message",
    [
        ('{"label": "erm", "task"', "is not valid JSON"),
        (b"\x80\x81\xff\x00binary", "is not text"),
        ("[1, 2, 3]", "holds a JSON list"),
        ('{"label": "erm"}', "lacks 'task', 'solver'"),
        (
            '{"label": "erm", "task": "lista", "solver": "erm", "seed": 0, "num_layers": 2, "gammas": [{"gamma": 0}]}',
            "every gamma record needs",
        ),
    ],
    ids=["truncated", "binary", "list", "missing-keys", "bad-gamma-record"],
)
def test_a_damaged_results_json_is_one_line_naming_the_file_with_exit_2(bench, capsys, content, message):
    from layerdescent.cli import main

    path = bench / "erm-s0" / "results.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    assert main(["report", str(bench)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and str(path) in err, err


def test_a_damaged_metrics_line_or_an_out_that_is_a_file_is_one_line_with_exit_2(bench, tmp_path, capsys):
    from layerdescent.cli import main

    log = bench / "primal-dual-s0" / "metrics.jsonl"
    log.write_text(log.read_text() + '{"event": "train", "st\n')
    assert main(["report", str(bench)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{log}:4 is not valid JSON" in err, err
    log.write_text(fake_log("primal-dual"))
    afile = tmp_path / "afile"
    afile.write_text("")
    assert main(["report", str(bench), "--out", str(afile)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is a file, not a directory" in err, err


def test_the_cost_section_says_how_the_runs_shared_the_machine(bench):
    assert "Runs went 2 at a time (`--workers 2`" in write_report(bench, workers=2).read_text()
    assert "Runs went one after another" in write_report(bench, workers=1).read_text()


def test_the_final_multipliers_say_how_many_still_bind(bench):
    text = write_report(bench).read_text()
    table = text.split("## Final multipliers (mean over seeds)")[1].split("\n## ")[0]
    assert "| primal-dual | descent | 0.15, 0 | 2 of 4 |" in table  # lambda [0.1 (seed + 1), 0]: one entry binds per seed


def test_two_configs_under_one_label_are_two_groups_named_by_what_differs_in_report_and_compare(tmp_path, capsys):
    from layerdescent.cli import main

    for seed, dual_lr in ((0, 0.5), (0, 1.0), (1, 0.5)):
        run = tmp_path / "runs" / f"lr{dual_lr}-seed{seed}"
        run.mkdir(parents=True)
        (run / "config.toml").write_text(
            f'seed = {seed}\nlabel = "primal-dual"\n[task]\nname = "lista"\n[solver]\nname = "primal-dual"\ndual_lr = {dual_lr}\n'
        )
        (run / "results.json").write_text(json.dumps(fake_results("primal-dual", "primal-dual", seed, 0.1 + dual_lr, 0.2, 0.002)))
    labels = sorted({r["label"] for r in collect(tmp_path / "runs")})
    assert labels == ["primal-dual [solver.dual_lr=0.5]", "primal-dual [solver.dual_lr=1]"]
    text = write_report(tmp_path / "runs").read_text()
    assert "primal-dual [solver.dual_lr=0.5]" in text and "primal-dual [solver.dual_lr=1]" in text
    assert main(["compare", str(tmp_path / "runs"), "primal-dual [solver.dual_lr=1]", "primal-dual [solver.dual_lr=0.5]"]) == 0
    out = capsys.readouterr().out
    assert (
        "1 paired seeds (0)." in out
        and "Left out, with no run of the same seed on the other side: primal-dual [solver.dual_lr=0.5] seed 1." in out
    )
    assert main(["compare", str(tmp_path / "runs"), "primal-dual", "erm"]) == 2
    assert "no runs labelled 'primal-dual'; the bench's labels are: primal-dual [solver.dual_lr=0.5]" in capsys.readouterr().err


def test_a_compressed_log_reads_as_the_plain_one_and_still_draws_the_traces(tmp_path):
    import gzip

    from helpers import RUN

    import layerdescent as ld
    from layerdescent.analysis.plots import _traces, read_log

    ld.train(ld.config_from_dict(RUN), tmp_path / "bench" / "run")
    log = tmp_path / "bench" / "run" / "metrics.jsonl"
    plain = read_log(log)
    before = _traces(summarize(collect(tmp_path / "bench")))
    (log.parent / "metrics.jsonl.gz").write_bytes(gzip.compress(log.read_bytes(), mtime=0))
    log.unlink()
    assert read_log(log.parent / "metrics.jsonl.gz") == plain
    after = _traces(summarize(collect(tmp_path / "bench")))
    assert before.keys() == after.keys() and all(np.array_equal(a[1], b[1]) for a, b in zip(before.values(), after.values()))
