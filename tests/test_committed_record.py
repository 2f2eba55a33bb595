"""The committed record stays small (plots only where the docs link them, each small; logs compressed; results under 50 MB), whole (a page shows only committed plots) and current (the step path)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PLOT_LIMIT = 150_000  # bytes a committed plot may take
RESULTS_LIMIT = 50_000_000  # bytes the committed benchmarks/results may take


def tracked(*patterns: str) -> list[str]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("the committed record is read from git: this is not a git checkout")
    out = subprocess.run(["git", "ls-files", "-z", "--", *patterns], cwd=ROOT, capture_output=True, check=True).stdout
    return [name for name in out.decode().split("\0") if name]


def linked_plots() -> set[str]:
    """The PNGs under benchmarks/results that the README, REPORT.md or a docs page links, as repository paths."""
    pages = [ROOT / "README.md", ROOT / "benchmarks" / "REPORT.md", *sorted((ROOT / "docs").glob("*.md"))]
    found = set()
    for page in pages:
        for target in re.findall(r"\]\(([^)\s]+\.png)\)", page.read_text()):
            path = (page.parent / target).resolve()
            if path.is_relative_to(ROOT / "benchmarks" / "results"):
                found.add(path.relative_to(ROOT).as_posix())
    return found


def test_every_committed_plot_is_one_the_docs_link_and_is_small():
    plots = set(tracked("benchmarks/results/**.png"))
    linked = linked_plots()
    assert plots - linked == set(), "committed plots no page links: git rm --cached them"
    assert linked - plots == set(), "pages link plots that are not committed: git add -f them"
    big = {name: (ROOT / name).stat().st_size for name in plots if (ROOT / name).stat().st_size > PLOT_LIMIT}
    assert not big, f"plots over {PLOT_LIMIT} bytes: {big}"


def test_committed_logs_are_compressed_and_the_results_stay_under_50_mb():
    files = tracked("benchmarks/results")
    assert not [f for f in files if f.endswith("metrics.jsonl")], "commit a run's log as metrics.jsonl.gz (gzip -n -9)"
    assert sum((ROOT / f).stat().st_size for f in files) <= RESULTS_LIMIT


def test_the_committed_step_path_is_the_path_the_code_takes_and_adds_no_return():
    import sys

    walked = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "step_path.py")], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    committed = (ROOT / "benchmarks" / "results" / "lista" / "step_path.md").read_text().splitlines()
    bounds = {"primal-dual, without the task's forward pass:": 21, "primal-dual, without the task's forward pass or Cooper:": 10}
    counts = {}
    for title in bounds:
        line = next(text for text in walked if text.startswith(title))
        assert line in committed, (
            f"benchmarks/results/lista/step_path.md is stale (the code walks {line!r}): python benchmarks/step_path.py --all --show"
        )
        counts[title] = int(re.search(r"(\d+) returns", line).group(1))
    # issue 49 set 8; issue 62 routed the trainer through the front and both Lagrangians through Cooper, which made 25, then 23 and 21,
    # 10 in the project's own files (step_path.md says which hops): a change that adds a hop beyond them fails here
    assert all(counts[title] <= bound for title, bound in bounds.items()), counts


def test_the_step_walk_places_each_frame_in_its_file_and_counts_each_reentry_as_a_return(capsys):
    import importlib.util

    import torch

    import layerdescent as ld

    spec = importlib.util.spec_from_file_location("step_path", ROOT / "benchmarks" / "step_path.py")
    walk = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(walk)
    core = Path(ld.__file__).resolve().parent
    assert walk.place(str(core / "core" / "problem.py")) == "core/problem.py"
    assert walk.place("/venv/lib/python3.11/site-packages/cooper/cmp.py") == "cooper"
    assert walk.place(torch.__file__) is None  # torch is transparent
    # counted by hand: a, b and cooper visited; a entered again twice
    walk.report("hand", ["a", "b", "a", "cooper", "a"], show=False)
    assert capsys.readouterr().out.startswith("hand: 3 files, 5 segments, 2 returns")
    assert walk.collapsed(["a", "a", "b", "b", "a"]) == ["a", "b", "a"]
    # a real call: the problem asks the spec for its violation and takes it back
    problem = ld.LayerwiseProblem((ld.Descent(),), num_layers=2)
    means = torch.tensor([3.0, 2.0, 1.0])
    problem.violations(means)  # the first call fixes the anchors
    assert walk.trace(lambda: problem.violations(means)) == ["core/problem.py", "core/constraints.py", "core/problem.py"]


def test_every_plot_a_committed_page_shows_is_committed():
    committed = set(tracked("benchmarks/results/**.png"))
    for page in tracked("README.md", "benchmarks/**.md", "docs/**.md"):
        for target in re.findall(r"\]\(([^)\s]+\.png)\)", (ROOT / page).read_text()):
            shown = ((ROOT / page).parent / target).resolve().relative_to(ROOT).as_posix()
            assert shown in committed, (
                f"{page} shows {target}, which is not committed: layerdescent report --claims benchmarks/claims.toml --summaries names it instead"
            )
