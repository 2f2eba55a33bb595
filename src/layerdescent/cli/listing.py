"""`layerdescent list`: the tasks, constraint kinds, solvers, executors, trackers and commands that loaded."""

from __future__ import annotations

import argparse
import dataclasses
import json

from layerdescent.commands import Command
from layerdescent.registry import get_registry


def run(args: argparse.Namespace) -> int:
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
            for option in dataclasses.fields(cls.Options) if hasattr(cls, "Options") else ():  # solvers and executors
                print(f"    {option.name} = {_option_default(option)}")
    if registry.commands:
        print("commands (registered by plugins):")
        for name, command in sorted(registry.commands.items()):
            print(f"  {name:24} {command.help}  [plugin {registry.owner[('Command', name)]}]")
    return 0


def _option_default(option: dataclasses.Field) -> str:
    """An option's default as TOML would write it."""
    value = option.default
    if value is None:
        return "(unset)"
    return json.dumps(value) if isinstance(value, (str, bool)) else repr(value)


COMMAND = Command("list", "tasks, constraint kinds, solvers, executors and trackers", run)
