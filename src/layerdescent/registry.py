"""Find tasks, constraint kinds and assets contributed by plugins.

    from layerdescent import get_registry
    registry = get_registry()            # loads entry-point group "layerdescent" once
    task_cls = registry.task("lista")
    spec_cls = registry.constraint("descent")

Plugins are modules (or objects) with ``@layerdescent.hookimpl`` functions named after the hooks
in :mod:`layerdescent.hookspecs`. A plugin that fails to import, implements an unknown hook or
breaks inside a hook is reported once by name and skipped; the others still load.
``LAYERDESCENT_DISABLE_PLUGINS=a,b`` blocks plugins by entry-point name.
"""

from __future__ import annotations

import difflib
import logging
import os
from dataclasses import dataclass
from importlib import metadata
from typing import Any, Callable, Iterable

import pluggy

from layerdescent import constraints as builtin_constraints
from layerdescent import hookspecs
from layerdescent.assets import Asset
from layerdescent.constraints import ConstraintSpec
from layerdescent.errors import PluginError
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


def closest(name: str, choices: Iterable[str]) -> str:
    """A ' did you mean X?' hint, or an empty string."""
    choices = [str(c) for c in choices]
    match = difflib.get_close_matches(name, choices, n=1) or [c for c in choices if name.startswith(c) or c.startswith(name)]
    return f"; did you mean {match[0]!r}?" if match and name else ""


class Registry:
    """Tasks, constraint kinds and assets, keyed by name, with the plugins that gave them."""

    _kinds: dict[str, tuple[type, str]] = {
        "register_tasks": (Task, "tasks"),
        "register_constraints": (ConstraintSpec, "constraints"),
        "register_assets": (Asset, "assets"),
    }

    def __init__(self, extra_plugins: Iterable[tuple[str, Any]] = (), entry_points: bool = True) -> None:
        self.tasks: dict[str, type[Task]] = {}
        self.constraints: dict[str, type[ConstraintSpec]] = {}
        self.assets: dict[str, Asset] = {}
        self.plugins: dict[str, PluginInfo] = {}
        self.owner: dict[tuple[str, str], str] = {}
        self._pm = pluggy.PluginManager(GROUP)
        self._pm.add_hookspecs(hookspecs)
        self._add("layerdescent.constraints", builtin_constraints, PluginInfo("layerdescent.constraints", "layerdescent"))
        if entry_points:
            self._load_entry_points()
        for name, plugin in extra_plugins:
            self._add(name, plugin, PluginInfo(name))
        self._pm.check_pending()
        for hook in self._kinds:
            self._collect(hook)

    def _load_entry_points(self) -> None:
        blocked = {n.strip() for n in os.environ.get(DISABLE_ENV, "").split(",") if n.strip()}
        for ep in metadata.entry_points(group=GROUP):
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
            except Exception as exc:  # a broken plugin must not take the others down
                self._fail(info, f"import failed: {type(exc).__name__}: {exc}")
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

    def _collect(self, hook: str) -> None:
        base, attr = self._kinds[hook]
        table: dict[str, Any] = getattr(self, attr)
        for impl in getattr(self._pm.hook, hook).get_hookimpls():
            info = self.plugins[impl.plugin_name]
            if info.status != "loaded":
                continue
            added: list[str] = []
            try:
                impl.function(register=self._registrar(base, table, info.name, added))
            except Exception as exc:
                for key in added:  # a half-registered plugin would leave dangling names
                    del table[key]
                self._fail(info, f"{hook} raised {type(exc).__name__}: {exc}")

    def _registrar(self, base: type, table: dict[str, Any], plugin: str, added: list[str]) -> Callable[[Any], Any]:
        def register(item: Any) -> Any:
            ok = isinstance(item, base) or (isinstance(item, type) and issubclass(item, base))
            if not ok:
                raise PluginError(f"registered {item!r}, which is not a {base.__name__}")
            key = getattr(item, "kind" if base is ConstraintSpec else "name", None)
            if not isinstance(key, str) or not key:
                raise PluginError(f"{item!r} has no name")
            if key in table:
                raise PluginError(f"name {key!r} is already registered by plugin {self.owner[(base.__name__, key)]!r}")
            table[key] = item
            self.owner[(base.__name__, key)] = plugin
            added.append(key)
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
