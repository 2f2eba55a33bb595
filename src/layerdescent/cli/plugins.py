"""`layerdescent plugins`: the plugins that loaded, failed or were blocked."""

from __future__ import annotations

import argparse
import json

from layerdescent.commands import Command
from layerdescent.registry import get_registry


def run(args: argparse.Namespace) -> int:
    rows = list(get_registry().plugins.values())
    if args.json:
        print(json.dumps([vars(r) for r in rows], indent=2))
        return 0
    for info in rows:
        origin = f"{info.distribution} {info.version}".strip() or "-"
        reason = f"  ({info.reason})" if info.reason else ""
        print(f"{info.name:28} {info.status:8} {origin}{reason}")
    return 0


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print them as a JSON list (name, distribution, version, status, reason)")


COMMAND = Command("plugins", "plugins that loaded, failed or were blocked", run, arguments)
