"""Typed option dataclasses from plain tables (a TOML section, a solver's keyword arguments), one clear line per mistake.

    options = build_dataclass(PrimalDualOptions, {"dual_lr": 0.1}, "solver")

Every key is checked: an unknown key gets the closest valid one, a wrong type or an out-of-range
value names the key and what is allowed (:class:`ConfigError`). Every layer reads options this way:
a run's config, a solver built in one's own loop, an executor's or a tracker's table.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import types
import typing
from collections.abc import Iterable
from typing import Any, Literal, Union

from layerdescent.errors import ConfigError, closest


class Choice(str, enum.Enum):
    """A string option's choices as a type, parsed once where the config is read: a member equals, prints and serializes as its string."""

    # enum.StrEnum (Python 3.11) does this; Python 3.10 is still supported
    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    def __repr__(self) -> str:  # a config or spec prints as it was written
        return repr(self.value)


def plain(value: Any) -> Any:
    """A value as TOML, JSON and YAML writers take it: a Choice as its string, a tuple as a list."""
    if isinstance(value, tuple):
        return list(value)
    return str(value) if isinstance(value, Choice) else value


class Problems:
    """ConfigErrors gathered so that one pass reports every mistake, one line each."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def add(self, exc: ConfigError, prefix: str = "") -> None:
        for line in str(exc).splitlines():
            self.lines.append(line if not prefix or line.startswith(prefix.split(".")[0].split("[")[0]) else f"{prefix}: {line}")

    def attempt(self, fn, *args, prefix: str = ""):
        """``fn(*args)``, or None with its ConfigError recorded."""
        try:
            return fn(*args)
        except ConfigError as exc:
            self.add(exc, prefix)
            return None

    def raise_any(self) -> None:
        if self.lines:
            raise ConfigError("\n".join(dict.fromkeys(self.lines)))


def refuse_unknown(where: str, table: Iterable[str], allowed: Iterable[str]) -> None:
    """A ConfigError naming the first key of ``table`` that is not ``allowed``, and what is: a bench file's tables read strictly."""
    allowed = sorted(allowed)
    unknown = sorted(set(table) - set(allowed))
    if unknown:
        raise ConfigError(f"unknown key {where}.{unknown[0]} (allowed: {', '.join(allowed)})")


def choices(tp: Any) -> tuple[Any, ...]:
    """The values a Literal or Choice type allows; empty for any other type."""
    if typing.get_origin(tp) is Literal:
        return typing.get_args(tp)
    return tuple(member.value for member in tp) if isinstance(tp, type) and issubclass(tp, Choice) else ()


def type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if choices(tp):
        return " or ".join(repr(a) for a in choices(tp))
    if origin in (Union, types.UnionType):
        return " or ".join(type_name(a) for a in typing.get_args(tp) if a is not type(None))
    if origin is tuple:
        item = typing.get_args(tp)[0]
        plural = {int: "integers", float: "numbers", bool: "booleans", str: "strings"}.get(item)
        return f"a list of {plural}" if plural else f"a list, each {type_name(item)}"
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string", dict: "a table"}.get(tp, str(tp))


def coerce(value: Any, tp: Any, key: str) -> Any:
    """``value`` as type ``tp``, or ConfigError naming ``key`` and what it accepts."""
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        for option in typing.get_args(tp):
            if option is type(None) and value is None:
                return None
            if option is not type(None):
                try:
                    return coerce(value, option, key)
                except ConfigError:
                    continue
    elif allowed := choices(tp):
        if value in allowed:  # a Choice's member equals its string
            return tp(value) if origin is not Literal else value
        if isinstance(value, str):
            raise ConfigError(f"{key} = {value!r} is not allowed{closest(value, allowed)} (allowed: {type_name(tp)})")
    elif origin is tuple:
        if isinstance(value, (list, tuple)):
            return tuple(coerce(v, typing.get_args(tp)[0], f"{key}[{i}]") for i, v in enumerate(value))
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value):  # inf and nan pass every range check and poison the results
                raise ConfigError(f"{key} must be a finite number, got {value}")
            return float(value)
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif isinstance(tp, type) and isinstance(value, tp):
        return value
    raise ConfigError(f"{key} must be {type_name(tp)}, got {value!r}")


def build_dataclass(cls: type, data: Any, prefix: str) -> Any:
    """Instantiate dataclass ``cls`` from a TOML table, checking every key and value (all problems at once)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix} must be a table, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    kwargs, problems = {}, Problems()
    for key, value in data.items():
        if key not in fields:
            problems.add(ConfigError(f"unknown key {prefix}.{key}{closest(key, fields)} (allowed: {', '.join(fields)})"))
            continue
        coerced = problems.attempt(coerce, value, hints[key], f"{prefix}.{key}")
        if coerced is not None or value is None:
            kwargs[key] = coerced
    missing = [
        n for n, f in fields.items() if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING and n not in data
    ]
    for name in missing:
        problems.add(ConfigError(f"{prefix}.{name} is required"))
    problems.raise_any()  # range checks only make sense on well-typed values
    try:
        return cls(**kwargs)
    except ConfigError as exc:
        message = str(exc)
        raise ConfigError(message if message.startswith(prefix.split(".")[0].split("[")[0]) else f"{prefix}: {message}") from None


@dataclasses.dataclass(frozen=True)
class NoOptions:
    """The options of a plugin that takes none: an empty table, or none at all."""


def build_options(cls: type, data: dict[str, Any], prefix: str, owner: str, siblings: Iterable[type] = ()) -> Any:
    """``cls.Options`` from its table (less the name that chose ``cls``); keys only a sibling's Options declares are dropped.

    ``owner`` names ``cls`` in messages (``solver 'erm'``); ``siblings`` are the other classes a
    shared table may serve: a bench's base ``[solver]`` table holds primal-dual's settings beside
    erm variants, a ``[bench.executor]`` table slurm's beside a local try.
    """
    fields = {f.name for f in dataclasses.fields(cls.Options)}
    others = {f.name for sibling in siblings for f in dataclasses.fields(sibling.Options)} - fields
    options = {k: v for k, v in data.items() if k not in others}
    unknown = [k for k in options if k not in fields]
    if unknown:
        accepts = ", ".join(sorted(fields)) or "no options"
        lines = []
        for key in unknown:
            hint = closest(key, fields) or closest(key, others)  # a typo of another's key, in a shared table
            lines.append(f"unknown key {prefix}.{key}{hint} ({owner} accepts: {accepts})")
        raise ConfigError("\n".join(lines))
    return build_dataclass(cls.Options, options, prefix)


def build_solver_options(solver_cls: type, data: dict[str, Any], siblings: Iterable[type]) -> Any:
    """The solver's Options from a [solver] table less its name; keys only one of ``siblings`` (the other solvers) declares are dropped."""
    return build_options(solver_cls, data, "solver", f"solver {solver_cls.name!r}", siblings)


def flat_keys(table: Any, prefix: str = "", arrays: bool = True) -> dict[str, Any]:
    """Dotted keys for nested tables; an array of tables is numbered (constraints.0.alpha) unless ``arrays`` is false."""
    if arrays and isinstance(table, list) and table and all(isinstance(x, dict) for x in table):
        table = {str(i): x for i, x in enumerate(table)}
    if not isinstance(table, dict):
        return {prefix.rstrip("."): table}
    out: dict[str, Any] = {}
    for key, value in table.items():
        out.update(flat_keys(value, f"{prefix}{key}.", arrays))
    return out
