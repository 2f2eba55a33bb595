"""`layerdescent compare`: paired differences of any two variants; a built-in verb registered through the commands hook."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from layerdescent.commands import Command
from layerdescent.hookspecs import hookimpl


def run(args: argparse.Namespace) -> int:
    from layerdescent.analysis.compare import compare_markdown
    from layerdescent.analysis.report import collect
    from layerdescent.run.publish import write_page

    command = "layerdescent compare " + shlex.join([args.runs, args.a, args.b, *(["--out", args.out] if args.out else [])])
    text = compare_markdown(collect(Path(args.runs)), args.a, args.b, command)
    if args.out:
        write_page(Path(args.out), text)
        print(f"wrote {args.out}")
    else:
        print(text)
    return 0


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", metavar="RUNS", help="a bench directory (every results.json under it)")
    parser.add_argument("a", metavar="A", help="the variant label compared")
    parser.add_argument("b", metavar="B", help="the variant label it is compared with")
    parser.add_argument("--out", help="where to write the markdown (default: print it)")


COMMAND = Command("compare", "paired differences of any two variants, on test and every domain", run, arguments)


@hookimpl
def register_commands(register) -> None:
    """`compare` reaches the command line the way a plugin's command does."""
    register(COMMAND)
