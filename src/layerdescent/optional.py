"""Imports of what only some plugins need, failing with the extra that installs them."""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

from layerdescent.errors import ConfigError, PluginError


def require(module: str, extra: str, purpose: str = "") -> ModuleType:
    """Import ``module`` or raise one PluginError naming the extra to install."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        missing = getattr(exc, "name", None) or module
        who = purpose or "this feature"
        raise PluginError(
            f"{who} needs the optional dependency {missing!r}; install it with: pip install 'layerdescent[{extra}]'"
        ) from None


def check_installed(requires: dict[str, str], who: str) -> None:
    """Raise one ConfigError naming the pip requirement to install when a module of ``requires`` (module -> requirement) is missing.

    Looked up without importing, so a bench or a run is refused before anything trains.
    """
    for module, requirement in requires.items():
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:  # a dotted name whose parent package is missing
            found = False
        if not found:
            raise ConfigError(f"{who} needs the {module} package: pip install '{requirement}'")


def quiet_transformers(transformers: ModuleType) -> ModuleType:
    """``transformers`` with its progress bars and advice off ("Loading weights 103/103" on every run, even piped).

    Errors still show; what is silenced is what a user of a run can neither act on nor needs.
    """
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    return transformers
