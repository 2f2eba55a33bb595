"""Checkpoints: written atomically, read back as data (``weights_only``), checked before use."""

from __future__ import annotations

import contextlib
import errno
import os
import random
import re
import shutil
import signal
import tempfile
import threading
from collections.abc import Iterator
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
    with interrupts_held():
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as handle:
                try:
                    torch.save({"format": FORMAT, "version": VERSION, **payload}, handle)
                except RuntimeError as exc:
                    if "inline_container" not in str(exc) and "PytorchStreamWriter" not in str(exc):
                        raise
                    raise _write_error(handle, tmp, exc) from None
                handle.flush()
                os.fsync(handle.fileno())
            if path.exists():
                keep = f"{tmp}.prev"
                try:
                    os.link(path, keep)  # a second name for the current file: `path` never disappears
                except OSError:  # a filesystem without hard links
                    shutil.copy2(path, keep, follow_symlinks=False)
                os.replace(keep, previous_path(path))
            os.replace(tmp, path)
            _fsync_dir(path.parent)
        except BaseException:
            for leftover in (tmp, f"{tmp}.prev"):
                Path(leftover).unlink(missing_ok=True)
            raise


@contextlib.contextmanager
def interrupts_held() -> Iterator[None]:
    """Hold SIGINT and SIGTERM until the block ends, then deliver them: an interrupt stops the run after its checkpoint is written, not inside it.

    torch.save writes through the file's Python ``write``; a KeyboardInterrupt raised there comes
    back out of its C++ writer as an "unexpected pos" RuntimeError, a failed run instead of an
    interrupted one that resumes.
    """
    if threading.current_thread() is not threading.main_thread():  # only the main thread receives signals
        yield
        return
    held: list[int] = []
    previous = {signum: signal.signal(signum, lambda signum, _frame: held.append(signum)) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        for signum in dict.fromkeys(held):
            signal.raise_signal(signum)  # now to the handler the block held it from


def _write_error(handle: Any, tmp: str, exc: RuntimeError) -> OSError:
    """The OSError behind torch.save's "unexpected pos" (its writer hides errno): one more write to the same file tells it."""
    try:
        handle.write(b"\0" * 4096)
        handle.flush()
        os.fsync(handle.fileno())
    except OSError as cause:
        return OSError(cause.errno, cause.strerror, tmp)
    return OSError(errno.EIO, f"torch.save could not write the checkpoint ({(str(exc).splitlines() or [''])[0][:120]})", tmp)


def _fsync_dir(directory: Path) -> None:
    # The renames are durable only once the directory entry is on disk too.
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# What each kind of checkpoint must hold, and the type of each entry.
SCHEMAS: dict[str, dict[str, type | tuple[type, ...]]] = {
    "run": {
        "model": dict,
        "solver": dict,
        "problem": dict,
        "rng": list,
        "position": dict,
        "step_times": list,
        "skipped_steps": int,
        "metrics_offset": int,
    },
    "model": {"model": dict},
}
POSITION_KEYS = ("epoch", "micro", "step")


def load_checkpoint(path: Path, task: str, kind: str | None = None) -> dict[str, Any]:
    """Read a checkpoint of ``task`` (``kind`` "run" or "model" checks its entries too); any problem is one CheckpointError naming the file."""
    problem = _problem(path, task, kind)
    if isinstance(problem, dict):
        return problem
    previous = previous_path(path)
    hint = ""
    if previous.exists() and previous != path:
        if isinstance(_problem(previous, task, kind), dict):
            hint = f"; the checkpoint before it is intact: move {previous} to {path} and resume again"
        else:
            hint = f"; the checkpoint before it, {previous}, is damaged too: start the run again in a new --out"
    raise CheckpointError(f"checkpoint {path} {problem}{hint}")


def _problem(path: Path, task: str, kind: str | None) -> dict[str, Any] | str:
    """The checked payload at ``path``, or why it cannot be used."""
    try:
        with torch.serialization.safe_globals(SAFE_GLOBALS):
            payload = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise CheckpointError(f"no checkpoint at {path}: nothing to resume (run without --resume)") from None
    except Exception as exc:
        reason = (str(exc).splitlines() or [""])[0][:160]
        return f"cannot be read ({type(exc).__name__}: {reason}): it is truncated, damaged or not a layerdescent checkpoint"
    problem = _check_payload(payload, task) or (_check_entries(payload, kind) if kind else None)
    return payload if problem is None else problem


def _check_payload(payload: Any, task: str) -> str | None:
    """Why a loaded payload cannot be resumed from, or None."""
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        return "is not a layerdescent checkpoint"
    if payload.get("version") != VERSION:
        return f"has format version {payload.get('version')}; this layerdescent reads version {VERSION}"
    if payload.get("task") != task:
        return f"is for task {payload.get('task')!r}, not {task!r}"
    return None


def _check_entries(payload: dict[str, Any], kind: str) -> str | None:
    """Why a payload's entries (edited by hand, or another program's) cannot be used, or None."""
    for key, types in SCHEMAS[kind].items():
        value = payload.get(key)
        if key not in payload:
            return f"lacks its {key!r} entry: it was edited or written by another program"
        if not isinstance(value, types) or isinstance(value, bool):
            return f"has a {type(value).__name__} as its {key!r} entry, not a {types.__name__ if isinstance(types, type) else types}: it was edited or written by another program"
    bad = next((name for name, value in payload["model"].items() if not isinstance(value, torch.Tensor)), None)
    if bad is not None:
        return f"holds {bad!r} in its model as a {type(payload['model'][bad]).__name__}, not a tensor"
    nonfinite = next(
        (name for name, value in payload["model"].items() if value.is_floating_point() and not bool(torch.isfinite(value).all())), None
    )
    if nonfinite is not None:
        return f"holds non-finite (NaN or infinite) weights in {nonfinite!r}: the run diverged before it was written; resume from an earlier checkpoint or train again"
    if kind != "run":
        return None
    if not payload["rng"]:
        return "holds no RNG state ('rng' is empty): it was edited or written by another program"
    position = payload["position"]
    for key in POSITION_KEYS:
        value = position.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            return f"has position {key} = {value!r}; it must be an integer >= 0"
    if payload["metrics_offset"] < 0 or payload["skipped_steps"] < 0:
        return "has a negative metrics_offset or skipped_steps; it was edited by hand"
    return None


def save_model_file(path: Path, state: dict[str, torch.Tensor]) -> None:
    """Write a model's weights as safetensors, atomically (the file a finished run keeps for evaluation)."""
    from safetensors.torch import save_file

    # safetensors refuses tensors that share storage (tied weights); each gets its own copy.
    tensors = {name: value.detach().to("cpu").clone().contiguous() for name, value in state.items()}
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")  # a fresh file: never one a link points at
    os.close(fd)
    try:
        save_file(tensors, tmp)
        os.replace(tmp, path)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        code = re.search(r"os error (\d+)", str(exc))  # safetensors reports a failed write as its own error, errno in the text
        if code and not isinstance(exc, OSError):
            raise OSError(int(code[1]), os.strerror(int(code[1])), tmp) from None
        raise


def load_model_file(path: Path) -> dict[str, torch.Tensor]:
    """The weights :func:`save_model_file` wrote; any problem is one CheckpointError naming the file."""
    from safetensors.torch import load_file

    try:
        state = load_file(str(path))
    except FileNotFoundError:
        raise CheckpointError(f"no model file at {path}") from None
    except Exception as exc:
        raise CheckpointError(
            f"model file {path} cannot be read ({type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:160]}): it is truncated or damaged"
        ) from None
    nonfinite = next((name for name, value in state.items() if value.is_floating_point() and not bool(torch.isfinite(value).all())), None)
    if nonfinite is not None:
        raise CheckpointError(f"model file {path} holds non-finite (NaN or infinite) weights in {nonfinite!r}")
    return state


def load_model_state(path: Path, model: torch.nn.Module, state: dict[str, Any], task: str) -> None:
    """Load ``state`` into ``model``, or CheckpointError naming ``path`` when it belongs to another model."""
    try:
        model.load_state_dict(state)
    except (RuntimeError, KeyError, TypeError, ValueError) as exc:
        first = next((line.strip() for line in str(exc).splitlines()[1:] if line.strip()), str(exc).splitlines()[0] if str(exc) else "")
        raise CheckpointError(
            f"{path} does not fit this model ({first[:200]}): it was written by another config of task {task!r}"
        ) from None


def run_payload(
    task: str,
    model: torch.nn.Module,
    update: Any,
    schedule: Any,
    rngs: list[Any],
    position: dict[str, Any],
    step_times: list[float],
    skipped_steps: int,
    metrics_offset: int,
) -> dict[str, Any]:
    """What a run checkpoint holds: the model, the update's state (optimizers, multipliers, solver), the schedule, every rank's RNG, the position and the log's length."""
    schedule_state = {"schedule": schedule.state_dict()} if schedule is not None else {}
    payload = {"task": task, "model": model.state_dict(), **update.state_dict(), **schedule_state, "rng": rngs, "position": position}
    return {**payload, "step_times": step_times, "skipped_steps": skipped_steps, "metrics_offset": metrics_offset}


def restore_run(path: Path, state: dict[str, Any], model: torch.nn.Module, update: Any, rank: int, task: str, schedule: Any = None) -> None:
    """Put a run checkpoint's model, solver, multipliers, learning-rate schedule and this rank's RNG back, or one CheckpointError naming the file."""
    load_model_state(path, model, state["model"], task)
    try:
        update.load_state_dict(state)
        if schedule is not None and "schedule" in state:
            schedule.load_state_dict(state["schedule"])
        set_rng_state(state["rng"][rank % len(state["rng"])])  # one state per rank it ran with
    except (RuntimeError, KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        raise CheckpointError(
            f"checkpoint {path} holds solver, multiplier or RNG state this run cannot use ({type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:160]}); "
            f"it was written by another config or edited by hand"
        ) from None
