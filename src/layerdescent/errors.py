"""Errors that reach the user as one clear line instead of a traceback."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class LayerdescentError(Exception):
    """Base class of every error the CLI reports as one line with exit status 2."""


class ConfigError(LayerdescentError):
    """A run or bench file asks for something that does not exist or is out of range."""


class PluginError(LayerdescentError):
    """A task, constraint kind or plugin is unknown or broken."""


class AssetError(LayerdescentError):
    """A pinned data or weight artifact is missing, corrupt or cannot be fetched."""


class CheckpointError(LayerdescentError):
    """A checkpoint cannot be read back."""


class DivergenceError(LayerdescentError):
    """Training produced a non-finite loss, violation or multiplier."""


class DataError(LayerdescentError):
    """A dataset is empty or holds values no model can train on."""


class DiskError(LayerdescentError):
    """A run directory could not be written: a full disk, a quota, a read-only filesystem."""


def closest(name: str, choices: Iterable[str]) -> str:
    """A ' did you mean X?' hint, or an empty string."""
    choices = [str(c) for c in choices]
    match = difflib.get_close_matches(name, choices, n=1) or [c for c in choices if name.startswith(c) or c.startswith(name)]
    return f"; did you mean {match[0]!r}?" if match and name else ""
