"""Imports of what only some plugins need, failing with the extra that installs them."""

from __future__ import annotations

import importlib
from types import ModuleType

from layerdescent.errors import PluginError


def require(module: str, extra: str, purpose: str = "") -> ModuleType:
    """Import ``module`` or raise one PluginError naming the extra to install."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        missing = getattr(exc, "name", None) or module
        who = purpose or "this feature"
        raise PluginError(f"{who} needs the optional dependency {missing!r}; install it with: pip install 'layerdescent[{extra}]'") from None
