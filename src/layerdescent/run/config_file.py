"""A config file as a table: TOML read within bounds, in one clear line when it cannot be, and --set KEY=VALUE applied."""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

from layerdescent.errors import ConfigError
from layerdescent.readback import depth

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

MAX_CONFIG_BYTES = 10 * 2**20  # read at most this much, so /dev/zero or a huge file is refused, not swallowed
MAX_NESTING = 32  # tables and arrays within each other; a bench file needs 6 (bench.variants.NAME.constraints.0.KEY)


def read_toml(path: str | Path) -> dict[str, Any]:
    """Parse a TOML file; a missing, unreadable, binary, huge or malformed file is one clear line."""
    path = Path(path)
    try:
        if path.is_dir():
            raise ConfigError(f"config file {path} is a directory; give the path of a .toml file")
        if path.is_char_device() or path.is_block_device():
            raise ConfigError(f"config file {path} is a device, not a file; give the path of a .toml file")
        with path.open("rb") as handle:
            raw = handle.read(MAX_CONFIG_BYTES + 1)  # a device such as /dev/zero never ends
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except OSError as exc:
        raise ConfigError(f"config file {path} cannot be read: {exc.strerror or exc}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"config file {path} is larger than {MAX_CONFIG_BYTES >> 20} MiB; that is not a run config")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {path} is not UTF-8 text (byte {exc.start}); is it a binary file?") from None
    try:
        table = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from None
    except RecursionError:
        table = None
    if table is None or depth(table) > MAX_NESTING:  # dotted headers nest without recursing in the parser, but copying them would
        raise ConfigError(f"{path} nests tables or arrays more than {MAX_NESTING} deep; that is not a run config") from None
    return table


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``key.path=value`` strings (value parsed as TOML, else taken as a string)."""
    data = copy.deepcopy(data)
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {item!r} must look like key=value, e.g. solver.dual_lr=0.1")
        try:
            value = tomllib.loads(f"v = {raw}")["v"]
        except (tomllib.TOMLDecodeError, RecursionError):
            value = raw
        if depth(value) >= MAX_NESTING:
            raise ConfigError(
                f"--set {key.strip()}: its value nests arrays or tables {depth(value)} deep; a config nests at most {MAX_NESTING} deep"
            )
        set_path(data, key.strip(), value)
    return data


def set_path(data: Any, dotted: str, value: Any) -> None:
    """Set ``data[a][b][0][c] = value`` for the dotted path ``a.b.0.c``."""
    parts = dotted.split(".")
    if len(parts) > MAX_NESTING:
        raise ConfigError(f"--set {dotted[:60]}...: a key of {len(parts)} parts; a config nests at most {MAX_NESTING} deep")
    node = data
    for level, part in enumerate(parts):
        last = level == len(parts) - 1
        where = ".".join(parts[: level + 1])
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise ConfigError(f"--set {dotted}: {where} is not an index of a list of {len(node)}")
            index: Any = int(part)
        elif isinstance(node, dict):
            index = part
            if not last:
                node.setdefault(part, {})
        else:
            raise ConfigError(f"--set {dotted}: {'.'.join(parts[:level])} is not a table")
        if last:
            node[index] = value
        else:
            node = node[index]
