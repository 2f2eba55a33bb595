"""Checkpoints: written atomically, read back as data (``weights_only``), checked before use."""

from __future__ import annotations

import os
import random
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from cooper.optim import nuPIInitType

from layerdescent.errors import CheckpointError

FORMAT = "layerdescent-checkpoint"
VERSION = 1
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


def save_checkpoint(path: Path, payload: dict[str, Any]) -> None:
    """Write ``payload`` so that ``path`` is always either the old or the new checkpoint."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            torch.save({"format": FORMAT, "version": VERSION, **payload}, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_checkpoint(path: Path, task: str) -> dict[str, Any]:
    """Read a checkpoint of ``task``; any problem is one CheckpointError naming the file."""
    try:
        with torch.serialization.safe_globals(SAFE_GLOBALS):
            payload = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise CheckpointError(f"no checkpoint at {path}: nothing to resume (run without --resume)") from None
    except Exception as exc:
        raise CheckpointError(f"checkpoint {path} cannot be read ({type(exc).__name__}: {str(exc).splitlines()[0][:200]}); it is truncated or not a layerdescent checkpoint") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a layerdescent checkpoint")
    if payload.get("version") != VERSION:
        raise CheckpointError(f"checkpoint {path} has format version {payload.get('version')}; this layerdescent reads version {VERSION}")
    if payload.get("task") != task:
        raise CheckpointError(f"checkpoint {path} is for task {payload.get('task')!r}, not {task!r}")
    return payload
