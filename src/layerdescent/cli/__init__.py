"""The ``layerdescent`` command line: one verb a module, each a :class:`~layerdescent.commands.Command`; a plugin adds its own."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

# Only light modules at the top: `--help`, `--version`, `list` and `plugins` must not import torch
# (the commands that train import it where they need it).
from layerdescent import __version__
from layerdescent.cli import api, assets, bench, config, demo, evaluate, listing, plan, plugins, report, run
from layerdescent.commands import Command
from layerdescent.errors import LayerdescentError
from layerdescent.registry import get_registry

BUILTIN = tuple(module.COMMAND for module in (listing, plugins, config, run, bench, plan, evaluate, report, assets, demo, api))
logger = logging.getLogger("layerdescent")


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage mistake as one line, exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def commands() -> list[Command]:
    """The built-in verbs, then those plugins register (``compare`` among them), a name taken once."""
    found = list(BUILTIN)
    for name, command in get_registry().commands.items():
        if name in {c.name for c in found}:
            owner = get_registry().owner[("Command", name)]
            logger.warning("layerdescent: plugin %r registers command %r, which is built in; the built-in one is kept", owner, name)
            continue
        found.append(command)
    return found


def build_parser() -> argparse.ArgumentParser:
    """The parser of every verb, built-in and registered."""
    parser = _Parser(prog="layerdescent", description="Train networks whose every layer must lower the loss.")
    parser.add_argument("--version", action="version", version=f"layerdescent {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for command in commands():
        verb = sub.add_parser(command.name, help=command.help)
        command.arguments(verb)
        verb.set_defaults(command=command.name, func=command.run, resumable=command.resumable)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; user mistakes end in one line on stderr and exit status 2."""
    args = build_parser().parse_args(argv)
    in_main = threading.current_thread() is threading.main_thread()
    if in_main:
        # a shell starts a background job (`... &`) with SIGINT ignored; `kill -INT` must still stop it as Ctrl-C does
        previous = {
            signal.SIGINT: signal.signal(signal.SIGINT, signal.default_int_handler),
            signal.SIGTERM: signal.signal(signal.SIGTERM, _terminated),
        }
    try:
        return args.func(args)
    except LayerdescentError as exc:
        for line in str(exc).splitlines() or [type(exc).__name__]:  # several config mistakes: one line each
            print(f"layerdescent: error: {line}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        again = getattr(args, "again", None) or ("the same command again" if args.resumable else None)
        if again and not _checkpointed(getattr(args, "checkpoints", None)):
            line = f"layerdescent: interrupted before the first checkpoint; {again} starts over"
        else:
            line = f"layerdescent: interrupted; {again} continues from the last checkpoint" if again else "layerdescent: interrupted"
        print(line, file=sys.stderr)
        return 143 if exc.args == ("SIGTERM",) else 130
    finally:
        if in_main:
            for signum, handler in previous.items():
                signal.signal(signum, handler if handler is not None else signal.SIG_DFL)


def _checkpointed(folder: object) -> bool:
    """Whether the run or bench folder a command trains into holds a checkpoint to continue from (True where it did not say which)."""
    if folder is None:
        return True

    folder = Path(str(folder))
    return (folder / "checkpoint.pt").exists() or any(folder.glob("*/seed-*/checkpoint.pt"))


def _terminated(signum: int, frame: object) -> None:
    """SIGTERM stops a command as Ctrl-C does: its workers stopped, every run resumable, one line."""
    raise KeyboardInterrupt("SIGTERM")
