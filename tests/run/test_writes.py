"""Every file layerdescent writes goes through a safe writer: a meta-test finds each write in the package and fails on one that bypasses them."""

from __future__ import annotations

import ast
from pathlib import Path

import layerdescent

PACKAGE = Path(layerdescent.__file__).parent

# Calls that create, replace or write a file, by their dotted name as written in the source.
WRITING_CALLS = {
    "open",  # with a mode that writes (checked below)
    "os.open",  # with flags that write (checked below)
    "os.replace",
    "os.rename",
    "os.link",
    "os.symlink",
    "shutil.copy",
    "shutil.copy2",
    "shutil.copyfile",
    "shutil.copyfileobj",
    "shutil.move",
    "tempfile.mkstemp",
    "torch.save",
    "np.save",
}
WRITING_METHODS = {"write_text", "write_bytes", "savefig", "symlink_to", "hardlink_to", "touch"}

# The writers, each with why its writes are safe; every other module writes through them.
# Keyed by (module, enclosing function): a new write elsewhere fails, and so does an entry no longer needed.
SAFE_WRITERS = {
    (
        "run/files.py",
        "write_atomic",
    ): "the writer: a fresh temporary file, then an atomic replace (a link there is replaced, never followed)",
    (
        "run/checkpoint.py",
        "save_checkpoint",
    ): "checkpoints: a fresh temporary file, fsynced, then an atomic replace; the previous one kept by a hard link or a copy that follows no link",
    ("run/checkpoint.py", "save_model_file"): "the model's weights: a fresh temporary file, then an atomic replace",
    ("run/publish.py", "Publication.write"): "a report's files go to the publication's private stage folder",
    (
        "run/publish.py",
        "Publication._move_in",
    ): "the stage's files replace only layerdescent's own (checked against its manifest) by an atomic replace",
    ("analysis/plots.py", "save_png"): "a figure into the folder a report stages (Publication.stage) or a tracker's temporary folder",
    ("assets.py", "fetch"): "the asset cache (outside any run): a download checked against its sha256, then moved in",
    ("assets.py", "_write"): "extraction into the cache's own folder, each member checked to land inside it",
    ("assets.py", "_held"): "the cache's lock file, in the cache's own folder",
    ("assets.py", "_extract_held"): "the cache's done stamp, in the cache's own folder",
    (
        "integrations/hf.py",
        "DescentTrainer._save_optimizer_and_scheduler",
    ): "the Trainer's own checkpoint-N folder, which the Trainer writes",
    ("bench/trackers.py", "_MLflow.close"): "a copy into a temporary folder of its own, for MLflow's artifacts",
    ("distributed.py", "World.gather"): "torch.save into an in-memory buffer (no file)",
    ("run/trainer.py", "Trainer._open"): "os.devnull on ranks other than 0, which write no log",
}


def _name(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_name(node.value)}.{node.attr}"
    return ""


def _writes(call: ast.Call) -> bool:
    name = _name(call.func)
    if name == "open":  # the builtin: only a mode that writes
        mode = call.args[1] if len(call.args) > 1 else next((k.value for k in call.keywords if k.arg == "mode"), None)
        return isinstance(mode, ast.Constant) and any(c in str(mode.value) for c in "wax+")
    if name == "os.open":
        flags = ast.unparse(call.args[1]) if len(call.args) > 1 else ""
        return any(flag in flags for flag in ("O_WRONLY", "O_RDWR", "O_CREAT", "O_APPEND"))
    if name in WRITING_CALLS:
        return True
    if isinstance(call.func, ast.Attribute) and call.func.attr in WRITING_METHODS:
        return True
    return (
        isinstance(call.func, ast.Attribute)
        and call.func.attr == "open"
        and any(isinstance(a, ast.Constant) and any(c in str(a.value) for c in "wax+") for a in call.args)
    )


def _writes_in_package() -> dict[tuple[str, str], list[str]]:
    """Each (module, enclosing function) that writes, with the calls."""
    found: dict[tuple[str, str], list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = path.relative_to(PACKAGE).as_posix()
        stack: list[tuple[ast.AST, tuple[str, ...]]] = [(ast.parse(path.read_text()), ())]
        while stack:
            node, where = stack.pop()
            for child in ast.iter_child_nodes(node):
                inside = (*where, child.name) if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) else where
                if isinstance(child, ast.Call) and _writes(child):
                    found.setdefault((module, ".".join(where) or "<module>"), []).append(f"line {child.lineno}: {ast.unparse(child.func)}")
                stack.append((child, inside))
    return found


def test_every_write_in_the_package_goes_through_a_safe_writer():
    found = _writes_in_package()
    bypassing = {where: calls for where, calls in found.items() if where not in SAFE_WRITERS}
    assert not bypassing, (
        f"these write files without the run directory's safe writer (run/files.py: write_atomic, write_output, open_own): {bypassing}"
    )
    stale = sorted(set(SAFE_WRITERS) - set(found))
    assert not stale, f"SAFE_WRITERS names places that no longer write: {stale}"


def test_the_meta_test_finds_a_write_that_bypasses_the_writers(tmp_path):
    source = "from pathlib import Path\n\ndef save(out):\n    Path(out).write_text('x')\n    open(out, 'w')\n    open(out)\n"
    calls = [node for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Call) and _writes(node)]
    assert [ast.unparse(c.func) for c in calls] == ["Path(out).write_text", "open"]  # the read-only open is not a write
