"""The layerdescent command: every user mistake is one line and exit status 2."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest
from conftest import LAYERDESCENT

import layerdescent as ld
from layerdescent.cli import main

GOOD = """
    [task]
    name = "lista"
    layers = 4
    code_dim = 16
    measure_dim = 12
    sparsity = 2
    train_size = 256
    validation_size = 64
    test_size = 64

    [train]
    epochs = 1
    progress = false

    [solver]
    name = "primal-dual"
    dual_lr = 0.5

    [[constraints]]
    kind = "descent"
    alpha = 0.05

    [eval]
    gammas = [0.0, 0.5]
"""


def write(tmp_path, text, name="run.toml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


@pytest.mark.parametrize(
    "old, new, message",
    [
        ("dual_lr = 0.5", "dual_lrr = 0.5", "unknown key solver.dual_lrr; did you mean 'dual_lr'?"),
        ("epochs = 1", 'epochs = "ten"', "train.epochs must be an integer, got 'ten'"),
        ("alpha = 0.05", "alpha = 1.5", "alpha must be in [0, 1), got 1.5"),
        ("dual_lr = 0.5", "dual_lr = -1", "solver.dual_lr must be >= 0, got -1.0"),
        ('name = "lista"', 'name = "lsita"', "unknown task 'lsita'; did you mean 'lista'?"),
        ('kind = "descent"', 'kind = "desent"', "unknown constraint kind 'desent'; did you mean 'descent'?"),
        (
            'name = "primal-dual"',
            'name = "primal_dual"',
            "solver.name = 'primal_dual' is not a registered solver; did you mean 'primal-dual'?",
        ),
        ("layers = 4", "layers = 4\nlayerz = 3", "unknown key task.layerz; did you mean 'layers'?"),
        ("[eval]", "[evaluation]", "unknown key evaluation; did you mean 'eval'?"),
        ("gammas = [0.0, 0.5]", "gammas = []", "eval.gammas must hold at least one level"),
        ("alpha = 0.05", "alpha = 0.05\nlayers = [7]", "descent layer 7 is out of range"),
        ("alpha = 0.05", 'alpha = 0.05\nreference = "frozen"', "reference = 'frozen' is not allowed"),
        ("[eval]", '[[constraints]]\nkind = "descent"\n[eval]', "constraints[1].name 'descent' is used twice"),
        ("[train]", "[train", "is not valid TOML"),
    ],
    ids=lambda v: v if isinstance(v, str) and len(v) < 30 else None,
)
def test_bad_config_exits_2_with_one_line_naming_the_key(tmp_path, capsys, old, new, message):
    text = textwrap.dedent(GOOD)
    assert old in text
    path = write(tmp_path, text.replace(old, new, 1))
    assert main(["run", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "out").exists()


def test_missing_config_file_and_bad_override_are_one_line(tmp_path, capsys):
    assert main(["run", str(tmp_path / "nope.toml")]) == 2
    assert "does not exist" in capsys.readouterr().err
    path = write(tmp_path, GOOD)
    assert main(["run", str(path), "--set", "solver.dual_lr"]) == 2
    assert "must look like key=value" in capsys.readouterr().err


def test_console_script_reports_a_bad_config_without_traceback(tmp_path):
    path = write(tmp_path, textwrap.dedent(GOOD).replace("alpha = 0.05", "alpha = 1.5"))
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(
        [sys.executable, "-m", "layerdescent.cli", "run", str(path)], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == ["layerdescent: error: constraints[0]: alpha must be in [0, 1), got 1.5"]


def test_run_with_overrides_writes_results_and_report_summarizes_it(tmp_path, capsys):
    path = write(tmp_path, GOOD)
    out = tmp_path / "run"
    assert main(["run", str(path), "--out", str(out), "--set", "solver.dual_lr=0.25", "--set", "constraints.0.alpha=0.1"]) == 0
    results = json.loads((out / "results.json").read_text())
    assert [g["gamma"] for g in results["gammas"]] == [0.0, 0.5]
    recorded = (out / "config.toml").read_text()
    assert "dual_lr = 0.25" in recorded and "alpha = 0.1" in recorded
    assert main(["report", str(out)]) == 0
    assert (out / "summary.md").exists() and (out / "loss_vs_layer.png").exists()


def test_list_shows_tasks_constraint_kinds_and_solvers(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for name in ("lista", "descent", "bound", "erm", "penalty", "primal-dual"):
        assert name in out


def test_plugins_lists_the_bundled_plugin_with_its_distribution(capsys):
    assert main(["plugins", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["lista"]["status"] == "loaded" and rows["lista"]["distribution"] == "layerdescent"


TWO_BY_TWO = textwrap.dedent(GOOD) + textwrap.dedent(
    """
    [bench]
    seeds = [0, 1]
    [bench.variants.erm]
    solver.name = "erm"
    [bench.variants.primal-dual]
    solver.name = "primal-dual"
    """
)


def test_bench_runs_variants_by_seeds_and_resumes_without_rerunning(tmp_path, capsys):
    bench = TWO_BY_TWO
    path = write(tmp_path, bench, "bench.toml")
    out = tmp_path / "bench"
    keep = ["--set", "train.keep_checkpoint=true"]  # so that a run whose results.json is gone resumes
    assert main(["bench", str(path), "--out", str(out), *keep]) == 0
    first = capsys.readouterr().out
    assert first.count(": trained") == 4
    summary = (out / "summary.md").read_text()
    assert "erm" in summary and "primal-dual" in summary
    (out / "erm" / "seed-1" / "results.json").unlink()
    assert main(["bench", str(path), "--out", str(out), *keep]) == 0
    second = capsys.readouterr().out
    assert second.count(": done") == 3 and "erm seed 1: resumed" in second

    shifted = tmp_path / "impulse"
    assert main(["evaluate", str(out), "--out", str(shifted), "--set", "task.perturbation=impulse"]) == 0
    assert capsys.readouterr().out.count(": evaluated") == 4
    assert (shifted / "primal-dual" / "seed-1" / "results.json").exists() and (shifted / "summary.md").exists()
    assert main(["evaluate", str(out), "--out", str(shifted), "--set", "task.perturbation=impulse"]) == 0
    assert capsys.readouterr().out.count(": done") == 4


# The text demo's configuration in miniature: the tiny random BERT on synthetic sentences, nothing to fetch.
TEXT_DEMO_SMALL = [
    a
    for o in (
        "task.model_path=tiny",
        "task.dataset=synthetic",
        "task.synthetic_size=200",
        "train.threads=1",
        "eval.batch_size=64",
        "train.checkpoint_every=2",
    )
    for a in ("--set", o)
]
LISTA_DEMO_SMALL = [a for o in ("train.epochs=1", "task.train_size=128", "task.test_size=64", "bench.seeds=[0]") for a in ("--set", o)]


def test_lista_demo_judges_primal_dual_against_the_stronger_of_erm_and_penalty_in_its_table(tmp_path, capsys):
    assert main(["demo", "--task", "lista", "--out", str(tmp_path / "demo"), *LISTA_DEMO_SMALL]) == 0
    out = capsys.readouterr().out
    assert "| erm |" in out and "| penalty |" in out and "| primal-dual |" in out
    primary = out.split("## Primary endpoints (pre-registered)")[1].split("\n## ")[0]
    assert "against the strongest of erm, penalty" in primary
    rows = [line for line in primary.splitlines() if line.startswith("| primal-dual |")]
    assert len(rows) == 2 and all(row.split("|")[4].strip() in ("erm", "penalty") for row in rows)
    assert all("undecided: one seed" in row for row in rows)  # LISTA_DEMO_SMALL keeps one of the demo's 3 seeds
    assert "Why no verdict: with one seed each solver trains once" in out and "--set 'bench.seeds=[0, 1, 2]'" in out
    assert (tmp_path / "demo" / "metric_vs_gamma.png").exists()


def test_text_demo_says_what_it_does_and_fetches_only_what_its_task_reads(tmp_path, monkeypatch, capsys):
    pytest.importorskip("transformers")
    monkeypatch.setenv("LAYERDESCENT_CACHE", str(tmp_path / "empty-cache"))  # a fetch would fail here: no hub, no wheel
    assert main(["demo", "--task", "text", "--out", str(tmp_path / "demo"), "--workers", "1", *TEXT_DEMO_SMALL]) == 0
    out = capsys.readouterr().out
    first = out.splitlines()[0]
    assert first.startswith("layerdescent demo --task text-classification:") and "110 steps" in first and "fetching" not in out
    assert "| primal-dual |" in out and (tmp_path / "demo" / "loss_vs_layer.png").exists()
    assert all(f"{label} seed 0: trained" in out for label in ("erm", "penalty", "primal-dual"))
    # the text demo has one seed: it says why its table decides nothing, and what would
    assert out.rstrip().splitlines()[-1].startswith("Why no verdict") and "layerdescent demo --task lista decides over 3 seeds" in out


def test_an_interrupted_demo_continues_mid_epoch_and_ends_as_an_uninterrupted_one(tmp_path, monkeypatch, capsys):
    pytest.importorskip("transformers")
    from layerdescent.run.checkpoint import load_checkpoint
    from layerdescent.run.trainer import Trainer

    monkeypatch.setenv("LAYERDESCENT_CACHE", str(tmp_path / "empty-cache"))
    step, calls = Trainer.step, []

    def interrupted(self, session, group, index, full=True, **kwargs):
        if self.config.solver.name == "primal-dual":
            calls.append(index)
            if len(calls) == 4:  # after the checkpoint at step 2, in the middle of the only epoch
                raise KeyboardInterrupt
        return step(self, session, group, index, full, **kwargs)

    monkeypatch.setattr(Trainer, "step", interrupted)
    demo = ["demo", "--out", str(tmp_path / "demo"), "--workers", "1", *TEXT_DEMO_SMALL]
    assert main(demo) == 130
    assert "the same command again" in capsys.readouterr().err
    position = load_checkpoint(tmp_path / "demo" / "primal-dual" / "seed-0" / "checkpoint.pt", "text-classification")["position"]
    assert (position["epoch"], position["step"]) == (0, 2)  # mid-epoch: the epoch has 5 steps

    monkeypatch.setattr(Trainer, "step", step)
    assert main(demo) == 0
    out = capsys.readouterr().out
    assert "erm seed 0: done" in out and "primal-dual seed 0: resumed" in out
    assert main(["demo", "--out", str(tmp_path / "straight"), "--workers", "1", *TEXT_DEMO_SMALL]) == 0
    resumed, straight = (json.loads((tmp_path / d / "primal-dual" / "seed-0" / "results.json").read_text()) for d in ("demo", "straight"))
    assert resumed["gammas"] == straight["gammas"] and resumed["train"]["steps"] == 5


def test_the_two_demos_keep_their_own_folders_and_summaries(tmp_path, monkeypatch, capsys):
    pytest.importorskip("transformers")
    monkeypatch.setenv("LAYERDESCENT_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.chdir(tmp_path)
    assert main(["demo", "--workers", "1", *TEXT_DEMO_SMALL]) == 0  # README order: the main demo, then lista
    assert main(["demo", "--task", "lista", *LISTA_DEMO_SMALL]) == 0
    capsys.readouterr()
    text, lista = tmp_path / "layerdescent-demo", tmp_path / "layerdescent-demo-lista"
    for folder, task, metric in ((text, "text-classification", "accuracy"), (lista, "lista", "mse")):
        results = [json.loads(p.read_text()) for p in folder.rglob("results.json")]
        assert {r["task"] for r in results} == {task} and {r["solver"] for r in results} == {"erm", "penalty", "primal-dual"}
        summary = (folder / "summary.md").read_text()
        assert f"| {metric} γ=0 " in summary or f"{metric} γ=0 |" in summary
        assert "tasks**" not in summary
    # pointed at the other demo's folder, a demo refuses before training anything
    before = sorted(p.stat().st_mtime_ns for p in text.rglob("*") if p.is_file())
    assert main(["demo", "--task", "lista", "--out", str(text), *LISTA_DEMO_SMALL]) == 2
    assert "holds a run of task 'text-classification'" in capsys.readouterr().err
    assert sorted(p.stat().st_mtime_ns for p in text.rglob("*") if p.is_file()) == before


def test_assets_list_shows_each_declared_asset_and_whether_it_is_fetched(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LAYERDESCENT_CACHE", str(tmp_path))
    assert main(["assets", "list"]) == 0
    rows = {line.split()[0]: line.split()[1] for line in capsys.readouterr().out.splitlines()}
    assert rows["minilm"] == "missing" and rows["vader"] == "missing"


def test_fetching_an_unknown_asset_is_one_line(capsys):
    assert main(["assets", "fetch", "no-such-asset"]) == 2
    assert "unknown asset 'no-such-asset'" in capsys.readouterr().err


def test_bench_grid_crosses_every_variant_with_every_combination(tmp_path):
    from layerdescent.bench.plan import plan

    bench = textwrap.dedent(GOOD) + textwrap.dedent(
        """
        [bench]
        seeds = [0, 1]
        [bench.variants.primal-dual]
        solver.name = "primal-dual"
        [bench.grid]
        "constraints.0.alpha" = [0.0, 0.1]
        solver.dual_lr = [0.5, 2.0]
        """
    )
    runs = plan(write(tmp_path, bench, "grid.toml"), tmp_path / "out")
    assert len(runs) == 8
    names = sorted({r.variant for r in runs})
    assert names[0] == "primal-dual,alpha=0,dual_lr=0.5" and len(names) == 4
    run = next(r for r in runs if r.variant == "primal-dual,alpha=0.1,dual_lr=2" and r.seed == 1)
    assert run.config.constraints[0].alpha == 0.1 and run.config.solver.dual_lr == 2.0
    assert run.run_dir == tmp_path / "out" / "primal-dual,alpha=0.1,dual_lr=2" / "seed-1"


def test_a_bench_variant_may_run_its_own_seeds(tmp_path):
    from layerdescent.bench.plan import plan

    bench = (
        textwrap.dedent(GOOD)
        + '\n[bench]\nseeds = [0, 1, 2]\n[bench.variants.erm]\nsolver.name = "erm"\n[bench.variants.live]\nseeds = [0]\n'
    )
    runs = plan(write(tmp_path, bench, "seeds.toml"), tmp_path / "out")
    assert [(r.variant, r.seed) for r in runs] == [("erm", 0), ("erm", 1), ("erm", 2), ("live", 0)]
    with pytest.raises(ld.ConfigError, match="bench.variants.live.seeds must be a non-empty list"):
        plan(write(tmp_path, bench.replace("seeds = [0]\n", "seeds = 0\n"), "bad.toml"), tmp_path / "out")


def test_bench_only_trains_the_matching_variants_then_the_rest_on_the_next_call(tmp_path, capsys):
    bench = (
        textwrap.dedent(GOOD)
        + '\n[bench]\n[bench.variants."tune-a"]\n[bench.variants."tune-b"]\n[bench.variants.erm]\nsolver.name = "erm"\n'
    )
    path, out = write(tmp_path, bench, "tune.toml"), tmp_path / "out"
    assert main(["bench", str(path), "--out", str(out), "--only", "tune-*"]) == 0
    assert sorted(p.parent.parent.name for p in out.rglob("results.json")) == ["tune-a", "tune-b"]
    assert "--only 'tune-*'" in (out / "summary.md").read_text()
    capsys.readouterr()
    assert main(["bench", str(path), "--out", str(out)]) == 0
    assert capsys.readouterr().out.count(": done") == 2 and (out / "erm" / "seed-0" / "results.json").exists()
    assert main(["bench", str(path), "--out", str(out), "--only", "tune"]) == 2
    assert "--only tune matches no variant; the bench's are: tune-a, tune-b, erm" in capsys.readouterr().err


def test_bench_grid_typo_names_the_run_and_the_key(tmp_path, capsys):
    bench = textwrap.dedent(GOOD) + '\n[bench]\n[bench.variants.erm]\nsolver.name = "erm"\n[bench.grid]\n"solver.dual_rl" = [0.1]\n'
    assert main(["bench", str(write(tmp_path, bench, "grid.toml")), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "bench.variants.erm,dual_rl=0.1" in err and "dual_lr" in err


def test_bench_refuses_a_variant_naming_a_layer_the_model_lacks_before_anything_trains(tmp_path, capsys):
    bench = (
        textwrap.dedent(GOOD)
        + '\n[bench]\n[bench.variants.erm]\nsolver.name = "erm"\n[bench.variants.deep]\nconstraints = [{ kind = "descent", layers = [9] }]\n'
    )
    assert main(["bench", str(write(tmp_path, bench, "deep.toml")), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "bench.variants.deep: constraints[0]: descent layer 9 is out of range" in err, err
    assert not (tmp_path / "out").exists()


def test_bench_with_two_workers_trains_the_same_runs_as_one(tmp_path, capsys):
    bench = textwrap.dedent(GOOD) + '\n[bench]\nseeds = [0, 1]\n[bench.variants.erm]\nsolver.name = "erm"\n'
    path = write(tmp_path, bench, "bench.toml")
    assert main(["bench", str(path), "--out", str(tmp_path / "one")]) == 0
    assert main(["bench", str(path), "--out", str(tmp_path / "two"), "--workers", "2"]) == 0
    assert capsys.readouterr().out.count(": trained") == 4
    for seed in (0, 1):
        one, two = (json.loads((tmp_path / d / "erm" / f"seed-{seed}" / "results.json").read_text()) for d in ("one", "two"))
        assert one["gammas"] == two["gammas"]


def test_quick_commands_import_neither_torch_nor_the_data_libraries():
    # `--help`, `--version`, `list` and `plugins` answer at once only if nothing heavy is imported
    code = textwrap.dedent(
        """
        import contextlib, io, sys
        from layerdescent.cli import main
        with contextlib.redirect_stdout(io.StringIO()):
            for argv in (["--help"], ["--version"], ["list"], ["plugins"], ["plugins", "--json"]):
                try:
                    main(argv)
                except SystemExit:
                    pass
        heavy = ("torch", "torchmetrics", "datasets", "transformers", "scipy", "sklearn", "matplotlib", "numpy")
        print(sorted(m for m in heavy if m in sys.modules))
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.strip().splitlines()[-1] == "[]", proc.stdout


def test_gammas_outside_the_perturbations_range_are_refused_for_runs_and_re_evaluations(tmp_path, capsys):
    path = write(tmp_path, GOOD)
    assert (
        main(["run", str(path), "--out", str(tmp_path / "r"), "--set", "task.perturbation=impulse", "--set", "eval.gammas=[0, 0.5, 2]"])
        == 2
    )
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "eval.gammas: 2 outside [0, 1], the range of task 'lista''s 'impulse' perturbation" in err, err
    assert main(["run", str(path), "--out", str(tmp_path / "r"), "--set", "eval.gammas=[0, 2]"]) == 0  # gaussian: any gamma
    capsys.readouterr()
    assert main(["evaluate", str(tmp_path / "r"), "--out", str(tmp_path / "e"), "--set", "task.perturbation=impulse"]) == 2
    assert "probability γ" in capsys.readouterr().err and not (tmp_path / "e").exists()


# --- first contact (issue 36) ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "typed, message",
    [("train.epoch=2", "unknown key train.epoch; did you mean 'epochs'?"), ("task.layers=x", "task.layers must be an integer, got 'x'")],
)
def test_a_demo_mistake_names_the_set_the_user_typed_and_comes_before_the_opening_line(tmp_path, capsys, typed, message):
    assert main(["demo", "--task", "lista", "--out", str(tmp_path / "demo"), "--set", typed]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and not (tmp_path / "demo").exists()
    assert len(captured.err.splitlines()) == 1 and captured.err.startswith(f"layerdescent: error: --set {typed}: {message}"), captured.err


def test_a_demo_summary_is_titled_for_the_demo_a_finished_demo_says_so_and_report_leaves_its_summary_intact(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["demo", "--task", "lista", "--out", str(out), *LISTA_DEMO_SMALL]) == 0
    summary = (out / "summary.md").read_text()
    assert (
        summary.startswith("# Demo: ERM, deep supervision and primal-dual descent constraints on lista\n")
        and "Made by `layerdescent demo --task lista" in summary
    )
    capsys.readouterr()
    assert main(["demo", "--task", "lista", "--out", str(out), *LISTA_DEMO_SMALL]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first == f"layerdescent demo --task lista: all 3 runs in {out} are finished; writing their summary again"
    assert main(["report", str(out)]) == 0
    assert (out / "summary.md").read_text() == summary


def test_progress_lines_cover_the_evaluation_after_training(tmp_path, capsys):
    path = write(tmp_path, GOOD.replace("progress = false", "progress = true"))
    assert main(["run", str(path), "--out", str(tmp_path / "run")]) == 0
    lines = capsys.readouterr().err.splitlines()
    training = [line for line in lines if line.startswith("primal-dual seed 0: step")]
    evaluation = [line for line in lines if line.startswith("primal-dual seed 0 evaluation: batch")]
    assert training[-1].startswith("primal-dual seed 0: step 4/4,") and training[-1].endswith("left (evaluation included)"), training
    assert evaluation[0].startswith("primal-dual seed 0 evaluation: batch 0/2,") and evaluation[-1].startswith(
        "primal-dual seed 0 evaluation: batch 2/2,"
    ), lines


def test_the_interrupt_message_names_the_runs_out_and_the_resume_command(tmp_path, monkeypatch, capsys):
    from helpers import interrupt_at_step

    interrupt_at_step(monkeypatch, 4)  # after the checkpoint every 2 steps writes
    path = write(tmp_path, GOOD.replace("progress = false", "progress = false\ncheckpoint_every = 2"))
    assert main(["run", str(path), "--out", str(tmp_path / "my run")]) == 130
    err = capsys.readouterr().err
    assert f"`layerdescent run {path} --out '{tmp_path / 'my run'}' --resume` continues from the last checkpoint" in err, err


def test_an_interrupt_before_the_first_checkpoint_says_the_rerun_starts_over(tmp_path, monkeypatch, capsys):
    from helpers import interrupt_at_step

    interrupt_at_step(monkeypatch, 1)
    path = write(tmp_path, GOOD)
    assert main(["run", str(path), "--out", str(tmp_path / "run")]) == 130
    err = capsys.readouterr().err
    assert err.endswith(
        f"layerdescent: interrupted before the first checkpoint; `layerdescent run {path} --out {tmp_path / 'run'} --resume` starts over\n"
    ), err
    assert not (tmp_path / "run" / "checkpoint.pt").exists()


def test_bench_workers_sharing_a_terminal_print_progress_lines_not_bars_over_each_other(tmp_path):
    import pty
    import select

    path = write(
        tmp_path,
        GOOD.replace("progress = false", "progress = true")
        + '\n[bench]\n[bench.variants.erm]\nsolver.name = "erm"\n[bench.variants.primal-dual]\n',
        "bench.toml",
    )
    primary, secondary = pty.openpty()
    proc = subprocess.Popen(
        [*LAYERDESCENT, "bench", str(path), "--out", str(tmp_path / "out"), "--workers", "2"],
        stdin=secondary,
        stdout=secondary,
        stderr=secondary,
    )
    os.close(secondary)
    chunks = []
    while select.select([primary], [], [], 300)[0]:
        try:
            chunk = os.read(primary, 65536)
        except OSError:  # every writer closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(primary)
    assert proc.wait(timeout=60) == 0
    text = b"".join(chunks).decode(errors="replace").replace("\r\n", "\n")
    assert "erm seed 0: step" in text and "primal-dual seed 0: step" in text
    assert "\r" not in text  # nothing redrawn in place, so no bar overwrites another's line


def test_evaluate_with_workers_tests_runs_at_once_to_the_same_numbers(tmp_path, capsys):
    out = tmp_path / "bench"
    assert main(["bench", str(write(tmp_path, TWO_BY_TWO, "bench.toml")), "--out", str(out)]) == 0
    capsys.readouterr()
    one, two = tmp_path / "one", tmp_path / "two"
    assert main(["evaluate", str(out), "--out", str(one), "--set", "task.perturbation=impulse"]) == 0
    assert main(["evaluate", str(out), "--out", str(two), "--set", "task.perturbation=impulse", "--workers", "2"]) == 0
    assert capsys.readouterr().out.count(": evaluated") == 8  # four runs each way, each told as it ends
    for run in ("erm/seed-0", "erm/seed-1", "primal-dual/seed-0", "primal-dual/seed-1"):
        made, kept = (json.loads((root / run / "results.json").read_text()) for root in (two, one))
        assert made["gammas"] == kept["gammas"], run
    (two / "erm" / "seed-1" / "results.json").unlink()  # an interrupted pass continues where it stopped
    assert main(["evaluate", str(out), "--out", str(two), "--set", "task.perturbation=impulse", "--workers", "2"]) == 0
    told = capsys.readouterr().out
    assert told.count(": done") == 3 and f"{two / 'erm' / 'seed-1'}: evaluated" in told
    assert main(["evaluate", str(out), "--out", str(tmp_path / "e"), "--workers", "0"]) == 2
    assert "--workers must be at least 1, got 0" in capsys.readouterr().err


def _killed(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)  # as the out-of-memory killer or a user's kill -9 ends a worker


def test_evaluate_with_a_worker_killed_is_one_line_naming_the_rerun(tmp_path, capsys, monkeypatch):
    out = tmp_path / "bench"
    assert main(["bench", str(write(tmp_path, TWO_BY_TWO, "bench.toml")), "--out", str(out)]) == 0
    capsys.readouterr()
    monkeypatch.setattr("layerdescent.bench.evaluation.evaluate_run", _killed)  # the forked workers call it
    assert main(["evaluate", str(out), "--out", str(tmp_path / "e"), "--workers", "2"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("layerdescent: error: ") == 1, err
    assert "an evaluation worker stopped before its run was evaluated" in err and "the same command again evaluates the 4 left" in err


def test_evaluate_says_which_run_it_starts_and_shows_progress_through_its_evaluation(tmp_path, capsys):
    path = write(tmp_path, GOOD.replace("progress = false", "progress = true"))
    assert main(["run", str(path), "--out", str(tmp_path / "run")]) == 0
    capsys.readouterr()
    assert main(["evaluate", str(tmp_path / "run"), "--out", str(tmp_path / "again")]) == 0
    captured = capsys.readouterr()
    assert captured.out.splitlines()[:2] == [f"{tmp_path / 'again'}: evaluating", f"{tmp_path / 'again'}: evaluated"]
    assert any(line.startswith(f"{tmp_path / 'again'} evaluation: batch 2/2,") for line in captured.err.splitlines()), captured.err


class CommandsPlugin:
    """A plugin's commands: one that works, one that refuses its input, one that takes a built-in verb's name."""

    @ld.hookimpl
    def register_commands(self, register):
        register(ld.Command("hello", "say hello", lambda args: print(f"hello {args.who}") or 0, lambda p: p.add_argument("who")))
        register(ld.Command("refuse", "refuse", _refuse))
        register(ld.Command("run", "a second run", lambda args: 0))


def _refuse(args) -> int:
    raise ld.ConfigError("refuse takes nothing here; try hello")


def test_a_plugin_command_runs_its_errors_are_one_line_and_a_built_in_name_stays_built_in(monkeypatch, capsys, caplog):
    from layerdescent import cli, registry

    plugins = registry.Registry(extra_plugins=[("greetings", CommandsPlugin())])
    monkeypatch.setattr(cli, "get_registry", lambda: plugins)
    assert cli.main(["hello", "world"]) == 0 and capsys.readouterr().out == "hello world\n"
    assert cli.main(["refuse"]) == 2 and capsys.readouterr().err == "layerdescent: error: refuse takes nothing here; try hello\n"
    assert "plugin 'greetings' registers command 'run', which is built in; the built-in one is kept" in caplog.text
    assert plugins.owner[("Command", "compare")] == "layerdescent.cli.compare"  # compare takes the plugins' path


@pytest.fixture
def two_variants(tmp_path):
    """A bench folder of two variants over two seeds (results.json alone)."""
    from helpers import fake_results

    root = tmp_path / "b1"
    for label, solver in (("erm", "erm"), ("primal-dual", "primal-dual")):
        for seed in (0, 1):
            run = root / label / f"seed-{seed}"
            run.mkdir(parents=True)
            (run / "results.json").write_text(json.dumps(fake_results(label, solver, seed, 1.0 + seed, 2.0 - 0.1 * seed, 0.002)))
    return root


def _compare_out(root, out) -> tuple[int, str]:
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        status = main(["compare", str(root), "primal-dual", "erm", "--out", str(out)])
    return status, err.getvalue()


def test_compare_out_writes_a_new_file_and_replaces_its_own(two_variants, tmp_path):
    out = tmp_path / "new" / "folder" / "compare.md"  # a missing parent is made, as run --out makes its folder
    assert _compare_out(two_variants, out)[0] == 0
    first = out.read_text()
    assert first.startswith("# primal-dual − erm") and "Made by `layerdescent compare " in first
    assert _compare_out(two_variants, out)[0] == 0 and out.read_text() == first


def test_compare_out_over_its_page_the_user_edited_is_refused_in_one_line(two_variants, tmp_path):
    out = tmp_path / "compare.md"
    assert _compare_out(two_variants, out)[0] == 0
    edited = out.read_text().replace("\n## ", "\nMy reading: primal-dual wins.\n\n## ", 1)
    out.write_text(edited)  # still headed as layerdescent writes it
    status, err = _compare_out(two_variants, out)
    assert status == 2 and err.count("\n") == 1 and "was changed since" in err and "move it away" in err, err
    assert out.read_text() == edited


def _symlink(tmp_path, out):
    victim = tmp_path / "victim.md"
    victim.write_text("mine\n")
    out.symlink_to(victim)
    return victim


def _user_file(tmp_path, out):
    out.write_text("my notes\n")
    return out


def _fifo(tmp_path, out):
    os.mkfifo(out)
    return None


COMPARE_OUT_CASES = {
    "symlink": (_symlink, "is a symbolic link"),
    "users-file": (_user_file, "is a file layerdescent did not write"),
    "directory": (lambda tmp_path, out: out.mkdir() or None, "is a directory: --out a file in it"),
    "fifo": (_fifo, "is not a plain file"),
}


@pytest.mark.parametrize("make, message", COMPARE_OUT_CASES.values(), ids=COMPARE_OUT_CASES.keys())
def test_compare_out_refuses_what_run_out_refuses_in_one_line_and_touches_nothing(two_variants, tmp_path, make, message):
    out = tmp_path / "compare.md"
    kept = make(tmp_path, out)
    before = kept.read_text() if kept else None
    status, err = _compare_out(two_variants, out)
    assert status == 2 and err.count("layerdescent: error: ") == 1 and "Traceback" not in err and message in err, err
    if kept:
        assert kept.read_text() == before


def test_compare_out_onto_a_runs_results_json_is_refused_and_the_bench_still_reports(two_variants, capsys):
    results = two_variants / "erm" / "seed-0" / "results.json"
    before = results.read_text()
    status, err = _compare_out(two_variants, results)
    assert status == 2 and "is a file layerdescent did not write" in err
    assert results.read_text() == before
    assert main(["report", str(two_variants)]) == 0


def test_compare_out_over_a_file_that_cannot_be_replaced_is_one_line(two_variants, tmp_path, monkeypatch):
    out = tmp_path / "compare.md"
    assert _compare_out(two_variants, out)[0] == 0
    before = out.read_text()

    def immutable(src, dst):  # what chattr +i, or a folder made read-only, answers
        raise PermissionError(1, "Operation not permitted", str(dst))

    monkeypatch.setattr(os, "replace", immutable)
    status, err = _compare_out(two_variants, out)
    assert status == 2 and err.count("layerdescent: error: ") == 1 and "Traceback" not in err, err
    assert "cannot be written: Operation not permitted (nothing was written)" in err and out.read_text() == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".compare.md")] == []  # no temporary file left


def _edit_runs(root, label, change):
    for path in sorted((root / label).glob("seed-*/results.json")):
        path.write_text(json.dumps(change(json.loads(path.read_text()))))


def _deeper(data: dict) -> dict:
    for record in data["gammas"]:
        record["layer_loss"].append(record["layer_loss"][-1])
        record["descent_rate"].append(1.0)
    return {**data, "num_layers": data["num_layers"] + 1}


def test_compare_of_a_variant_with_itself_or_across_perturbations_is_one_line_and_depths_are_said(two_variants, capsys):
    assert main(["compare", str(two_variants), "erm", "erm"]) == 2
    assert "A and B are both 'erm': a variant minus itself is 0 everywhere" in capsys.readouterr().err
    _edit_runs(two_variants, "primal-dual", _deeper)
    assert main(["compare", str(two_variants), "primal-dual", "erm"]) == 0
    assert "**primal-dual has 3 layers, erm 2**: each is read at its own last layer." in capsys.readouterr().out
    _edit_runs(two_variants, "erm", lambda data: {**data, "perturbation": "impulse"})
    assert main(["compare", str(two_variants), "primal-dual", "erm"]) == 2
    assert "the same gamma is another noise in each, so their differences mean nothing" in capsys.readouterr().err


def test_config_defaults_for_an_empty_task_name_is_refused_not_read_as_lista(capsys):
    assert main(["config", "--defaults", "--task", ""]) == 2
    assert "unknown task ''" in capsys.readouterr().err


def test_compare_says_which_sign_of_a_difference_favours_a(two_variants, tmp_path):
    out = tmp_path / "compare.md"
    assert _compare_out(two_variants, out)[0] == 0
    text = out.read_text()
    assert "each cell is primal-dual − erm" in text
    assert "## mse: primal-dual − erm (lower is better: negative favours primal-dual)" in text


def test_compare_knows_the_direction_of_every_bundled_tasks_metric_as_its_torchmetrics_class_does():
    import types

    from layerdescent.analysis.compare import HIGHER_IS_BETTER
    from layerdescent.registry import get_registry

    directions = {}
    for task in get_registry().tasks.values():
        for is_lm in (False, True):  # the LLM task's metric depends on its readout
            stand_in = types.SimpleNamespace(num_labels=2, is_lm=is_lm)
            directions.update({name: metric.higher_is_better for name, metric in task.metrics(stand_in).items()})
    assert directions == HIGHER_IS_BETTER


def test_run_prints_the_test_loss_at_every_layer_and_where_it_rises(tmp_path, capsys):
    path = write(tmp_path, GOOD)
    assert main(["run", str(path), "--out", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    record = json.loads((tmp_path / "run" / "results.json").read_text())["gammas"][0]
    losses = record["layer_loss"]
    rises = [k for k in range(1, len(losses)) if losses[k] > losses[k - 1]]
    trend = "falls at every layer" if not rises else f"rises at layer{'s' * (len(rises) > 1)} {', '.join(map(str, rises))}"
    assert f"gamma=0  loss at layers 0..4: {' '.join(f'{v:.4g}' for v in losses)} ({trend})" in out, out
