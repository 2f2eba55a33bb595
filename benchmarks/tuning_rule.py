"""The tuning rules of video_deep and video_levels, read from their tuning runs' validation losses (never test): the adopted settings.

    python benchmarks/tuning_rule.py benchmarks/results/video_deep --out benchmarks/results/video_deep/tuning_rule.md
    python benchmarks/tuning_rule.py benchmarks/results/video_levels --bench video_levels --out benchmarks/results/video_levels/tuning_rule.md

Per architecture (dust, l1l1), primal-dual at alpha in {0.05, 0.2} x reference in {detached,
anchored} and penalty at layer weights rho^(D-k), rho in {1, 0.9, 0.8, 0.7}, one tuning seed each.
The criterion is the lowest last-layer validation loss at the training noise
(``train.best_val_loss[-1]``). A primal-dual setting qualifies only if some multiplier binds at
the end (lambda > 0); a run that failed (diverged) qualifies for nothing. Ties within 1e-6 go to
the smaller alpha, the detached reference, the larger rho. A family is decided once each of its
runs has finished or failed.

lista_band2's rule is declared in its bench file ([bench.tuning.*]) and applied by `layerdescent bench`
(benchmarks/results/lista_band2/tuning.json). The two rules here wait for what the declaration cannot
yet say: video_deep's criterion is ``train.best_val_loss`` and its trials are named by bare values;
video_levels' pooled form takes the per-level form's adopted setting.

video_levels (its header pre-registers the rule): per architecture (dust, transformer), levels at
alpha in {0.05, 0.2} x dual_lr in {0.5, 5, 50} and penalty over six weight families; the criterion
is the validation RMSE at gamma 0.26, the band's top (``gammas[-1].metrics.rmse``); ties within 1e-9 go to
the smaller alpha, then the smaller dual_lr, and for penalty to the family listed first.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from layerdescent.run import rundir

ARCHS = ("dust", "l1l1")
ALPHAS, REFERENCES, RHOS = (0.05, 0.2), ("detached", "anchored"), (1, 0.9, 0.8, 0.7)
TIE = 1e-6


LEVELS_TIE = 1e-9


LEVELS_ARCHS, LEVELS_LRS = ("dust", "transformer"), (0.5, 5, 50)
LEVELS_FAMILIES = ("uniform", "linear", "sum", "sqrt", "geometric,rho=0.9", "geometric,rho=0.7")


def video_levels_settings(arch: str) -> dict[str, list[str]]:
    """video_levels' tuning labels for ``arch`` per tuned form, in the rule's tie order (the preferred first)."""
    return {
        "levels": [f"tune-{arch}-levels,alpha={a},dual_lr={lr}" for a in ALPHAS for lr in LEVELS_LRS],
        "penalty": [f"tune-{arch}-penalty,weights={family}" for family in LEVELS_FAMILIES],
    }


def video_levels_rmse(results: dict) -> float:
    """video_levels' criterion: the validation RMSE at the band's top level, gamma 0.26."""
    top = results["gammas"][-1]
    assert top["gamma"] == 0.26, top["gamma"]
    return top["metrics"]["rmse"]


def settings(arch: str) -> dict[str, list[str]]:
    """Each solver's tuning labels for ``arch``, in the rule's tie order (the preferred first)."""
    return {
        "primal-dual": [f"tune-{arch}-primal-dual,alpha={a},{r}" for a in ALPHAS for r in REFERENCES],
        "penalty": [f"tune-{arch}-penalty,rho={rho}" for rho in RHOS],
    }


def best_val_loss(results: dict) -> float:
    """video_deep's criterion: the last layer's best validation loss during training, at the training noise."""
    return results["train"]["best_val_loss"][-1]


def read_run(run_dir: Path, loss=best_val_loss) -> dict:
    """One tuning run: its criterion (``loss`` of its results) and binding multipliers, or how it ended without results."""
    results = run_dir / "results.json"
    if results.exists():
        r = json.loads(results.read_text())
        lambdas = [x for c in r.get("constraints", {}).values() for x in c["lambda"]]
        return {"state": "done", "loss": loss(r), "bound": sum(x > 0 for x in lambdas), "entries": len(lambdas)}
    failed = rundir.failure(run_dir)
    if failed:
        error = str(failed.get("error", "")).split(";")[0]  # the error's first clause, without its advice
        return {"state": "failed", "why": f"failed at step {failed.get('step')}: {error}"}
    record = rundir.last_record(run_dir)
    return {"state": "unfinished", "why": f"unfinished (step {record['step']})" if record else "not started"}


def decide(runs: dict[str, dict], solver: str, tie: float = TIE) -> tuple[str | None, str]:
    """The adopted label among ``runs`` (given in tie order), or None and why none is yet; a constrained form needs a binding multiplier."""
    waiting = [label for label, run in runs.items() if run["state"] == "unfinished"]
    if waiting:
        return None, f"undecided: {len(waiting)} of {len(runs)} runs unfinished"
    qualified = [label for label, run in runs.items() if run["state"] == "done" and (solver == "penalty" or run["bound"] > 0)]
    if not qualified:
        return None, "no setting qualifies"
    best = min(runs[label]["loss"] for label in qualified)
    return next(label for label in qualified if runs[label]["loss"] <= best + tie), ""


def qualifies(run: dict, solver: str) -> str:
    """The table's verdict on one run."""
    if run["state"] == "unfinished":
        return ""
    if run["state"] == "failed":
        return "no: failed"
    return "no: no multiplier binds" if solver != "penalty" and run["bound"] == 0 else "yes"


def decided(root: Path, forms: dict[str, list[str]], loss, tie: float, number: str, prefix: str) -> list[str]:
    """A table row per tuning run of ``forms`` (each form's labels in tie order), then each form's adopted setting."""
    rows, adopted = [], {}
    for solver, labels in forms.items():
        runs = {label: read_run(root / label / "seed-100", loss) for label in labels}
        for label, run in runs.items():
            shown = format(run["loss"], number) if run["state"] == "done" else run["why"]
            binds = f"{run['bound']} of {run['entries']}" if run["state"] == "done" and solver != "penalty" else ""
            rows.append(f"| {label} | {shown} | {binds} | {qualifies(run, solver)} |")
        adopted[solver] = decide(runs, solver, tie)
    return [
        *rows,
        "",
        *(f"- {solver}: " + (f"**{label.removeprefix(prefix)}**" if label else why) for solver, (label, why) in adopted.items()),
    ]


def heading(bench: str, command: str, criterion: str) -> list[str]:
    """The lines that open a bench's tuning table: its title, the command that made it, and what its criterion reads."""
    return [
        f"# {bench}: the tuning rule (validation only)",
        "",
        f"    {command}",
        "",
        f"{criterion}, tuning seed 100; multipliers that bind at the end (lambda > 0) of the entries.",
        "",
    ]


def columns(criterion: str) -> list[str]:
    """A tuning table's header row, its criterion named in the second column."""
    return [f"| setting | {criterion} | multipliers binding | qualifies |", "|---|---:|---:|---|"]


def markdown(root: Path, command: str) -> str:
    lines = heading("video_deep", command, "Last-layer validation loss at gamma 0.13 (`train.best_val_loss[-1]`)")
    for arch in ARCHS:
        lines += [f"## {arch}", "", *columns("last-layer validation loss")]
        lines += [*decided(root, settings(arch), best_val_loss, TIE, ".6f", f"tune-{arch}-"), ""]
    return "\n".join(lines)


def video_levels_markdown(root: Path, command: str) -> str:
    """video_levels' tuning table and adopted settings, per architecture."""
    lines = heading("video_levels", command, "Validation RMSE at gamma 0.26, the band's top (`gammas[-1].metrics.rmse`)")
    for arch in LEVELS_ARCHS:
        lines += [f"## {arch}", "", *columns("validation RMSE at gamma 0.26")]
        lines += [*decided(root, video_levels_settings(arch), video_levels_rmse, LEVELS_TIE, ".6g", f"tune-{arch}-"), ""]
    return "\n".join(lines)


MARKDOWN = {"video_deep": markdown, "video_levels": video_levels_markdown}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path, help="the bench folder")
    parser.add_argument("--bench", choices=tuple(MARKDOWN), default="video_deep", help="whose rule (default video_deep)")
    parser.add_argument("--out", type=Path, help="write the markdown here (printed otherwise)")
    args = parser.parse_args()
    bench = f" --bench {args.bench}" if args.bench != "video_deep" else ""
    command = f"python benchmarks/tuning_rule.py {args.root}{bench}" + (f" --out {args.out}" if args.out else "")
    text = MARKDOWN[args.bench](args.root, command)
    if args.out:
        args.out.write_text(text)
    print(text, end="")


if __name__ == "__main__":
    main()
