"""The fenced code blocks of the README and docs/, and how each language is run or checked in the test suite."""

from __future__ import annotations

import os
import re
import shlex
import sys
import types
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```(\S*)\n(.*?)^```$", re.S | re.M)
# Commands a shell block may run besides layerdescent's own, which are parsed by its CLI.
OTHER_COMMANDS = {"pip", "python", "torchrun", "srun", "accelerate", "tensorboard", "mlflow"}


@dataclass(frozen=True)
class Block:
    """One fenced block: where it is, its language, the marker comment above it, its text."""

    page: Path
    line: int
    lang: str
    marker: str
    code: str

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """Every fenced block of ``page``, in order."""
    text = page.read_text()
    found = []
    for match in FENCE.finditer(text):
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = m.group(1) if (m := re.fullmatch(r"<!-- (\S+) -->", before)) else ""
        found.append(Block(page, text.count("\n", 0, match.start()) + 1, match.group(1), marker, match.group(2)))
    return found


def run_python(block: Block, name: str = "docs_block") -> dict:
    """Execute a python block as a module of its own (dataclasses look their module up); its namespace."""
    module = types.ModuleType(name)
    sys.modules[name] = module
    try:
        exec(compile(block.code, block.where, "exec"), module.__dict__)
    finally:
        del sys.modules[name]
    return module.__dict__


def check_toml(block: Block) -> None:
    """A TOML block is a run config, a bench file or table of one, or a plugin's pyproject.toml; each is validated as such."""
    import layerdescent as ld
    from layerdescent.analysis.endpoints_file import parse_spec
    from layerdescent.run.config_file import tomllib

    table = tomllib.loads(block.code)
    if "project" in table:
        assert "layerdescent" in table["project"]["entry-points"], f"{block.where}: a plugin's pyproject names the layerdescent group"
        return
    bench = table.pop("bench", None)
    if bench is not None and "variants" in bench:
        parse_spec(bench, list(bench["variants"]))
    if "task" in table:
        ld.config_from_dict(table)
    else:
        assert bench is not None and not table, f"{block.where}: a TOML block that is neither a run config, a bench table nor a pyproject"


def check_shell(block: Block) -> None:
    """Each command of a shell block: layerdescent's parsed by its own CLI, pip's extras and scripts' paths checked to exist."""
    from layerdescent.cli import build_parser
    from layerdescent.run.config_file import tomllib

    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    text = block.code.replace("\\\n", " ")
    for raw in text.splitlines():
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        for command in (c.strip() for c in line.split("&&")):
            if "layerdescent.cli" in command:  # torchrun / srun: the part after -m layerdescent.cli is a layerdescent command
                command = "layerdescent " + command.split("layerdescent.cli", 1)[1].strip().rstrip("'")
            command = command.split(" > ", 1)[0]  # a redirection is the shell's, not the command's
            words = shlex.split(command.replace("$(", "").replace(")", ""))
            if words[0] == "layerdescent":
                try:
                    build_parser().parse_args(words[1:])
                except SystemExit as exc:
                    raise AssertionError(f"{block.where}: `{command}` is not a valid layerdescent command") from exc
            elif words[0] == "pip":
                for extra in re.findall(r"\[([a-z,]+)\]", command):
                    assert set(extra.split(",")) <= extras, f"{block.where}: no extra {extra!r} in pyproject.toml"
                for pin in re.findall(r"ruff[<>=!,.0-9]+", command):
                    assert pin in (ROOT / ".ci" / "run").read_text(), f"{block.where}: {pin} is not the ruff that .ci/run installs"
            elif words[0] == "ruff":  # the style CI checks: its configuration, and the version .ci/run pins
                assert words[1] in ("check", "format") and "ruff" in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"], (
                    block.where
                )
            elif words[0] == "python" and words[1].endswith(".py"):
                assert (ROOT / words[1]).is_file(), f"{block.where}: {words[1]} does not exist"
            else:
                assert words[0] in OTHER_COMMANDS, f"{block.where}: `{words[0]}` is a command the docs tests do not know how to check"


def _string_literals() -> set[str]:
    """Every string constant in the package's source: what a run can name a file."""
    import ast

    found: set[str] = set()
    for path in (ROOT / "src" / "layerdescent").rglob("*.py"):
        found |= {n.value for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    return found


def _classes() -> dict[str, list[type]]:
    """The package's classes by name, from every module (the optional fronts' where their libraries are installed)."""
    import importlib
    import inspect
    import pkgutil

    import layerdescent

    found: dict[str, list[type]] = {}
    for info in pkgutil.walk_packages(layerdescent.__path__, "layerdescent."):
        if info.name.endswith("__main__"):  # runs the command line
            continue
        try:
            module = importlib.import_module(info.name)
        except ImportError:  # an optional front whose library is missing
            continue
        for name, value in vars(module).items():
            if inspect.isclass(value) and value.__module__ == info.name:
                found.setdefault(name, []).append(value)
    return found


OUTSIDE_NAMES = {"TensorBoard", "DeepSpeed", "LightningModule"}  # products a diagram may name beside the package's classes


def check_text(block: Block) -> None:
    """A text block says what the code is: each file a run writes is named in the source, each Class.attribute exists, each layer is a contract's."""
    code = block.code
    named = re.findall(r"RUN_DIR/([\w.]+)", code)
    if named:
        literals = _string_literals()
        for name in named:
            assert name in literals or f"{name}/" in literals, f"{block.where}: RUN_DIR/{name} is not a name the code writes"
    references = re.findall(r"\b([A-Z][a-z]+[A-Za-z]*)\.([a-z_]+)\b", code)  # Trainer.step, not REPORT.md
    camel = set(re.findall(r"\b([A-Z][a-z]+[A-Z][A-Za-z]*)\b", code)) - OUTSIDE_NAMES  # RunConfig, LayerwiseUpdate
    if references or camel:
        classes = _classes()
        for cls, attr in references:
            assert cls in classes, f"{block.where}: {cls} is no class of the package"
            assert any(hasattr(c, attr) for c in classes[cls]), f"{block.where}: {cls} has no {attr!r}"
        for cls in camel:
            assert cls in classes, f"{block.where}: {cls} is no class of the package"
    layers = re.findall(r"^([a-z]+)(?: [│|] ([a-z]+))?\s{2,}", code, re.M)
    if layers:
        contract = (ROOT / ".importlinter").read_text().split("layers =", 1)[1].split("\n\n", 1)[0]
        declared = [line.strip().split()[0].removeprefix("layerdescent.") for line in contract.strip().splitlines()]
        drawn = [first for first, _ in layers]
        assert drawn[:-1] == declared[:-1], f"{block.where}: the layers drawn {drawn} are not .importlinter's {declared}"
    status = re.findall(r"^\S+ seed \d+: (\w+)", code, re.M)
    if status:
        from layerdescent.bench.status import STATES

        assert set(status) <= set(STATES), f"{block.where}: {sorted(set(status) - set(STATES))} are no run states of bench --status"
    assert named or references or camel or layers or status, f"{block.where}: a text block the docs tests cannot check; say what it shows"


def in_tmp(path: Path):
    """A context manager that runs a block in ``path`` (blocks may write files, e.g. ./hf-run)."""
    import contextlib

    @contextlib.contextmanager
    def inside():
        before = os.getcwd()
        os.chdir(path)
        try:
            yield
        finally:
            os.chdir(before)

    return inside()
