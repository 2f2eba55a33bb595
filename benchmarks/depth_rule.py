"""The DEPTH RULE of video_depth_noisy.toml, read from its runs' validation losses (never test): the depth video_deep.toml trains at.

    python benchmarks/depth_rule.py benchmarks/results/video_depth_noisy --out benchmarks/results/video_depth_noisy/depth_rule.md

D is the shallowest depth in {8, 12, 16} at which primal-dual's last-layer validation loss at
the training noise (``train.best_val_loss[-1]``, the epoch early stopping kept) is below erm's,
with a paired 95% t interval over the seeds that excludes 0; if none qualifies, D = 12. Until
every candidate depth has finished, the rule is decided only when a finished depth qualifies
and every shallower candidate has finished and missed.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from layerdescent.analysis.report import collect
from layerdescent.analysis.stats import paired_difference, seed_stats

CANDIDATES, DEFAULT = (8, 12, 16), 12
SHOWN = (4, *CANDIDATES)
SOLVERS = ("erm", "penalty", "primal-dual")


def last_layer_validation(results: list[dict]) -> dict[tuple[int, str], dict[int, float]]:
    """(depth, solver) -> {seed: last-layer validation loss}, from runs labelled depthD-SOLVER."""
    table: dict[tuple[int, str], dict[int, float]] = {}
    for r in results:
        depth, _, solver = r["label"].removeprefix("depth").partition("-")
        table.setdefault((int(depth), solver), {})[r["seed"]] = r["train"]["best_val_loss"][-1]
    return table


def qualifies(verdict: dict) -> bool:
    """Primal-dual below erm: the paired interval lies wholly under 0."""
    return verdict["distinct"] and verdict["high"] < 0


def decide(table: dict, seeds: int) -> tuple[int | None, dict[int, dict]]:
    """The rule's D (None while undecided) and primal-dual - erm at each depth where both have every seed."""
    verdicts = {}
    for depth in SHOWN:
        erm, pd = table.get((depth, "erm"), {}), table.get((depth, "primal-dual"), {})
        if len(erm) == len(pd) == seeds and erm.keys() == pd.keys():
            order = sorted(erm)
            verdicts[depth] = paired_difference([pd[s] for s in order], [erm[s] for s in order])
    for depth in CANDIDATES:
        if depth not in verdicts:
            return None, verdicts
        if qualifies(verdicts[depth]):
            return depth, verdicts
    return DEFAULT, verdicts


def markdown(table: dict, seeds: int, command: str) -> str:
    chosen, verdicts = decide(table, seeds)
    lines = [
        "# video_depth_noisy: the DEPTH RULE (validation only)",
        "",
        f"    {command}",
        "",
        f"Last-layer validation loss at gamma 0.13 (mean squared error, `train.best_val_loss[-1]`), mean ± std over {seeds} seeds; "
        "primal-dual − erm paired by seed, 95% t interval (**bold** excludes 0).",
        "",
        "| depth | erm | penalty | primal-dual | primal-dual − erm |",
        "|---:|---:|---:|---:|---:|",
    ]
    for depth in SHOWN:
        cells = []
        for solver in SOLVERS:
            values = table.get((depth, solver), {})
            if len(values) < seeds:
                cells.append(f"{len(values)} of {seeds} seeds")
                continue
            s = seed_stats(list(values.values()))
            cells.append(f"{float(s['mean']):.6f} ± {float(s['std']):.6f}")
        v = verdicts.get(depth)
        gap = "not finished" if v is None else f"{v['mean']:+.6f} [{v['low']:+.6f}, {v['high']:+.6f}]"
        if v is not None and v["distinct"]:
            gap = f"**{gap}**"
        lines.append(f"| {depth} | {' | '.join(cells)} | {gap} |")
    lines.append("")
    if chosen is None:
        missed = [d for d in CANDIDATES if d in verdicts]
        lines.append(
            "Undecided: "
            + (f"depth {', '.join(map(str, missed))} missed; " if missed else "")
            + "the next candidate depth has not finished."
        )
    elif chosen in verdicts and qualifies(verdicts[chosen]):
        lines.append(f"**D = {chosen}**: the shallowest candidate at which primal-dual's validation loss is below erm's.")
    else:
        lines.append(f"**D = {chosen}** (the default): no candidate depth qualified.")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path, help="the video_depth_noisy bench folder")
    parser.add_argument("--seeds", type=int, default=3, help="seeds a finished depth has (the bench's)")
    parser.add_argument("--out", type=Path, help="write the markdown here (printed otherwise)")
    args = parser.parse_args()
    command = f"python benchmarks/depth_rule.py {args.root}" + (f" --out {args.out}" if args.out else "")
    text = markdown(last_layer_validation(collect(args.root)), args.seeds, command)
    if args.out:
        args.out.write_text(text)
    print(text, end="")


if __name__ == "__main__":
    main()
