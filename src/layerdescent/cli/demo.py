"""`layerdescent demo`: the main job, a small bench of ERM, deep supervision and primal-dual with its table and plots."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from layerdescent import assets
from layerdescent.cli.bench import tell
from layerdescent.cli.run import overrides
from layerdescent.commands import Command
from layerdescent.errors import ConfigError
from layerdescent.registry import get_registry
from layerdescent.run.config_file import apply_overrides, read_toml

HERE = Path(__file__).resolve().parent  # the demos' bench files ship beside this module


@dataclass(frozen=True)
class Demo:
    """One `layerdescent demo --task` choice: its bench file, default folder, and what it does, said before it starts."""

    config: Path
    out: str
    what: str
    workers: int  # runs at once, one thread each (benchmarks/results/demo_time*.md)
    minutes_a_seed: float  # a quiet 2-CPU machine's minutes for one seed of every solver (benchmarks/results/demo_time*.md)


# Keyed by the task's real name; each demo has its own folder, so one never finishes in another's runs.
DEMOS = {
    "text-classification": Demo(
        HERE.joinpath("demo.toml"),
        "layerdescent-demo",
        "ERM, deep supervision (penalty) and primal-dual descent constraints each fine-tune MiniLM-L6 (22.7M parameters) "
        "for one epoch on 3,520 movie-review sentences (110 steps of 32), then test on 1,057 sentences at 4 "
        "embedding-noise levels; primal-dual is judged against the stronger of erm and penalty. "
        "About 5 minutes on a quiet 2-CPU machine (within 10), longer when other work shares the CPUs "
        "(progress lines say how long is left). "
        "A checkpoint every 40 steps: run the same command again to continue an interrupted demo",
        workers=3,
        minutes_a_seed=4.4,
    ),
    "lista": Demo(
        HERE.joinpath("demo-lista.toml"),
        "layerdescent-demo-lista",
        "ERM, deep supervision (penalty) and primal-dual each train unrolled ISTA (8 layers) on synthetic sparse codes, "
        "3 seeds, 20 epochs; primal-dual is judged against the stronger of erm and penalty; under a minute on 2 CPUs",
        workers=2,
        minutes_a_seed=0.3,
    ),
}
DEMO_ALIASES = {"text": "text-classification"}


def _demo_task(name: str) -> str:
    """A --task value as the task's real name (``text`` is short for ``text-classification``)."""
    name = DEMO_ALIASES.get(name, name)
    if name not in DEMOS:
        raise argparse.ArgumentTypeError(
            f"invalid choice: {name!r} (choose from {', '.join(DEMOS)}; text is short for text-classification)"
        )
    return name


def _fetch_required_assets(config: Path, overrides: Sequence[str]) -> None:
    """Fetch what the config's task reads and the cache lacks, before any timed work starts."""
    from layerdescent.bench.plan import blame
    from layerdescent.run.config import config_from_dict
    from layerdescent.run.guard import build_task

    registry = get_registry()
    data = apply_overrides(read_toml(config), list(overrides))
    data.pop("bench", None)
    try:  # the task's options checked as any run's, before the task reads them
        run = config_from_dict(data, registry)
    except ConfigError as exc:
        raise ConfigError(
            "\n".join(dict.fromkeys(blame(line, "the demo", list(overrides), set()) for line in str(exc).splitlines()))
        ) from None
    task = build_task(registry, run.task.name, run.task.options)
    for name in task.required_assets():
        asset = registry.asset(name)
        if not assets.is_fetched(asset):
            print(f"{name} is not in the cache: fetched once, before the demo starts, and not counted in its time", flush=True)
            assets.fetch(asset, say=lambda line: print(line, flush=True))


def run(args: argparse.Namespace) -> int:
    from layerdescent.bench.runner import run_bench

    demo = DEMOS[args.task]
    _fetch_required_assets(demo.config, args.set)
    out = Path(args.out or demo.out)
    workers = args.workers or demo.workers
    pace = f"{workers} runs at a time, one thread each" if workers > 1 else "one run at a time"

    def announce(pending: int, total: int) -> None:  # once the demo is known to be valid, so no opening line precedes an error
        if pending == 0:
            print(f"layerdescent demo --task {args.task}: all {total} runs in {out} are finished; writing their summary again", flush=True)
            return
        left = f" {pending} of its {total} runs are left to train." if pending < total else ""
        changed = f" As changed by {' '.join(f'--set {o}' for o in args.set)}." if args.set else ""  # the description is the demo file's
        print(f"layerdescent demo --task {args.task}: {demo.what}.{changed}{left} {pace.capitalize()}. Output: {out}", flush=True)

    command = " ".join(
        [
            "layerdescent demo --task",
            args.task,
            "--out",
            str(out),
            *(f"--set {o}" for o in args.set),
            *(["--workers", str(workers)] if workers != demo.workers else []),
        ]
    )
    summary = run_bench(
        demo.config,
        out,
        args.set,
        on_run=tell,
        command=command,
        workers=workers,
        title=f"Demo: ERM, deep supervision and primal-dual descent constraints on {args.task}",
        before=announce,
    )
    print(summary.read_text())
    print(f"plots and tables: {summary.parent}")
    seeds = len(apply_overrides(read_toml(demo.config), list(args.set))["bench"]["seeds"])
    if seeds < 2:
        print(why_undecided(demo, args.task))
    return 0


def why_undecided(demo: Demo, task: str) -> str:
    """Why a one-seed demo decides nothing, and what would, in plain words."""
    return (
        "Why no verdict: with one seed each solver trains once, and a paired test needs at least 2 seeds, so the table says "
        f"'undecided: one seed'. Each seed costs what this one did (about {demo.minutes_a_seed:g} minutes on a quiet 2-CPU machine, "
        f"benchmarks/results/demo_time.md), so 3 seeds take three times as long: layerdescent demo --task {task} --set 'bench.seeds=[0, 1, 2]'"
        + ("" if task == "lista" else "; layerdescent demo --task lista decides over 3 seeds in under a minute.")
    )


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--task",
        type=_demo_task,
        default="text-classification",
        metavar="{" + ",".join(DEMOS) + "}",
        help="text-classification (or text, the default): MiniLM on movie reviews, about 5 min on 2 CPUs; lista: synthetic sparse coding, <1 min",
    )
    parser.add_argument(
        "--out",
        help=f"output directory (default: {DEMOS['text-classification'].out} for text-classification, {DEMOS['lista'].out} for lista)",
    )
    overrides(parser, "override a value of the demo's bench file, e.g. train.epochs=2 or bench.seeds=[0]")
    parser.add_argument(
        "--workers",
        type=int,
        help="runs trained at once, one torch thread each (default: 3 for text-classification, the solvers together; 2 for lista)",
    )


COMMAND = Command("demo", "the main job: ERM, deep supervision and primal-dual, a table and plots", run, arguments, resumable=True)
