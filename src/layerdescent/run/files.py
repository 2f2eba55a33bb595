"""Files a run writes, written safely: atomically, never through a link, never over a file layerdescent did not write."""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from layerdescent.errors import ConfigError, DiskError


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


def open_own(path: Path, flags: int, mode: int = 0o644) -> int:
    """A descriptor on ``path``, a plain file of the run's own (ConfigError for a link, a device, a file with a second name)."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ConfigError(
                f"{path} is a symbolic link; layerdescent writes only files of its own there: remove the link, or --out another directory"
            ) from None
        raise
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink > 1:
        os.close(fd)
        what = "has a second name (a hard link)" if stat.S_ISREG(info.st_mode) else "is not a plain file"
        raise ConfigError(f"{path} {what}, so writing it could change a file elsewhere: remove it, or --out another directory")
    return fd


def refuse_links(run_dir: Path, names: tuple[str, ...], folders: tuple[str, ...] = ()) -> None:
    """Raise ConfigError when one of ``names`` in ``run_dir`` is a symbolic link (writing it would reach outside the folder) or not a plain file (a pipe would hang a reader); ``folders`` may be directories."""
    for name in (*names, *folders):
        try:
            mode = os.lstat(run_dir / name).st_mode
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(mode):
            raise ConfigError(
                f"{run_dir / name} is a symbolic link; layerdescent writes only files of its own there: remove the link, or --out another directory"
            )
        if not (stat.S_ISREG(mode) or (name in folders and stat.S_ISDIR(mode))):
            raise ConfigError(
                f"{run_dir / name} is not a plain file; layerdescent writes only files of its own there: remove it, or --out another directory"
            )


def refuse_linked_path(root: Path, path: Path) -> None:
    """Raise ConfigError when a folder between ``root`` and ``path`` (``path`` included) is a symbolic link, which would lead the run out of ``root``."""
    for depth in range(1, len(path.relative_to(root).parts) + 1):
        step = root.joinpath(*path.relative_to(root).parts[:depth])
        if step.is_symlink():
            raise ConfigError(
                f"{step} is a symbolic link, so what layerdescent writes under it would land outside {root}: remove the link, or --out another directory"
            )


# Write errors that mean the disk, not the run, is the problem (EFBIG: a file size limit; EACCES, EPERM: a folder made read-only).
DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EIO, errno.EACCES, errno.EPERM)


def write_failure(run_dir: Path, exc: OSError) -> Exception:
    """The one-line DiskError for a write to ``run_dir`` that failed with ``exc``: what failed, and what to do before --resume."""

    fix = {
        errno.EACCES: "make it writable",
        errno.EPERM: "make it writable",
        errno.EROFS: "make it writable",
        errno.EFBIG: "raise the file size limit (ulimit -f)",
    }.get(exc.errno, "free space")
    where = f"cannot write to {run_dir}: {exc.strerror or exc} ({getattr(exc, 'filename', None) or 'a run file'}); "
    if not (run_dir / "checkpoint.pt").exists():  # stopped before its first checkpoint: --resume would start over anyway
        return DiskError(f"{where}no checkpoint was written yet: {fix} and run it again")
    return DiskError(f"{where}the last checkpoint is intact: {fix} and continue with --resume")


def write_atomic(path: Path, text: str | bytes) -> None:
    """Write ``text`` to ``path`` through a new temporary file, so a reader sees the old file or the new one and a link there is replaced, never followed."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(text.encode() if isinstance(text, str) else text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_output(path: Path, text: str, ours: Callable[[str], bool], before: Callable[[], None] | None = None, what: str = "--out") -> None:
    """Write a file a command was told to write (``compare --out``) as a run writes its own: atomically, never through a link, never over a file that ``ours`` does not recognise from its first 4 KiB; ``before`` runs once the checks pass."""
    path = Path(path)
    usable_dir(path.parent, f"{what} {path}: its folder")
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        info = None
    if info is not None:
        if stat.S_ISLNK(info.st_mode):
            raise ConfigError(
                f"{what} {path} is a symbolic link; layerdescent writes only files of its own: remove the link, or --out another path"
            )
        if stat.S_ISDIR(info.st_mode):
            raise ConfigError(f"{what} {path} is a directory: --out a file in it, e.g. {path / 'compare.md'}")
        fd = open_own(path, os.O_RDONLY | os.O_NONBLOCK)  # a pipe or a device is refused before anything reads it
        with os.fdopen(fd, "rb") as handle:
            head = handle.read(4096).decode("utf-8", errors="replace")
        if not ours(head):
            raise ConfigError(
                f"{what} {path} is a file layerdescent did not write (or was changed since), which this would replace: move it away, or --out another path (nothing was written)"
            )
    try:
        if before is not None:
            before()
        write_atomic(path, text)
    except OSError as exc:
        raise ConfigError(f"{what} {path} cannot be written: {exc.strerror or exc} (nothing was written)") from None


def open_log(path: Path) -> Any:
    """``path`` (metrics.jsonl) opened to append, line-buffered, so that `tail -f` follows a run; never through a link."""
    return os.fdopen(open_own(path, os.O_WRONLY | os.O_APPEND), "a", buffering=1)
