"""The hooks a layerdescent plugin implements; each takes a registrar and calls it."""

from __future__ import annotations

import pluggy

hookspec = pluggy.HookspecMarker("layerdescent")
hookimpl = pluggy.HookimplMarker("layerdescent")


@hookspec
def register_tasks(register) -> None:
    """Call ``register(TaskSubclass)`` for every task the plugin provides."""


@hookspec
def register_constraints(register) -> None:
    """Call ``register(ConstraintSpecSubclass)`` for every constraint kind the plugin provides."""


@hookspec
def register_assets(register) -> None:
    """Call ``register(Asset(...))`` for every pinned data or weight artifact the plugin needs."""


@hookspec
def register_solvers(register) -> None:
    """Call ``register(SolverSubclass)`` for every solver the plugin provides."""


@hookspec
def register_executors(register) -> None:
    """Call ``register(ExecutorSubclass)`` for every executor (where a bench's runs train) the plugin provides."""


@hookspec
def register_trackers(register) -> None:
    """Call ``register(TrackerSubclass)`` for every tracker (a listener on a run's metrics log) the plugin provides."""


@hookspec
def register_commands(register) -> None:
    """Call ``register(Command(...))`` for every ``layerdescent`` subcommand the plugin provides."""
