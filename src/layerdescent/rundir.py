"""The run directory as a resource: its lock, what it may already hold, and whether its recorded config is the one asked for.

    with locked(run_dir) as was_run:     # one process at a time; the lock dies with its holder
        refuse_foreign(run_dir, was_run)  # never overwrite files a person put there
        ...
    config_difference(recorded_table, config)   # "train.lr (recorded 0.003, asked 0.01)" or None
"""

from __future__ import annotations

import errno
import fcntl
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from layerdescent.errors import ConfigError, LayerdescentError

LOCK = ".layerdescent.lock"  # also marks the directory as a run's, even before its first checkpoint
WRITES = ("config.toml", "metrics.jsonl", "checkpoint.pt", "checkpoint.prev.pt", "best.pt", "results.json", "model.safetensors")
FINISHED = ("checkpoint.pt", "results.json")  # a directory holding one of these is a run, lock file or not (older runs)
# How a run executes, not what it computes: a finished run is the same run whatever these say.
EXECUTION_KEYS = ("train.threads", "train.progress", "train.keep_checkpoint", "train.trackers")


TRACKER_STORES = ("mlruns",)  # the default MLflow store keeps a copy of each results.json as an artifact


def result_files(root: Path) -> list[Path]:
    """Every run's results.json under ``root``, without the copies a tracker's store holds."""
    root = Path(root)
    return sorted(p for p in root.rglob("results.json") if not set(p.relative_to(root).parts[:-1]) & set(TRACKER_STORES))


def usable_dir(path: Path, what: str = "--out") -> Path:
    """``path`` as an existing directory (created if needed), or ConfigError saying why it cannot be one."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise ConfigError(f"{what} {path} is a file, not a directory: --out a directory") from None
    except NotADirectoryError:
        raise ConfigError(f"{what} {path} lies under a file, not a directory: --out a directory") from None
    except OSError as exc:
        raise ConfigError(f"{what} {path} cannot be created: {exc.strerror or exc}") from None
    if not path.is_dir():
        raise ConfigError(f"{what} {path} is not a directory: --out a directory")
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(f"{what} {path} is not writable: --out a directory you can write to")
    return path


@contextmanager
def locked(run_dir: Path) -> Iterator[bool]:
    """Hold ``run_dir``'s lock for the block (ConfigError when another process holds it); yields whether it was a run already."""
    try:
        created = not run_dir.exists()
    except OSError as exc:  # a name too long for the filesystem
        raise ConfigError(f"--out {run_dir} cannot be created: {exc.strerror or exc}") from None
    usable_dir(run_dir)
    path = run_dir / LOCK
    was_run = path.exists() or any((run_dir / name).exists() for name in FINISHED)
    present = {name for name in WRITES if (run_dir / name).exists()}
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise ConfigError(f"cannot create the lock file {path}: {exc.strerror or exc}") from None
    try:
        # flock dies with the process that holds it, so a SIGKILLed run never leaves a stale lock.
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise ConfigError(f"{run_dir} is in use by another layerdescent process (pid {holder}): wait for it to finish, or --out another directory") from None
        raise ConfigError(f"cannot lock {path}: {exc.strerror or exc}") from None
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        try:
            yield was_run
        except LayerdescentError:
            if not was_run and {name for name in WRITES if (run_dir / name).exists()} == present:
                path.unlink(missing_ok=True)  # refused before writing anything: leave the directory as it was
                if created:
                    try:
                        run_dir.rmdir()
                    except OSError:
                        pass  # something else appeared in it
            raise
    finally:
        os.close(fd)


def refuse_foreign(run_dir: Path, was_run: bool) -> None:
    """Raise ConfigError when ``run_dir`` is not a run but holds a file a run would overwrite."""
    if was_run:
        return
    present = [name for name in WRITES if (run_dir / name).exists()]
    if present:
        raise ConfigError(f"{run_dir} is not a run directory but holds {present[0]}, which the run would overwrite: --out an empty or new directory")


def _flat(table: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted keys for nested tables; constraints are numbered: constraints.0.alpha."""
    if isinstance(table, list) and table and all(isinstance(x, dict) for x in table):
        table = {str(i): x for i, x in enumerate(table)}
    if not isinstance(table, dict):
        return {prefix.rstrip("."): table}
    out: dict[str, Any] = {}
    for key, value in table.items():
        out.update(_flat(value, f"{prefix}{key}."))
    return out


def config_difference(recorded: dict[str, Any], wanted: Any, registry: Any = None) -> str | None:
    """The first key on which a recorded config table differs from RunConfig ``wanted`` (defaults filled in), or None.

    Both sides go through the same validation, so a run recorded before an option existed, whose
    table lacks the key, compares equal to a config that leaves the option at its default.
    """
    from layerdescent.config import config_from_dict

    try:
        resolved = config_from_dict(recorded, registry).as_dict()
    except LayerdescentError as exc:
        return f"the recorded config no longer loads ({(str(exc).splitlines() or [''])[0]})"
    have, want = _flat(resolved), _flat(wanted.as_dict())
    missing = object()
    for key in dict.fromkeys([*want, *have]):
        if key in EXECUTION_KEYS:
            continue
        a, b = have.get(key, missing), want.get(key, missing)
        if a != b:
            show = lambda v: "unset" if v is missing else repr(v)  # noqa: E731
            return f"{key} (recorded {show(a)}, asked {show(b)})"
    return None
