"""Which code made a run: recorded in results.json as ``code`` (beside ``machine``, where it trained), and inferred for runs recorded before it was.

from layerdescent.run.provenance import code, made_by, differ

code()           # {"version": "0.1.0", "commit": "fa5b81a...", "dirty": False}  (commit None outside a checkout;
                 #  a dirty tree adds "diff", a digest of its uncommitted change)
made_by(result, config)  # the record above, or what the files of an older run tell
"""

from __future__ import annotations

import functools
import hashlib
import json
import platform
import subprocess
from pathlib import Path

from layerdescent import __version__


@functools.lru_cache(maxsize=1)
def code() -> dict:
    """The package version and, when it is imported from a git checkout, the commit and whether tracked files differ from it."""
    here = Path(__file__).resolve().parent
    record = {"version": __version__, "commit": None, "dirty": None}
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=10)
        if commit.returncode != 0:  # an installed wheel: no checkout to name
            return record
        # untracked files (run folders, caches) are no code change; modified tracked ones are
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=here, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return record
    dirty = bool(status.stdout.strip()) if status.returncode == 0 else None
    record = {**record, "commit": commit.stdout.strip(), "dirty": dirty}
    if dirty:  # the uncommitted change itself, digested: runs of one dirty tree are still one code version
        diff = subprocess.run(["git", "diff", "HEAD", "--binary"], cwd=here, capture_output=True, timeout=30)
        record["diff"] = hashlib.sha256(diff.stdout).hexdigest()[:12] if diff.returncode == 0 else None
    return record


@functools.lru_cache(maxsize=1)
def machine() -> dict[str, str]:
    """What decides float results beside the code: the torch build, the CPU kernels it picked, and the CPU model.

    The same config and code give results that differ in their sixth or seventh digit on another
    CPU model, so a run records where it trained beside ``code``.
    """

    import torch

    cpuinfo = Path("/proc/cpuinfo")
    cpu = cpuinfo.read_text().split("\n\n")[0] if cpuinfo.exists() else platform.processor()
    fields = {key.strip(): value.strip() for key, _, value in (line.partition(":") for line in cpu.splitlines())}
    keep = ("model name", "cpu family", "model", "cache size")
    return {
        "torch": torch.__version__,
        "capability": torch.backends.cpu.get_cpu_capability(),
        "cpu": " / ".join(fields.get(k, "") for k in keep) if fields.get("model name") else platform.machine(),
    }


def _keys(value, prefix: str = "") -> list[str]:
    """Every dotted key of a nested table; a list's tables count once, as ``[]``."""
    if isinstance(value, dict):
        return [k for name, v in value.items() for k in [f"{prefix}{name}", *_keys(v, f"{prefix}{name}.")]]
    if isinstance(value, list) and value and isinstance(value[0], dict):
        return _keys(value[0], f"{prefix}[].")
    return []


def fingerprint(result: dict, config: dict) -> str:
    """A digest of the keys a run recorded (results.json and config.toml), less those that depend on its solver or constraints.

    Code that adds or renames an option or a result records other keys, so two runs whose
    fingerprints differ were made by different code; equal fingerprints do not prove the same code.
    """
    solver_bound = ("solver", "constraints", "label", "seed", "domains", "layerdescent", "code")
    keys = [k for k in _keys(config) if k.split(".")[0] not in solver_bound]
    keys += ["results." + k for k in _keys(result) if k.split(".")[0] not in solver_bound]
    return hashlib.sha256(json.dumps(sorted(set(keys))).encode()).hexdigest()[:8]


def made_by(result: dict, config: dict) -> dict:
    """The code that made a run: its recorded ``code`` where it has one (``inferred`` False), and always its files' fingerprint."""
    recorded = result.get("code")
    base = {"version": result.get("layerdescent", "unknown"), "commit": None, "dirty": None}
    if isinstance(recorded, dict) and recorded.get("commit"):
        base = {**base, **recorded}
    return {**base, "inferred": not base["commit"], "fingerprint": fingerprint(result, config)}


def describe(made: dict) -> str:
    """One code version in a few words: a commit (short, "+dirty" and the change's digest if so), else the version and fingerprint it was inferred from."""
    if made.get("commit"):
        return made["commit"][:7] + (f"+dirty {made.get('diff') or ''}".rstrip() if made.get("dirty") else "")
    return f"{made['version']}, keys {made['fingerprint']}"


def differ(made: list[dict]) -> bool:
    """Whether runs (their ``made_by`` records) were made by different code.

    Commits decide when every run recorded one, with the digest of a dirty tree's change (a dirty
    tree without one is never taken for the same code); otherwise versions and fingerprints decide,
    which can tell code apart but not prove it equal.
    """
    if all(m.get("commit") for m in made):
        if len(made) > 1 and any(m.get("dirty") and not m.get("diff") for m in made):
            return True
        return len({(m["commit"], m.get("diff") if m.get("dirty") else None) for m in made}) > 1
    return len({(m["version"], m["fingerprint"]) for m in made}) > 1
