"""`layerdescent config`: every config key, as a complete TOML at the defaults or as the reference table."""

from __future__ import annotations

import argparse

from layerdescent.commands import Command
from layerdescent.errors import ConfigError


def run(args: argparse.Namespace) -> int:
    from layerdescent.run.config_keys import DEFAULT_TASK, defaults_toml, reference_markdown

    if args.reference:
        if args.task is not None or args.solver is not None:
            raise ConfigError("--reference covers every task and solver; --task and --solver go with --defaults")
        print(reference_markdown(), end="")
    else:
        # an empty --task "" names no task: refused as unknown, not read as the default
        print(
            defaults_toml(DEFAULT_TASK if args.task is None else args.task, "primal-dual" if args.solver is None else args.solver), end=""
        )
    return 0


def arguments(parser: argparse.ArgumentParser) -> None:
    what = parser.add_mutually_exclusive_group(required=True)
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
    parser.add_argument("--task", help="the task whose options --defaults fills in (default: lista, which needs nothing fetched)")
    parser.add_argument("--solver", help="the solver whose options --defaults fills in (default: primal-dual)")


COMMAND = Command("config", "every config key: a complete TOML at the defaults, or the reference table", run, arguments)
