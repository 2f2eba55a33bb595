"""Every configuration key, read from the code: its type, default, allowed range and meaning.

    layerdescent config --defaults --task lista      # a complete run config at the defaults, commented
    layerdescent config --reference                  # the reference page, docs/reference/configuration.md

Types and defaults come from the config dataclasses, each solver's ``Options``, each constraint
kind's fields and each task's ``options``; a key's meaning is the docstring under its field (the
convention mkdocstrings renders too) or a task's ``option_help``; a number's range is found by
asking the dataclass which values it refuses, so the page cannot say what the checks do not do.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import struct
import textwrap
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Union

from layerdescent.errors import ConfigError
from layerdescent.options import choices, type_name
from layerdescent.registry import Registry, get_registry
from layerdescent.run.config import EvalConfig, RunConfig, TrainConfig, _option_type, check_seed, config_from_dict

# Ranges that probing one value at a time cannot find: one that depends on the machine (stated so
# that the page is the same everywhere), and checks on a list as a whole or against another table.
STATED_RANGES = {
    "train.threads": ">= 0, <= max(256, 4 x cores)",
    "solver.penalty_weights": "each >= 0, not all 0; one per layer 0..L",
    "solver.rho": "> 0",
    "solver.scale": ">= 0",
    "constraints.levels": '`"band"`, or a list of levels of `train.train_gamma`\'s band',
    "constraints.layers": "each in 1..L or -L..-1, none twice",
}
DEFAULT_TASK = "lista"  # the task `config --defaults` fills in: it needs nothing fetched or installed


@dataclass(frozen=True)
class Key:
    """One configuration key as the reference shows it."""

    name: str  # as written in its table, e.g. ``lr``
    type: str
    default: Any  # None: unset
    range: str
    meaning: str


def attribute_docs(cls: type) -> dict[str, str]:
    """The first line of the docstring under each annotated field of ``cls`` and its bases."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass is object or not dataclasses.is_dataclass(klass):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError, SyntaxError):  # no source (a compiled-only plugin): no meanings
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for node, after in zip(body, body[1:]):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(after, ast.Expr):
                if isinstance(after.value, ast.Constant) and isinstance(after.value.value, str):
                    docs[node.target.id] = after.value.value.strip().splitlines()[0]
    return docs


def dataclass_keys(cls: type, prefix: str, skip: tuple[str, ...] = ()) -> list[Key]:
    """The keys of a config dataclass (a table, a solver's Options, a constraint kind)."""
    hints, docs = typing.get_type_hints(cls), attribute_docs(cls)
    keys = []
    for f in dataclasses.fields(cls):
        if not f.init or f.name in skip:
            continue
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        default = None if default is dataclasses.MISSING else default
        make = _maker(cls, f.name)
        span = STATED_RANGES.get(f"{prefix}.{f.name}") or _range(hints[f.name], make, default)
        keys.append(Key(f.name, _type_label(hints[f.name]), default, span, docs.get(f.name, "")))
    return keys


def task_keys(task_cls: type) -> list[Key]:
    """A task's ``[task]`` keys: ``perturbation`` and its options, with their ``option_help``."""
    choices = ", ".join(f"`{p}`" for p in task_cls.perturbations)
    keys = [
        Key(
            "perturbation", "a string", task_cls.perturbations[0], f"one of {choices}", "The shift gamma scales in training and evaluation."
        )
    ]
    for name, default in task_cls.options.items():
        option_type = _option_type(default)
        keys.append(
            Key(name, "anything" if option_type is None else _type_label(option_type), default, "", task_cls.option_help.get(name, ""))
        )
    return keys


def top_level_keys() -> list[Key]:
    """``seed`` and ``label``, the keys outside every table."""
    docs = attribute_docs(RunConfig)
    seed_range = _range(int, lambda v: check_seed(v, "seed"), 0)
    return [
        Key("seed", "an integer", 0, seed_range, docs["seed"]),
        Key("label", "a string", "", "one path component: no `/`, not `.` or `..`, at most 200 bytes", docs["label"]),
    ]


def reference_markdown(registry: Registry | None = None) -> str:
    """The configuration reference page: a table per config table, task, solver and constraint kind."""
    registry = registry or get_registry()
    out = [
        "# Configuration reference",
        "",
        "<!-- Generated by `layerdescent config --reference` from the code; do not edit by hand. -->",
        "",
        "Every key a run config accepts, read from the code: its type, its default, the values the",
        "checks allow, and what it means. `layerdescent config --defaults [--task NAME] [--solver NAME]`",
        "prints the same keys as a complete TOML file at their defaults. An unknown key, a wrong type",
        "or a value out of range is one line on stderr and exit status 2, before anything trains.",
        "",
        "## Top level",
        "",
        *_table(top_level_keys()),
        "## [task]",
        "",
        "`name` picks a registered task (`layerdescent list`); every other key is one of its options.",
        "",
    ]
    for name, task_cls in sorted(registry.tasks.items()):
        out += [f"### task `{name}`", "", _first_line(task_cls.__doc__), "", *_table(task_keys(task_cls))]
    out += ["## [train]", "", _first_line(TrainConfig.__doc__), "", *_table(dataclass_keys(TrainConfig, "train"))]
    out += _plugins_with_options(
        "[solver]",
        "`name` picks a registered solver (default `primal-dual`); the other keys are that solver's options.",
        registry.solvers,
        "solver",
    )
    out += [
        "## [[constraints]]",
        "",
        "Any number of tables, none by default; `kind` picks a registered constraint kind, each gets its own multipliers.",
        "",
    ]
    for kind, spec_cls in sorted(registry.constraints.items()):
        out += [f"### kind `{kind}`", "", _first_line(spec_cls.__doc__), "", *_table(dataclass_keys(spec_cls, "constraints"))]
    out += ["## [eval]", "", _first_line(EvalConfig.__doc__), "", *_table(dataclass_keys(EvalConfig, "eval"))]
    out += _plugins_with_options(
        "[train.trackers.NAME]",
        "`train.trackers` names trackers in a list, each at its defaults, or as tables of their options, checked when the run trains.",
        registry.trackers,
        "train.trackers",
    )
    out += _plugins_with_options(
        "[bench.executor]",
        "In a bench file: `name` picks a registered executor (default `local`; `--executor` overrides it); the other keys are its options.",
        registry.executors,
        "bench.executor",
    )
    return "\n".join(out).rstrip("\n") + "\n"


def _plugins_with_options(title: str, intro: str, table: dict[str, type], prefix: str) -> list[str]:
    """The section of a config table whose plugins (solvers, trackers, executors) each bring options: one table per plugin."""
    what = prefix.split(".")[-1].removesuffix("s")  # solver, tracker, executor
    out = [f"## {title}", "", intro, ""]
    for name, cls in sorted(table.items()):
        keys = dataclass_keys(cls.Options, prefix)
        out += [f"### {what} `{name}`", "", _first_line(cls.__doc__), ""]
        out += _table(keys) if keys else ["No options.", ""]
    return out


def default_config(task: str = DEFAULT_TASK, solver: str = "primal-dual", registry: Registry | None = None) -> RunConfig:
    """The run config with every key at its default, for ``task`` and ``solver``, and one default ``descent`` constraint."""
    # primal-dual needs a constraint, and every solver logs it: one descent at its defaults is the smallest useful run
    return config_from_dict({"task": {"name": task}, "solver": {"name": solver}, "constraints": [{"kind": "descent"}]}, registry)


def defaults_toml(task: str = DEFAULT_TASK, solver: str = "primal-dual", registry: Registry | None = None) -> str:
    """A complete run config at the defaults, each key commented with its meaning; `layerdescent run` takes it as it is."""
    registry = registry or get_registry()
    config = default_config(task, solver, registry)
    task_cls, solver_cls = registry.task(config.task.name), registry.solver(config.solver.name)
    spec = config.constraints[0]
    lines = [
        f"# layerdescent config --defaults --task {config.task.name} --solver {config.solver.name}",
        "# Every key at its default; `layerdescent config --reference` gives each key's type and range.",
        "",
    ]
    values = {"seed": config.seed, "label": config.label}
    lines += _toml_lines(top_level_keys(), values)
    lines += ["", "[task]", _toml_line("name", config.task.name, "a registered task (`layerdescent list`)")]
    lines += _toml_lines(task_keys(task_cls), config.task.options)
    lines += ["", "[train]", *_toml_lines(dataclass_keys(TrainConfig, "train"), dataclasses.asdict(config.train))]
    lines += ["", "[solver]", _toml_line("name", config.solver.name, "erm | penalty | primal-dual, or a plugin's")]
    lines += _toml_lines(dataclass_keys(solver_cls.Options, "solver"), dataclasses.asdict(config.solver.options))
    lines += ["", "[[constraints]]".ljust(30) + "  # none by default (primal-dual needs one): a descent constraint at its defaults"]
    lines += [_toml_line("kind", spec.kind, "a registered constraint kind")]
    lines += _toml_lines(dataclass_keys(type(spec), "constraints"), dataclasses.asdict(spec))
    lines += ["", "[eval]", *_toml_lines(dataclass_keys(EvalConfig, "eval"), dataclasses.asdict(config.eval))]
    return "\n".join(lines) + "\n"


def _toml_lines(keys: list[Key], values: dict[str, Any]) -> list[str]:
    return [_toml_line(k.name, values[k.name], k.meaning) for k in keys]


def _toml_line(name: str, value: Any, meaning: str) -> str:
    if value is None:  # TOML has no null: an unset key is a comment
        return f"# {name} (unset)".ljust(30) + f"  # {meaning}".rstrip()
    return f"{name} = {_toml_value(value)}".ljust(30) + (f"  # {meaning}" if meaning else "")


def _toml_value(value: Any) -> str:
    import tomli_w

    if isinstance(value, (list, tuple)):  # on one line, as a person writes a short array
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return tomli_w.dumps({"v": value}).strip()[len("v = ") :]


def _type_label(tp: Any) -> str:
    """A key's type in words; the choices of a string go in the range column."""
    origin = typing.get_origin(tp)
    if choices(tp):
        return "a string"
    if origin in (Union, types.UnionType):
        return " or ".join(dict.fromkeys(_type_label(a) for a in typing.get_args(tp) if a is not type(None)))
    if origin is tuple:
        item = _type_label(typing.get_args(tp)[0])
        return "a list of " + {"an integer": "integers", "a number": "numbers", "a string": "strings", "true or false": "booleans"}.get(
            item, item
        )
    return type_name(tp)


def _table(keys: list[Key]) -> list[str]:
    rows = ["| key | type | default | allowed | meaning |", "|---|---|---|---|---|"]
    for k in keys:
        default = "unset" if k.default is None else f"`{_toml_value(k.default)}`"
        rows.append(f"| `{k.name}` | {_cell(k.type)} | {_cell(default)} | {_cell(k.range)} | {_cell(k.meaning)} |")
    return [*rows, ""]


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _first_line(doc: str | None) -> str:
    return (doc or "").strip().splitlines()[0] if doc and doc.strip() else ""


def _maker(cls: type, name: str) -> Callable[[Any], Any]:
    return lambda value: cls(**{name: value})


def _range(tp: Any, make: Callable[[Any], Any], default: Any) -> str:
    """What ``make`` accepts for a key of type ``tp``: choices, or the bounds of its numbers."""
    origin = typing.get_origin(tp)
    if allowed := choices(tp):
        return ("one of " if len(allowed) > 1 else "") + ", ".join(f"`{_toml_value(a)}`" for a in allowed)
    if origin in (Union, types.UnionType):
        parts = [_range(a, make, default) for a in typing.get_args(tp) if a is not type(None)]
        return "; or ".join(p for p in parts if p)
    if origin is tuple:
        item = typing.get_args(tp)[0]
        each = _range(item, lambda v: make((v,)), None)
        return f"each {each}" if each else ""
    if tp in (int, float):
        return _bounds(tp, make, default)
    return ""


def _accepts(make: Callable[[Any], Any], value: Any) -> bool:
    try:
        make(value)
    except (ConfigError, TypeError, ValueError):
        return False
    return True


# Floats in order as 64-bit integers, so that bisection finds the exact last accepted value.
def _float_key(x: float) -> int:
    bits = struct.unpack("<q", struct.pack("<d", x))[0]
    return bits if bits >= 0 else -(bits & 0x7FFF_FFFF_FFFF_FFFF)


def _key_float(k: int) -> float:
    return struct.unpack("<d", struct.pack("<q", k) if k >= 0 else struct.pack("<Q", (-k) | (1 << 63)))[0]


def _bounds(tp: type, make: Callable[[Any], Any], default: Any) -> str:
    if tp is float:
        to, back, far = _float_key, _key_float, 1.7976931348623157e308
    else:
        to, back, far = int, int, 2**63
    start = default if isinstance(default, (int, float)) and not isinstance(default, bool) and _accepts(make, tp(default)) else None
    if start is None:  # no accepted default to start from (a tuple's element): try the usual starts
        start = next((v for v in (0, 1, 0.5) if _accepts(make, tp(v))), None)
        if start is None:
            return ""
    edges = []
    for direction in (-1, 1):
        end = tp(direction * far)
        if _accepts(make, end):
            edges.append(None)
            continue
        inside, outside = to(tp(start)), to(end)  # bisect: the last accepted value and the first refused one
        while abs(outside - inside) > 1:
            middle = (inside + outside) // 2
            inside, outside = (middle, outside) if _accepts(make, tp(back(middle))) else (inside, middle)
        edges.append((tp(back(inside)), tp(back(outside))))
    return _describe(edges[0], edges[1])


def _plain(x: float | int) -> str:
    return f"{x:,}" if isinstance(x, int) and abs(x) >= 10_000 else f"{x:g}"


def _closed(accepted: float | int, refused: float | int) -> bool:
    """Whether the check was written at the accepted value (>= 1) rather than at the refused one (> 0): the one that reads shorter."""
    return isinstance(accepted, int) or len(repr(accepted)) <= len(repr(refused))


def _describe(low: tuple | None, high: tuple | None) -> str:
    parts = []
    if low is not None:
        accepted, refused = low
        parts.append(f">= {_plain(accepted)}" if _closed(accepted, refused) else f"> {_plain(refused)}")
    if high is not None:
        accepted, refused = high
        parts.append(f"<= {_plain(accepted)}" if _closed(accepted, refused) else f"< {_plain(refused)}")
    return ", ".join(parts)
