"""Find tasks, constraint kinds, solvers, executors, trackers, assets and commands contributed by plugins.

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

import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib import import_module, metadata
from typing import TYPE_CHECKING, Any

import pluggy

from layerdescent import hookspecs
from layerdescent.errors import PluginError, closest

if TYPE_CHECKING:
    from layerdescent.assets import Asset
    from layerdescent.bench.executors import Executor
    from layerdescent.commands import Command
    from layerdescent.core.constraints import ConstraintSpec
    from layerdescent.core.solver import Solver
    from layerdescent.run.tracking import Tracker
    from layerdescent.task import Task

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


# The built-in plugins, named by module path as llm's DEFAULT_PLUGINS are: the registry imports none of them
# at its top, so every layer may use the registry without importing the layers above it.
DEFAULT_PLUGINS = (
    "layerdescent.core.constraints",
    "layerdescent.core.solvers",
    "layerdescent.bench.executors",
    "layerdescent.bench.trackers",
    "layerdescent.cli.compare",  # a built-in verb through the commands hook, the path a plugin's command takes
)


@dataclass(frozen=True)
class Kind:
    """One kind of registered item: the hook that registers it, its base class by module path, its table and its key."""

    hook: str
    base: str  # "module:Class", imported when a registry is built
    table: str
    what: str  # how messages name one item
    key: str = "name"  # the attribute that names an item


KINDS = (
    Kind("register_tasks", "layerdescent.task:Task", "tasks", "task"),
    Kind("register_constraints", "layerdescent.core.constraints:ConstraintSpec", "constraints", "constraint kind", key="kind"),
    Kind("register_solvers", "layerdescent.core.solver:Solver", "solvers", "solver"),
    Kind("register_executors", "layerdescent.bench.executors:Executor", "executors", "executor"),
    Kind("register_trackers", "layerdescent.run.tracking:Tracker", "trackers", "tracker"),
    Kind("register_assets", "layerdescent.assets:Asset", "assets", "asset"),
    Kind("register_commands", "layerdescent.commands:Command", "commands", "command"),
)


def _resolve(path: str) -> Any:
    module, _, name = path.partition(":")
    return getattr(import_module(module), name)


class Registry:
    """Tasks, constraint kinds, solvers, executors, trackers, assets and commands, keyed by name, with the plugins that gave them."""

    def __init__(self, extra_plugins: Iterable[tuple[str, Any]] = (), entry_points: bool = True) -> None:
        self.tasks: dict[str, type[Task]] = {}
        self.constraints: dict[str, type[ConstraintSpec]] = {}
        self.solvers: dict[str, type[Solver]] = {}
        self.executors: dict[str, type[Executor]] = {}
        self.trackers: dict[str, type[Tracker]] = {}
        self.assets: dict[str, Asset] = {}
        self.commands: dict[str, Command] = {}
        self.plugins: dict[str, PluginInfo] = {}
        self.owner: dict[tuple[str, str], str] = {}
        self._pm = pluggy.PluginManager(GROUP)
        self._pm.add_hookspecs(hookspecs)
        self._bases = {kind.hook: _resolve(kind.base) for kind in KINDS}
        for path in DEFAULT_PLUGINS:
            self._add(path, import_module(path), PluginInfo(path, "layerdescent"))
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
            except BaseException as exc:  # GeneratorExit and a bare BaseException too
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
            self._fail(info, f"unknown hook {unknown[0]!r}; known hooks: {', '.join(kind.hook for kind in KINDS)}")

    def _fail(self, info: PluginInfo, reason: str) -> None:
        info.status, info.reason = "failed", reason
        logger.warning("layerdescent: plugin %r skipped: %s", info.name, reason)

    def _collect(self, name: str, info: PluginInfo) -> None:
        """Run every hook of one plugin into a staging area; commit all of it, or nothing when any part fails."""
        staged: dict[str, dict[str, Any]] = {kind.table: {} for kind in KINDS}
        for kind in KINDS:
            for impl in getattr(self._pm.hook, kind.hook).get_hookimpls():
                if impl.plugin_name != name:
                    continue
                try:
                    impl.function(register=self._registrar(kind, staged[kind.table]))
                except BaseException as exc:  # sys.exit(), GeneratorExit and a bare BaseException too
                    self._unregister(name)
                    self._fail(info, f"{kind.hook} raised {type(exc).__name__}: {exc}")
                    return
        for kind in KINDS:
            table = getattr(self, kind.table)
            for key, item in staged[kind.table].items():
                # The same pinned asset from two plugins that share it (equal name, source, checksum) is one registration.
                if key in table and not (kind.table == "assets" and table[key] == item):
                    owner = self.owner[(self._bases[kind.hook].__name__, key)]
                    self._unregister(name)
                    self._fail(
                        info,
                        f"{kind.hook}: {kind.what} {key!r} is already registered by plugin {owner!r}; plugin {name!r} was skipped, {owner!r} kept",
                    )
                    return
        for kind in KINDS:
            for key, item in staged[kind.table].items():
                if key not in getattr(self, kind.table):
                    getattr(self, kind.table)[key] = item
                    self.owner[(self._bases[kind.hook].__name__, key)] = name

    def _unregister(self, name: str) -> None:
        plugin = self._pm.get_plugin(name)
        if plugin is not None:
            self._pm.unregister(plugin)

    def _registrar(self, kind: Kind, table: dict[str, Any]) -> Callable[[Any], Any]:
        base = self._bases[kind.hook]

        def register(item: Any) -> Any:
            ok = isinstance(item, base) or (isinstance(item, type) and issubclass(item, base))
            if not ok:
                raise PluginError(f"registered {item!r}, which is not a {base.__name__}")
            key = getattr(item, kind.key, None)
            if not isinstance(key, str) or not key:
                raise PluginError(f"{item!r} has no name")
            if key in table:
                raise PluginError(f"registers {kind.what} {key!r} twice")
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
