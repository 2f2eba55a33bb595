"""The cross-bench claim table: each of the paper's claims decided by the declared endpoints of each bench's plan.

    layerdescent report --claims benchmarks/claims.toml               # writes benchmarks/REPORT.md
    layerdescent report --claims benchmarks/claims.toml --summaries   # and every bench's summary.md, endpoints.md and plots

The list file names the benches in the report's order; each bench's claims are the endpoints of its
plan that declare ``claim`` (:data:`~layerdescent.analysis.endpoints.CLAIMS`): parity a
non-inferiority or equivalence test within its margin, degradation a superiority test (a curve
endpoint over a γ range), descent a test of rising transitions. A claim holds where every endpoint
declared for it is decided for the variant, partly where some are, does not where none is and one is
decided against it, and is not shown where no test decides. An endpoint declared after the runs (``after_runs = true``) makes its claim exploratory, and a parity
claim undecided: a margin chosen after the data is no test of parity.
"""

from __future__ import annotations

import dataclasses
import glob
import re
from collections import Counter
from pathlib import Path

from layerdescent.analysis.endpoints import CLAIMS, BenchSpec, Endpoint, decides_the_claim
from layerdescent.analysis.endpoints_file import parse_spec
from layerdescent.analysis.endpoints_page import PLAN_HEADER, plan_rows
from layerdescent.analysis.formatting import format_difference, markdown_table
from layerdescent.analysis.judging import judge
from layerdescent.analysis.registration import plan_status
from layerdescent.analysis.report import collect, write_report
from layerdescent.errors import ConfigError
from layerdescent.run import rundir
from layerdescent.run.config_file import read_toml
from layerdescent.run.files import write_atomic

PASSES = ("better", "non-inferior", "equivalent")  # the verdicts that decide a claim for the variant
AGAINST = ("worse", "inferior", "not equivalent")  # and those that decide it against
ENTRY_KEYS = {
    "title": "the bench's row in the claim table",
    "file": "its bench file, relative to the list file's folder",
    "runs": "the folder of its runs, relative to the list file's folder",
    "superseded_by": "the title of the bench that replaced it: listed under earlier benches, not judged",
    "command": "what made the runs where it was not `layerdescent bench FILE` (a re-evaluation: its summary only, no claims)",
    "flags": "what followed `layerdescent bench FILE --out RUNS` (the settings tuning adopted)",
    "workers": "runs trained at once, where no report of the bench remembers it",
    "judged": "false for a bench summarized but in no claim table",
}


@dataclasses.dataclass(frozen=True)
class Entry:
    """One bench the list file names: its row title, bench file and runs, and how its runs were made."""

    title: str
    file: str
    runs: str
    superseded_by: str = ""
    command: str = ""
    flags: str = ""
    workers: int | None = None
    judged: bool = True


def read_list(path: Path) -> tuple[list[Entry], list[str]]:
    """The benches of a list file, checked, and the pages whose linked plots the record keeps (``pages``, globs)."""
    table = read_toml(path)
    unknown = set(table) - {"bench", "pages"}
    if unknown:
        raise ConfigError(f"{path}: unknown key {sorted(unknown)[0]!r} (allowed: bench, pages)")
    benches, pages = table.get("bench"), table.get("pages", [])
    if not isinstance(benches, list) or not benches or not all(isinstance(b, dict) for b in benches):
        raise ConfigError(
            f'{path}: list the benches as [[bench]] tables, e.g. title = "lista", file = "lista.toml", runs = "results/lista"'
        )
    if not isinstance(pages, list) or not all(isinstance(p, str) for p in pages):
        raise ConfigError(f'{path}: pages must list page paths or globs, e.g. pages = ["../README.md", "../docs/*.md"]')
    entries = []
    for i, b in enumerate(benches):
        where = f"{path}: bench {i + 1}"
        unknown = set(b) - set(ENTRY_KEYS)
        if unknown or not all(k in b for k in ("title", "file", "runs")):
            missing = sorted(unknown) or [k for k in ("title", "file", "runs") if k not in b]
            raise ConfigError(
                f"{where}: {'unknown' if unknown else 'missing'} key {missing[0]!r} ({'; '.join(f'{k}: {v}' for k, v in ENTRY_KEYS.items())})"
            )
        wrong = next((k for k, v in b.items() if not isinstance(v, int if k == "workers" else bool if k == "judged" else str)), None)
        if wrong is not None:
            raise ConfigError(f"{where}: {wrong} = {b[wrong]!r} has the wrong type ({ENTRY_KEYS[wrong]})")
        entries.append(Entry(**b))
    return entries, pages


def run_command(entry: Entry, folder: str) -> str:
    """What made the entry's runs, as the report and its summary quote it."""
    made = f"layerdescent bench {folder}/{entry.file} --out {folder}/{entry.runs}"
    return entry.command or " ".join(filter(None, [made, entry.flags]))


def spec_of(root: Path, entry: Entry) -> BenchSpec:
    """The entry's judging keys; a re-evaluation's none of its bench file's endpoints or tuning (they are the original runs')."""
    path = root / entry.file
    spec = parse_spec(read_toml(path).get("bench", {})) if path.exists() else BenchSpec()
    return dataclasses.replace(spec, primary=None, plan=(), searches={}, choices=()) if entry.command else spec


def has_runs(folder: Path) -> bool:
    """Whether ``folder`` holds finished runs (a results.json under it)."""
    return folder.is_dir() and bool(rundir.result_files(folder))


def claim_verdicts(cells: list[dict], endpoints: list[Endpoint]) -> dict[str, str]:
    """Claim -> its cell of the table: the verdict, then one endpoint's difference or how many of the endpoints passed."""
    out = {}
    for claim in CLAIMS:
        mine = [(c, e) for c, e in zip(cells, endpoints) if e.claim == claim]
        if not mine:
            out[claim] = "undecided (no margin declared)" if claim == "parity" else "no endpoint declared"
            continue
        run = [(c, e) for c, e in mine if c.get("verdict") not in (None, "missing")]
        if not run:
            out[claim] = "not run"
            continue
        passed = [c["verdict"] in PASSES for c, _ in run]
        against = any(c["verdict"] in AGAINST for c, _ in run)
        verdict = "holds" if all(passed) else "partly holds" if any(passed) else "does not hold" if against else "not shown"
        if len(run) < len(mine):
            verdict += f" ({len(mine) - len(run)} of {len(mine)} not run)"
        number = _shown(*run[0]) if len(run) == 1 else f"{sum(passed)} of {len(run)} endpoints"
        if any(e.after_runs for _, e in mine):
            verdict = (
                f"undecided (margin declared after the runs); exploratory: {verdict}" if claim == "parity" else f"exploratory: {verdict}"
            )
        out[claim] = f"{verdict}: {number}"
    return out


def _shown(c: dict, e: Endpoint) -> str:
    """One judged endpoint as a claim cell: its verdict's difference and interval (Holm's level) against the deciding baseline, where."""
    d = {**c["simultaneous"], "distinct": c["verdict"] in PASSES + AGAINST}
    margin = f", margin {c['margin']:.3g}" if e.kind in ("non-inferiority", "equivalence") else ""
    reads = "rising transitions" if e.statistic == "rising" else e.metric
    where = e.at if e.aggregate else f"at γ {e.at}"
    return f"{c['verdict']}, {reads} {format_difference(d)}{margin} vs {c.get('decided_by', c['baseline'])}, {where} on {e.on}"


def judge_entry(root: Path, entry: Entry) -> tuple[str, dict[str, str], list[str]] | None:
    """A bench's row (its kind, each claim's cell) and section; None where it has no runs yet."""
    folder = root / entry.runs
    if not has_runs(folder):
        return None
    results = collect(folder)
    spec = spec_of(root, entry)
    # every endpoint judged, so each claim's cell is adjusted over its whole family, not over the claims in it
    judged = list(zip(judge(results, spec, spec.endpoints()), spec.endpoints()))
    cells, endpoints = [c for c, e in judged if e.claim], [e for _, e in judged if e.claim]
    status = plan_status(folder, results, spec)
    changed = status is not None and bool(status.changed)
    kind = (
        "no claim declared"
        if not endpoints
        else "exploratory (plan changed)"
        if changed
        else "exploratory (declared after the runs)"
        if any(e.after_runs for e in endpoints)
        else "pre-registered"
    )
    verdicts = claim_verdicts(cells, endpoints)
    if changed:
        verdicts = {
            claim: text if text.startswith(("exploratory", "undecided")) else f"exploratory: {text}" for claim, text in verdicts.items()
        }
    rows = [
        [*row, e.claim, "after the runs" if e.after_runs else "before the runs"] for row, e in zip(plan_rows(cells, endpoints), endpoints)
    ]
    section = [
        f"## {entry.title}",
        "",
        f"Runs: `{run_command(entry, root.name)}` ([summary]({entry.runs}/summary.md)"
        + (f", [every endpoint]({entry.runs}/endpoints.md)" if (folder / "endpoints.md").exists() else "")
        + "). "
        + (status.line() if status is not None else "No plan is recorded with these runs: the bench file's history is its record."),
        "",
        *_family_line([(c, e) for c, e in judged if decides_the_claim(e.family) and e.tested], entry.runs),
        *(markdown_table([*PLAN_HEADER, "claim", "declared"], rows) if rows else ["Its plan declares no claim endpoint.", ""]),
        *[f"![{Path(f).stem}]({entry.runs}/{f})" for f in figures(folder)],
        "",
    ]
    return kind, verdicts, section


def _family_line(primary: list[tuple[dict, Endpoint]], runs: str) -> list[str]:
    """A bench's pre-registered family in one line (its verdicts counted), where it declares one: it stands whatever the claims say."""
    if not primary:
        return []
    counts = Counter(c.get("verdict", "missing") for c, _ in primary)
    said = ", ".join(f"{n} {verdict}" for verdict, n in sorted(counts.items()))
    return [
        f"Its pre-registered family (`primary`, Holm over its {len(primary)} endpoints; each in [endpoints.md]({runs}/endpoints.md)): {said}.",
        "",
    ]


def figures(folder: Path) -> list[str]:
    """The figures a bench's section shows: the paper-layout ones (benchmarks/figures.py) with the loss and trade-off plots, else the report's."""
    paper = sorted(f.name for f in folder.glob("figure[0-9]*.png"))
    rest = (
        ("loss_vs_layer.png", "tradeoff.png")
        if paper
        else ("metric_vs_gamma.png", "loss_vs_layer.png", "ablation_layers.png", "tradeoff.png")
    )
    return paper + [f for f in rest if (folder / f).exists()]


def report_text(root: Path, entries: list[Entry], command: str) -> str:
    """REPORT.md for the listed benches (their paths relative to ``root``): the claim table, a section per bench, the earlier benches."""
    rows, sections, earlier, again = [], [], [], []
    for entry in (e for e in entries if e.judged):
        if entry.superseded_by:
            earlier.append(f"| {entry.title} | {entry.superseded_by} | [summary]({entry.runs}/summary.md) |")
            continue
        if entry.command:
            again += [f"### {entry.title}", "", f"Runs: `{entry.command}` ([summary]({entry.runs}/summary.md)).", ""]
            again += [*(f"![{Path(f).stem}]({entry.runs}/{f})" for f in figures(root / entry.runs)), ""]
            continue
        judged = judge_entry(root, entry)
        if judged is None:
            rows.append(f"| {entry.title} | not run | " + " | ".join(["not run"] * len(CLAIMS)) + " |")
            continue
        kind, verdicts, section = judged
        rows.append(f"| {entry.title} | {kind} | " + " | ".join(verdicts[c] for c in CLAIMS) + " |")
        sections += section
    lines = [
        "# Reproduction report",
        "",
        'What this project measured for each claim of "A Constrained Optimization Perspective of Unrolled Transformers" (arXiv 2601.17257), '
        f"from the committed runs only; made by `{command}`. Each claim of a bench is an endpoint its plan declares (`claim`), decided "
        "by the test that claim is: descent by each seed's count of rising transitions of the per-layer test loss, degradation by a "
        "superiority test over a γ range, parity by a non-inferiority test within a margin. A claim holds where every endpoint declared "
        "for it is decided for the constrained variant against the strongest named baseline (Holm within each family, each interval at "
        "the level Holm tested its cell at; **bold** decided). An endpoint declared after its runs is exploratory, and parity is "
        "undecided unless its margin was registered before the runs. Each section lists its endpoints; the summary has everything else.",
        "",
        "| task | family | " + " | ".join(CLAIMS) + " |",
        "|---|---|" + "---|" * len(CLAIMS),
        *rows,
        "",
        *sections,
    ]
    if again:
        lines += [
            "## Re-evaluations",
            "",
            "The same models under another perturbation: exploratory, in their summaries, judged by no claim.",
            "",
            *again,
        ]
    if earlier:
        lines += [
            "## Earlier benches",
            "",
            "Superseded by a bench that measures the same claim better; not judged here (their summaries stay).",
            "",
        ]
        lines += ["| bench | superseded by | runs |", "|---|---|---|", *earlier, ""]
    return "\n".join(lines)


def kept_plots(root: Path, pages: list[str], out: Path) -> set[Path]:
    """The plots the committed record keeps: those the report and the list's ``pages`` (globs under ``root``) link."""
    pages = [out, *(Path(p) for pattern in pages for p in sorted(glob.glob(str(root / pattern))))]
    return {
        (page.parent / png).resolve() for page in pages if page.exists() for png in re.findall(r"\]\(([^)\s]+\.png)\)", page.read_text())
    }


def write_summaries(list_path: Path, entries: list[Entry], kept: set[Path]) -> list[Path]:
    """Every bench's summary.md (with its endpoints.md and plots) by its bench file's judging keys, each showing the ``kept`` plots."""
    root = list_path.parent
    written = []
    for entry in entries:
        folder = root / entry.runs
        if not has_runs(folder):
            continue
        note = (
            f"Runs made by `{run_command(entry, root.name)}`; this summary by `layerdescent report --claims {list_path} --summaries` "
            f"(the judging keys of {root.name}/{entry.file})."
        )
        shown = {path.name for path in kept if path.parent == folder.resolve()}
        summary = write_report(
            folder, title=f"Bench {Path(entry.runs).name}", note=note, spec=spec_of(root, entry), workers=entry.workers, shown=shown
        )
        written.append(summary)
    return written


def write_claims(list_path: Path, out: Path | None, summaries: bool = False) -> list[Path]:
    """Write the claim table (``out``, default REPORT.md beside the list) and, with ``summaries``, every bench's summary first."""
    out = out or list_path.parent / "REPORT.md"
    entries, pages = read_list(list_path)
    written = write_summaries(list_path, entries, kept_plots(list_path.parent, pages, out)) if summaries else []
    command = " ".join(
        ["layerdescent report --claims", str(list_path), *(["--out", str(out)] if out != list_path.parent / "REPORT.md" else [])]
    )
    write_atomic(out, report_text(list_path.parent, entries, command))
    return [*written, out]
