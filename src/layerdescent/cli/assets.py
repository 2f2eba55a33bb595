"""`layerdescent assets`: list or fetch the pinned data and weights that plugins declare."""

from __future__ import annotations

import argparse

from layerdescent import assets
from layerdescent.commands import Command
from layerdescent.registry import get_registry


def run(args: argparse.Namespace) -> int:
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
        print(f"{name}: {assets.fetch(registry.asset(name), force=args.force, say=lambda line: print(line, flush=True))}")
    return 0


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["fetch", "list"], help="fetch: download and check; list: what is declared and fetched")
    parser.add_argument(
        "name", nargs="*", metavar="NAME", help="assets to fetch (default: every declared one); `layerdescent assets list` names them"
    )
    parser.add_argument("--force", action="store_true", help="fetch again even if cached")


COMMAND = Command("assets", "pinned data and weights", run, arguments)
