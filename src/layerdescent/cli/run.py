"""`layerdescent run`: train one config into its run directory."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path
from typing import Any

from layerdescent.commands import Command
from layerdescent.run.config import load_config


def overrides(parser: argparse.ArgumentParser, help: str = "override a config value, e.g. solver.dual_lr=0.1") -> None:
    """The --set flag every training verb takes."""
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help=help)


def _summary_line(gamma_record: dict[str, Any]) -> str:
    """One gamma's test loss at every layer, whether it falls at each, and the last layer's metrics."""
    losses = gamma_record["layer_loss"]
    rises = [k for k in range(1, len(losses)) if losses[k] > losses[k - 1]]
    trend = "falls at every layer" if not rises else f"rises at layer{'s' * (len(rises) > 1)} {', '.join(map(str, rises))}"
    metrics = " ".join(f"{k}={v:.4g}" for k, v in gamma_record["metrics"].items())
    return (
        f"gamma={gamma_record['gamma']:g}  loss at layers 0..{len(losses) - 1}: {' '.join(f'{v:.4g}' for v in losses)} ({trend})  {metrics}"
    )


def run(args: argparse.Namespace) -> int:
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
    args.checkpoints = out  # an interrupt before the first checkpoint is told the rerun starts over
    from layerdescent.run.trainer import train

    results = train(config, out, resume=args.resume)
    print(f"run {config.name} finished: {out}")
    for record in results["gammas"]:
        print("  " + _summary_line(record))
    return 0


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="TOML file")
    overrides(parser)
    parser.add_argument("--out", help="output directory")
    parser.add_argument("--resume", action="store_true", help="continue from the run directory's checkpoint")


COMMAND = Command("run", "train one config", run, arguments, resumable=True)
