"""Find tasks, constraint kinds, solvers, executors, trackers and assets contributed by plugins.

    from layerdescent import get_registry
    registry = get_registry()            # loads entry-point group "layerdescent" once
    task_cls = registry.task("lista")
    spec_cls = registry.constraint("descent")
    solver_cls = registry.solver("primal-dual")
    executor_cls = registry.executor("ray")
    tracker_cls = registry.tracker("mlflow")

Plugins are modules (or objects) with ``@layerdescent.hookimpl`` functions named after the hooks
in :mod:`layerdescent.hookspecs`; the built-in constraint kinds, solvers, executors and trackers
are default plugins that register through the same hooks. Registration is atomic per plugin: one that fails to import
(sys.exit() included), implements an unknown hook, breaks inside any hook or registers a name
another plugin has is reported once by name and contributes nothing; the others still load.
``LAYERDESCENT_DISABLE_PLUGINS=a,b`` blocks plugins by entry-point name.
"""

from __future__ import annotations

import difflib
import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib import metadata
from typing import Any

import pluggy

from layerdescent import constraints as builtin_constraints
from layerdescent import executors as builtin_executors
from layerdescent import hookspecs
from layerdescent import solvers as builtin_solvers
from layerdescent import trackers as builtin_trackers
from layerdescent.assets import Asset
from layerdescent.constraints import ConstraintSpec
from layerdescent.errors import PluginError
from layerdescent.executors import Executor
from layerdescent.solvers import Solver
from layerdescent.task import Task
from layerdescent.trackers import Tracker

GROUP = "layerdescent"
DISABLE_ENV = "LAYERDESCENT_DISABLE_PLUGINS"
logger = logging.getLogger("layerdescent")


@dataclass
class PluginInfo:
    """What `layerdescent plugins` shows about one plugin."""

    name: str
    distribution: str = ""
    version: str = ""
    status: str = "loaded"  # loaded | failed | blocked
    reason: str = ""


def closest(name: str, choices: Iterable[str]) -> str:
    """A ' did you mean X?' hint, or an empty string."""
    choices = [str(c) for c in choices]
    match = difflib.get_close_matches(name, choices, n=1) or [c for c in choices if name.startswith(c) or c.startswith(name)]
    return f"; did you mean {match[0]!r}?" if match and name else ""


_WHAT = {Task: "task", ConstraintSpec: "constraint kind", Solver: "solver", Executor: "executor", Tracker: "tracker", Asset: "asset"}
BUILTIN = (builtin_constraints, builtin_solvers, builtin_executors, builtin_trackers)  # default plugins, named by module


class Registry:
    """Tasks, constraint kinds, solvers, executors, trackers and assets, keyed by name, with the plugins that gave them."""

    _kinds: dict[str, tuple[type, str]] = {
        "register_tasks": (Task, "tasks"),
        "register_constraints": (ConstraintSpec, "constraints"),
        "register_solvers": (Solver, "solvers"),
        "register_executors": (Executor, "executors"),
        "register_trackers": (Tracker, "trackers"),
        "register_assets": (Asset, "assets"),
    }

    def __init__(self, extra_plugins: Iterable[tuple[str, Any]] = (), entry_points: bool = True) -> None:
        self.tasks: dict[str, type[Task]] = {}
        self.constraints: dict[str, type[ConstraintSpec]] = {}
        self.solvers: dict[str, type[Solver]] = {}
        self.executors: dict[str, type[Executor]] = {}
        self.trackers: dict[str, type[Tracker]] = {}
        self.assets: dict[str, Asset] = {}
        self.plugins: dict[str, PluginInfo] = {}
        self.owner: dict[tuple[str, str], str] = {}
        self._pm = pluggy.PluginManager(GROUP)
        self._pm.add_hookspecs(hookspecs)
        for module in BUILTIN:
            self._add(module.__name__, module, PluginInfo(module.__name__, "layerdescent"))
        if entry_points:
            self._load_entry_points()
        for name, plugin in extra_plugins:
            self._add(name, plugin, PluginInfo(name))
        self._pm.check_pending()
        for name, info in list(self.plugins.items()):
            if info.status == "loaded":
                self._collect(name, info)

    def _load_entry_points(self) -> None:
        blocked = {n.strip() for n in os.environ.get(DISABLE_ENV, "").split(",") if n.strip()}
        found = metadata.entry_points(group=GROUP)
        for name in sorted(blocked - {ep.name for ep in found}):
            # A misspelt name would otherwise leave the plugin loaded without a word.
            logger.warning(
                "layerdescent: %s names %r, but no plugin has that name (plugins: %s)",
                DISABLE_ENV,
                name,
                ", ".join(sorted({ep.name for ep in found})),
            )
        for ep in found:
            if ep.name in self.plugins:
                continue  # the same distribution seen twice on sys.path
            dist = getattr(ep, "dist", None)
            info = self.plugins[ep.name] = PluginInfo(ep.name, dist.name if dist else "", dist.version if dist else "")
            if ep.name in blocked:
                self._pm.set_blocked(ep.name)
                info.status, info.reason = "blocked", f"listed in {DISABLE_ENV}"
                continue
            try:
                plugin = ep.load()
            # A broken plugin must not take the others down, nor exit or act as a Ctrl-C for them.
            except (Exception, SystemExit, KeyboardInterrupt) as exc:
                what = f"SystemExit({exc.code!r}), sys.exit() at import" if isinstance(exc, SystemExit) else f"{type(exc).__name__}: {exc}"
                self._fail(info, f"import failed: {what}")
                continue
            self._add(ep.name, plugin, info)

    def _add(self, name: str, plugin: Any, info: PluginInfo) -> None:
        self.plugins[name] = info
        try:
            self._pm.register(plugin, name=name)
        except Exception as exc:
            self._fail(info, f"{type(exc).__name__}: {exc}")
            return
        unknown = [
            impl.function.__name__
            for caller in self._pm.get_hookcallers(plugin) or []
            if caller.spec is None
            for impl in caller.get_hookimpls()
            if impl.plugin is plugin
        ]
        if unknown:
            self._pm.unregister(plugin)
            self._fail(info, f"unknown hook {unknown[0]!r}; known hooks: {', '.join(self._kinds)}")

    def _fail(self, info: PluginInfo, reason: str) -> None:
        info.status, info.reason = "failed", reason
        logger.warning("layerdescent: plugin %r skipped: %s", info.name, reason)

    def _collect(self, name: str, info: PluginInfo) -> None:
        """Run every hook of one plugin into a staging area; commit all of it, or nothing when any part fails."""
        staged: dict[str, dict[str, Any]] = {attr: {} for _, attr in self._kinds.values()}
        for hook, (base, attr) in self._kinds.items():
            for impl in getattr(self._pm.hook, hook).get_hookimpls():
                if impl.plugin_name != name:
                    continue
                try:
                    impl.function(register=self._registrar(base, staged[attr], info.name))
                except (Exception, SystemExit, KeyboardInterrupt) as exc:
                    self._unregister(name)
                    self._fail(info, f"{hook} raised {type(exc).__name__}: {exc}")
                    return
        for hook, (base, attr) in self._kinds.items():
            table = getattr(self, attr)
            for key, item in staged[attr].items():
                # The same pinned asset from two plugins that share it (equal name, source, checksum) is one registration.
                if key in table and not (base is Asset and table[key] == item):
                    owner = self.owner[(base.__name__, key)]
                    self._unregister(name)
                    self._fail(
                        info,
                        f"{hook}: {_WHAT[base]} {key!r} is already registered by plugin {owner!r}; plugin {name!r} was skipped, {owner!r} kept",
                    )
                    return
        for base, attr in self._kinds.values():
            for key, item in staged[attr].items():
                if key not in getattr(self, attr):
                    getattr(self, attr)[key] = item
                    self.owner[(base.__name__, key)] = name

    def _unregister(self, name: str) -> None:
        plugin = self._pm.get_plugin(name)
        if plugin is not None:
            self._pm.unregister(plugin)

    def _registrar(self, base: type, table: dict[str, Any], plugin: str) -> Callable[[Any], Any]:
        def register(item: Any) -> Any:
            ok = isinstance(item, base) or (isinstance(item, type) and issubclass(item, base))
            if not ok:
                raise PluginError(f"registered {item!r}, which is not a {base.__name__}")
            key = getattr(item, "kind" if base is ConstraintSpec else "name", None)
            if not isinstance(key, str) or not key:
                raise PluginError(f"{item!r} has no name")
            if key in table:
                raise PluginError(f"registers {_WHAT[base]} {key!r} twice")
            table[key] = item
            return item

        return register

    def _lookup(self, table: dict[str, Any], what: str, name: str) -> Any:
        if name in table:
            return table[name]
        known = ", ".join(sorted(table)) or "none"
        raise PluginError(f"unknown {what} {name!r}{closest(name, table)} (known: {known})")

    def task(self, name: str) -> type[Task]:
        """The Task class registered under ``name``."""
        return self._lookup(self.tasks, "task", name)

    def constraint(self, kind: str) -> type[ConstraintSpec]:
        """The ConstraintSpec class registered for ``kind``."""
        return self._lookup(self.constraints, "constraint kind", kind)

    def solver(self, name: str) -> type[Solver]:
        """The Solver class registered under ``name``."""
        return self._lookup(self.solvers, "solver", name)

    def executor(self, name: str) -> type[Executor]:
        """The Executor class registered under ``name``."""
        return self._lookup(self.executors, "executor", name)

    def tracker(self, name: str) -> type[Tracker]:
        """The Tracker class registered under ``name``."""
        return self._lookup(self.trackers, "tracker", name)

    def asset(self, name: str) -> Asset:
        """The Asset registered under ``name``."""
        return self._lookup(self.assets, "asset", name)


_registry: Registry | None = None


def get_registry() -> Registry:
    """The process-wide registry, loaded on first use."""
    global _registry
    if _registry is None:
        _registry = Registry()
    return _registry
