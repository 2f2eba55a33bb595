"""Checkpoints: written atomically, read back as data (``weights_only``), checked before use."""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from cooper.optim import nuPIInitType

from layerdescent.errors import CheckpointError

FORMAT = "layerdescent-checkpoint"
VERSION = 2  # 2: one RNG state per data-parallel rank
# The only non-builtin type the project itself puts in a checkpoint (nuPI's param groups).
SAFE_GLOBALS = [nuPIInitType]


def rng_state() -> dict[str, Any]:
    """Python, numpy and torch RNG states, in types ``weights_only`` loading accepts."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": (kind, torch.from_numpy(keys.copy()), pos, has_gauss, cached),
        "torch": torch.get_rng_state(),
    }


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` captured."""
    random.setstate(state["python"])
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy(), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])


def previous_path(path: Path) -> Path:
    """Where the checkpoint before the latest one is kept."""
    return path.with_name(path.stem + ".prev" + path.suffix)


def save_checkpoint(path: Path, payload: dict[str, Any]) -> None:
    """Write ``payload`` so that ``path`` is always a whole checkpoint, old or new.

    The new checkpoint goes to a temporary file, reaches the disk, then replaces ``path`` in one
    rename; the one it replaces stays as ``previous_path(path)``, so a checkpoint damaged later
    (a full disk, a copy cut short) never leaves a run without a good one.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            torch.save({"format": FORMAT, "version": VERSION, **payload}, handle)
            handle.flush()
            os.fsync(handle.fileno())
        if path.exists():
            keep = f"{tmp}.prev"
            try:
                os.link(path, keep)  # a second name for the current file: `path` never disappears
            except OSError:  # a filesystem without hard links
                shutil.copy2(path, keep)
            os.replace(keep, previous_path(path))
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    except BaseException:
        for leftover in (tmp, f"{tmp}.prev"):
            Path(leftover).unlink(missing_ok=True)
        raise


def _fsync_dir(directory: Path) -> None:
    # The renames are durable only once the directory entry is on disk too.
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def load_checkpoint(path: Path, task: str) -> dict[str, Any]:
    """Read a checkpoint of ``task``; any problem is one CheckpointError naming the file."""
    try:
        with torch.serialization.safe_globals(SAFE_GLOBALS):
            payload = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise CheckpointError(f"no checkpoint at {path}: nothing to resume (run without --resume)") from None
    except Exception as exc:
        reason = (str(exc).splitlines() or [""])[0][:160]
        problem = f"cannot be read ({type(exc).__name__}: {reason}): it is truncated, damaged or not a layerdescent checkpoint"
    else:
        problem = _check_payload(payload, task)
    if problem is None:
        return payload
    previous = previous_path(path)
    hint = f"; the checkpoint before it is intact: move {previous} to {path} and resume again" if previous.exists() and previous != path else ""
    raise CheckpointError(f"checkpoint {path} {problem}{hint}")


def _check_payload(payload: Any, task: str) -> str | None:
    """Why a loaded payload cannot be resumed from, or None."""
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        return "is not a layerdescent checkpoint"
    if payload.get("version") != VERSION:
        return f"has format version {payload.get('version')}; this layerdescent reads version {VERSION}"
    if payload.get("task") != task:
        return f"is for task {payload.get('task')!r}, not {task!r}"
    return None
