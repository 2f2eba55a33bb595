"""A ``layerdescent`` subcommand, as the built-in verbs and a plugin's ``register_commands`` declare one.

    def arguments(parser):
        parser.add_argument("runs", help="a bench directory")

    def run(args) -> int:
        print(args.runs)
        return 0

    @layerdescent.hookimpl
    def register_commands(register):
        register(Command("count", "count the runs of a bench", run, arguments))

``run`` returns the exit status; a :class:`~layerdescent.errors.LayerdescentError` it raises is
printed as one line with exit status 2, as for every built-in verb.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass


def _no_arguments(parser: argparse.ArgumentParser) -> None:
    """A command that takes no arguments adds none."""


@dataclass(frozen=True)
class Command:
    """One subcommand: its name, one line of help, what it does and the arguments it takes."""

    name: str
    help: str
    run: Callable[[argparse.Namespace], int]
    arguments: Callable[[argparse.ArgumentParser], None] = _no_arguments
    # Interrupting it leaves work that the same command continues (a run, a bench): the interrupted line says so.
    resumable: bool = False
