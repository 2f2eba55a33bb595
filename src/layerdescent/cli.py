"""The ``layerdescent`` command line: list, plugins, config, run, bench, evaluate, report, compare, assets, demo."""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Only light modules at the top: `--help`, `--version`, `list` and `plugins` must not import torch
# (the commands that train import it where they need it).
from layerdescent import __version__, assets
from layerdescent.config import apply_overrides, load_config, read_toml
from layerdescent.errors import ConfigError, LayerdescentError
from layerdescent.registry import get_registry


@dataclass(frozen=True)
class Demo:
    """One `layerdescent demo --task` choice: its bench file, default folder, and what it does, said before it starts."""

    config: Path
    out: str
    what: str
    workers: int  # runs at once, one thread each: both text solvers together; lista's small runs gain nothing from it


# Keyed by the task's real name; each demo has its own folder, so one never finishes in another's runs.
DEMOS = {
    "text-classification": Demo(
        Path(__file__).with_name("demo.toml"),
        "layerdescent-demo",
        "ERM and primal-dual descent constraints each fine-tune MiniLM-L6 (22.7M parameters) for one epoch on 5,600 "
        "movie-review sentences (175 steps of 32), then test on 1,057 sentences at 4 "
        "embedding-noise levels; aimed at 10 minutes on a quiet 2-CPU machine, longer when other work shares the CPUs "
        "(progress lines say how long is left). "
        "A checkpoint every 40 steps: run the same command again to continue an interrupted demo",
        workers=2,
    ),
    "lista": Demo(
        Path(__file__).with_name("demo-lista.toml"),
        "layerdescent-demo-lista",
        "ERM and primal-dual each train unrolled ISTA (8 layers) on synthetic sparse codes, 2 seeds, 20 epochs; under a minute on 2 CPUs",
        workers=1,
    ),
}
DEMO_ALIASES = {"text": "text-classification"}
TRAINING = ("run", "bench", "demo", "evaluate")  # the commands an interrupt leaves something to continue


def _demo_task(name: str) -> str:
    """A --task value as the task's real name (``text`` is short for ``text-classification``)."""
    name = DEMO_ALIASES.get(name, name)
    if name not in DEMOS:
        raise argparse.ArgumentTypeError(
            f"invalid choice: {name!r} (choose from {', '.join(DEMOS)}; text is short for text-classification)"
        )
    return name


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage mistake as one line, exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _summary_line(gamma_record: dict[str, Any]) -> str:
    metrics = " ".join(f"{k}={v:.4g}" for k, v in gamma_record["metrics"].items())
    return f"gamma={gamma_record['gamma']:g}  last-layer loss={gamma_record['layer_loss'][-1]:.4g}  {metrics}"


def cmd_list(args: argparse.Namespace) -> int:
    registry = get_registry()
    sections = (
        ("tasks", registry.tasks, "Task"),
        ("constraint kinds", registry.constraints, "ConstraintSpec"),
        ("solvers", registry.solvers, "Solver"),
        ("executors (bench --executor)", registry.executors, "Executor"),
        ("trackers (train.trackers)", registry.trackers, "Tracker"),
    )
    for title, table, base in sections:
        print(f"{title}:")
        for name, cls in sorted(table.items()):
            doc = (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else ""
            print(f"  {name:24} {doc}  [plugin {registry.owner[(base, name)]}]")
            for option in dataclasses.fields(cls.Options) if base == "Solver" else ():
                print(f"    {option.name} = {_option_default(option)}")
    return 0


def _option_default(option: dataclasses.Field) -> str:
    """A solver option's default as TOML would write it."""
    value = option.default
    if value is None:
        return "(unset)"
    return json.dumps(value) if isinstance(value, (str, bool)) else repr(value)


def cmd_plugins(args: argparse.Namespace) -> int:
    rows = list(get_registry().plugins.values())
    if args.json:
        print(json.dumps([vars(r) for r in rows], indent=2))
        return 0
    for info in rows:
        origin = f"{info.distribution} {info.version}".strip() or "-"
        reason = f"  ({info.reason})" if info.reason else ""
        print(f"{info.name:28} {info.status:8} {origin}{reason}")
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    from layerdescent.config_keys import DEFAULT_TASK, defaults_toml, reference_markdown

    if args.reference:
        if args.task or args.solver:
            raise ConfigError("--reference covers every task and solver; --task and --solver go with --defaults")
        print(reference_markdown(), end="")
    else:
        print(defaults_toml(args.task or DEFAULT_TASK, args.solver or "primal-dual"), end="")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    config = load_config(args.config, args.set, bench=False)
    out = Path(args.out) if args.out else Path("runs") / (Path(args.config).stem + (f"-{config.label}" if config.label else ""))
    args.again = " ".join(
        [
            "`layerdescent run",
            shlex.quote(str(args.config)),
            "--out",
            shlex.quote(str(out)),
            *(f"--set {shlex.quote(o)}" for o in args.set),
            "--resume`",
        ]
    )
    from layerdescent.trainer import train

    results = train(config, out, resume=args.resume)
    print(f"run {config.name} finished: {out}")
    for record in results["gammas"]:
        print("  " + _summary_line(record))
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from layerdescent.bench import STATES, bench_status, executor_options, run_bench, time_left
    from layerdescent.progress import clock

    out = Path(args.out) if args.out else Path("runs") / f"bench-{Path(args.config).stem}"
    if args.status:
        runs = bench_status(args.config, out, args.set, args.only)
        for run, state, details in runs:
            print(f"{run.variant} seed {run.seed}: {state}" + (f" ({details})" if details else ""))
        counts = [state for _, state, _ in runs]
        print(
            f"{len(runs)} run{'s' * (len(runs) != 1)} in {out}: "
            + ", ".join(f"{counts.count(state)} {state}" for state in STATES if state != "conflict" or state in counts)
        )
        left = time_left(runs)
        if left and left[0] >= 1:  # under a second (a tiny model) is no estimate worth a line
            seconds, at_once, read = left
            print(
                f"about {clock(seconds)} of training left at {at_once} run{'s' * (at_once != 1)} at a time "
                f"(from the step times of {read} finished run{'s' * (read != 1)}; evaluations not counted)"
            )
        return 0
    workers = 1 if args.workers is None and args.executor == "local" else args.workers
    given = {
        "workers": workers,
        "ray_address": args.ray_address,
        "cpus_per_run": args.cpus_per_run,
        "gpus_per_run": args.gpus_per_run,
        "partition": args.partition,
        "time": args.time,
        "mem_gb": args.mem_gb,
        **({"wait": False} if args.no_wait else {}),
    }
    remote = {
        "--ray-address": args.ray_address,
        "--cpus-per-run": args.cpus_per_run,
        "--gpus-per-run": args.gpus_per_run,
        "--partition": args.partition,
        "--time": args.time,
        "--mem-gb": args.mem_gb,
    }
    for flag, value in remote.items():
        # the per-run resources mean something to every executor but local, whose runs take one thread each
        wanted = (
            ["ray"]
            if flag == "--ray-address"
            else ["slurm"]
            if flag in ("--partition", "--time", "--mem-gb")
            else sorted(set(get_registry().executors) - {"local"})
        )
        if value is not None and args.executor not in wanted:
            raise ConfigError(f"{flag} needs --executor {' or '.join(wanted)}")
    executor = executor_options(args.config, args.set, args.executor, **given)
    flags = [
        *(["--workers", str(workers)] if workers not in (1, None) else []),
        *(["--executor", args.executor] if args.executor != "local" else []),
    ]
    command = " ".join(
        [
            "layerdescent bench",
            str(args.config),
            "--out",
            str(out),
            *(f"--set {o}" for o in args.set),
            *(f"--only '{o}'" for o in args.only),
            *flags,
        ]
    )
    summary = run_bench(
        args.config,
        out,
        args.set,
        on_run=_status,
        workers=workers or 1,
        command=command,
        executor=executor,
        only=args.only,
        skip_failed=args.skip_failed,
    )
    if summary is None:
        print(
            f"submitted; `{command}` again waits for the jobs and writes the summary (`layerdescent report {out}` summarizes what finished)"
        )
    else:
        print(f"summary: {summary}")
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    from layerdescent.bench import evaluate_bench

    if Path(args.out).exists() and not Path(args.out).is_dir():
        raise ConfigError(f"--out {args.out} is a file, not a directory: name a directory for the new results")
    summary = evaluate_bench(
        args.runs, args.out, args.set, on_run=lambda target, status: print(f"{target}: {status}", flush=True), workers=args.workers
    )
    print(f"summary: {summary}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from layerdescent.endpoints import read_spec
    from layerdescent.report import write_report

    summary = write_report(Path(args.run_dir), Path(args.out) if args.out else None, spec=read_spec(args.bench) if args.bench else None)
    print(summary.read_text() if args.print else f"summary: {summary}")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    import shlex

    from layerdescent.compare import compare_markdown
    from layerdescent.report import collect

    command = "layerdescent compare " + shlex.join([args.runs, args.a, args.b, *(["--out", args.out] if args.out else [])])
    text = compare_markdown(collect(Path(args.runs)), args.a, args.b, command)
    if args.out:
        Path(args.out).write_text(text)
        print(f"wrote {args.out}")
    else:
        print(text)
    return 0


def cmd_assets(args: argparse.Namespace) -> int:
    registry = get_registry()
    if not registry.assets and not args.name:
        print("no plugin declares assets")
        return 0
    if args.action == "list":
        for asset in registry.assets.values():
            row = assets.describe(asset)
            print(f"{row['name']:16} {'fetched' if row['fetched'] else 'missing':8} {row['requirement']}  {row['path']}")
        return 0
    for name in args.name or list(registry.assets):
        print(f"{name}: {assets.fetch(registry.asset(name), force=args.force)}")
    return 0


def _fetch_required_assets(config: Path, overrides: Sequence[str]) -> None:
    """Fetch what the config's task reads and the cache lacks, before any timed work starts."""
    from layerdescent.bench import blame
    from layerdescent.config import config_from_dict
    from layerdescent.guard import build_task

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
            print(f"fetching {name} ({asset.requirement}), once; not counted in the demo's time", flush=True)
            assets.fetch(asset)


def _status(run: Any, status: str) -> None:
    """A bench or demo run's status line, naming its variant and seed."""
    print(f"{run.variant} seed {run.seed}: {status}", flush=True)


def cmd_demo(args: argparse.Namespace) -> int:
    from layerdescent.bench import run_bench

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
        on_run=_status,
        command=command,
        workers=workers,
        title=f"Demo: ERM vs primal-dual descent constraints on {args.task}",
        before=announce,
    )
    print(summary.read_text())
    print(f"plots and tables: {summary.parent}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="layerdescent", description="Train networks whose every layer must lower the loss.")
    parser.add_argument("--version", action="version", version=f"layerdescent {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    sub.add_parser("list", help="tasks, constraint kinds, solvers, executors and trackers").set_defaults(func=cmd_list)
    p = sub.add_parser("plugins", help="plugins that loaded, failed or were blocked")
    p.add_argument("--json", action="store_true", help="print them as a JSON list (name, distribution, version, status, reason)")
    p.set_defaults(func=cmd_plugins)

    p = sub.add_parser("config", help="every config key: a complete TOML at the defaults, or the reference table")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument(
        "--defaults",
        action="store_true",
        help="print a run config with every key at its default, each commented; `layerdescent run` takes it as it is",
    )
    what.add_argument(
        "--reference",
        action="store_true",
        help="print the configuration reference (markdown): every key's type, default, range and meaning",
    )
    p.add_argument("--task", help="the task whose options --defaults fills in (default: lista, which needs nothing fetched)")
    p.add_argument("--solver", help="the solver whose options --defaults fills in (default: primal-dual)")
    p.set_defaults(func=cmd_config)

    for name, func, help_ in (("run", cmd_run, "train one config"), ("bench", cmd_bench, "train variants x seeds and summarize")):
        p = sub.add_parser(name, help=help_)
        p.add_argument("config", help="TOML file")
        p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config value, e.g. solver.dual_lr=0.1")
        p.add_argument("--out", help="output directory")
        if name == "run":
            p.add_argument("--resume", action="store_true", help="continue from the run directory's checkpoint")
        else:
            p.add_argument(
                "--only",
                action="append",
                default=[],
                metavar="PATTERN",
                help="train only the variants whose label matches, e.g. 'tune-*' (repeatable)",
            )
            p.add_argument(
                "--status",
                action="store_true",
                help="print where each run stands (done, training, failed, stopped, pending) and train nothing",
            )
            p.add_argument(
                "--skip-failed",
                action="store_true",
                help="leave the runs that failed before (failure.json) as they are instead of retrying them; they still count as failed",
            )
            p.add_argument(
                "--workers",
                type=int,
                help="runs trained at once (local: processes of one torch thread each, default 1; ray, slurm: default as many as fit)",
            )
            p.add_argument(
                "--executor",
                default="local",
                metavar="NAME",
                help="where runs train: local (a process pool, the default), ray (Ray tasks), slurm (SLURM jobs via submitit), or one a plugin registers (`layerdescent list`)",
            )
            p.add_argument("--ray-address", help="join this Ray cluster (default: start a local Ray instance)")
            p.add_argument("--cpus-per-run", type=int, help="CPUs (and torch threads) per run on ray or slurm (default 1)")
            p.add_argument("--gpus-per-run", type=float, help="GPUs per run on ray or slurm (default 0)")
            p.add_argument("--partition", help="SLURM partition (default: [bench.slurm] partition, else the cluster's)")
            p.add_argument("--time", type=int, help="minutes a SLURM job may run (default: [bench.slurm] time, else 60)")
            p.add_argument("--mem-gb", type=float, help="memory per SLURM job in GB")
            p.add_argument("--no-wait", action="store_true", help="slurm: submit the jobs and return; the same command again collects them")
        p.set_defaults(func=func)

    p = sub.add_parser("evaluate", help="test finished runs again, e.g. under another perturbation")
    p.add_argument("runs", help="a run directory, or a directory of them (a bench)")
    p.add_argument("--out", required=True, help="where the new results go, in the same layout")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="task.perturbation or eval.*, e.g. eval.gammas=[0,0.2]")
    p.add_argument("--workers", type=int, default=1, help="runs evaluated at once, each in its own process on one torch thread (default 1)")
    p.set_defaults(func=cmd_evaluate)

    p = sub.add_parser("report", help="summary.md and plots for run directories")
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory, or any directory above runs (a bench): every results.json under it")
    p.add_argument("--out", help="where to write (default: RUN_DIR)")
    p.add_argument("--print", action="store_true", help="print summary.md")
    p.add_argument(
        "--bench",
        metavar="FILE",
        help="the bench file the runs were made from: its [bench] baselines, primary endpoints and tuning budgets",
    )
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("compare", help="paired differences of any two variants, on test and every domain")
    p.add_argument("runs", metavar="RUNS", help="a bench directory (every results.json under it)")
    p.add_argument("a", metavar="A", help="the variant label compared")
    p.add_argument("b", metavar="B", help="the variant label it is compared with")
    p.add_argument("--out", help="where to write the markdown (default: print it)")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("assets", help="pinned data and weights")
    p.add_argument("action", choices=["fetch", "list"], help="fetch: download and check; list: what is declared and fetched")
    p.add_argument(
        "name", nargs="*", metavar="NAME", help="assets to fetch (default: every declared one); `layerdescent assets list` names them"
    )
    p.add_argument("--force", action="store_true", help="fetch again even if cached")
    p.set_defaults(func=cmd_assets)

    p = sub.add_parser("demo", help="the main job: ERM vs primal-dual, a table and plots")
    p.add_argument(
        "--task",
        type=_demo_task,
        default="text-classification",
        metavar="{" + ",".join(DEMOS) + "}",
        help="text-classification (or text, the default): MiniLM on movie reviews, ~10 min; lista: synthetic sparse coding, <1 min",
    )
    p.add_argument(
        "--out",
        help=f"output directory (default: {DEMOS['text-classification'].out} for text-classification, {DEMOS['lista'].out} for lista)",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a value of the demo's bench file, e.g. train.epochs=2 or bench.seeds=[0]",
    )
    p.add_argument(
        "--workers",
        type=int,
        help="runs trained at once, one torch thread each (default: 2 for text-classification, both solvers together; 1 for lista)",
    )
    p.set_defaults(func=cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; user mistakes end in one line on stderr and exit status 2."""
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except LayerdescentError as exc:
        for line in str(exc).splitlines() or [type(exc).__name__]:  # several config mistakes: one line each
            print(f"layerdescent: error: {line}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        again = getattr(args, "again", None) or ("the same command again" if args.command in TRAINING else None)
        print(
            f"layerdescent: interrupted; {again} continues from the last checkpoint" if again else "layerdescent: interrupted",
            file=sys.stderr,
        )
        return 130


if __name__ == "__main__":
    sys.exit(main())
