"""One process per run directory: its lock, who holds it, and the claim a writer checks before each write."""

from __future__ import annotations

import errno
import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from layerdescent.errors import ConfigError, LayerdescentError
from layerdescent.run.files import open_own, refuse_links, usable_dir
from layerdescent.run.layout import FINISHED, LOCK, WRITES


def _lock_directory(run_dir: Path) -> int | None:
    """A descriptor on ``run_dir`` itself holding its flock (None where the filesystem cannot lock a directory), or ConfigError while another process holds it."""
    fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise ConfigError(
                f"{run_dir} is in use by another layerdescent process (pid {_holder(run_dir)}): wait for it to finish, or --out another directory"
            ) from None
        return None  # e.g. NFS, where only the lock file below can be locked
    return fd


def _holder(run_dir: Path) -> str:
    """The pid the lock file names, or "unknown"."""
    try:
        fd = os.open(run_dir / LOCK, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return "unknown"
    try:
        return os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
    finally:
        os.close(fd)


def holder(run_dir: Path) -> int | None:
    """The pid of the live process holding ``run_dir`` now, or None; read without taking the lock, so asking never blocks a run."""
    pid = _holder(run_dir)
    if not pid.isdigit():
        return None
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass  # alive, another user's
    fds = Path(f"/proc/{pid}/fd")
    try:
        lock = os.stat(run_dir / LOCK)
        # Linux: a pid reused after its run died does not hold the lock file open
        return int(pid) if any(_same_file(fd, lock) for fd in fds.iterdir()) else None
    except OSError:
        return int(pid)  # no /proc, or not ours to read: alive is what can be told


def _same_file(fd: Path, file: os.stat_result) -> bool:
    """Whether the open descriptor ``fd`` (a /proc/PID/fd entry) is ``file``."""
    try:
        target = os.stat(fd)
    except OSError:  # closed since listed
        return False
    return (target.st_dev, target.st_ino) == (file.st_dev, file.st_ino)


class Held:
    """A run directory held by this process: ``check()`` says whether it still is."""

    def __init__(self, run_dir: Path, dir_fd: int | None, lock_fd: int, was_run: bool) -> None:
        self.run_dir, self._dir_fd, self._lock_fd = run_dir, dir_fd, lock_fd
        self.was_run = was_run  # a run's directory already before this claim

    def gone(self) -> bool:
        """Whether another process could now hold the directory (see :meth:`check`)."""
        try:
            here = os.stat(self.run_dir) if self._dir_fd is not None else os.lstat(self.run_dir / LOCK)
        except OSError:
            return True
        mine = os.fstat(self._dir_fd if self._dir_fd is not None else self._lock_fd)
        return (here.st_dev, here.st_ino) != (mine.st_dev, mine.st_ino)

    def check(self) -> None:
        """Raise ConfigError, before anything more is written, when another process could now hold the directory.

        That is when the directory was moved or replaced since the claim, or, where the filesystem
        could not lock the directory itself, when its lock file was removed.
        """
        if self.gone():
            what = "the directory was moved or replaced" if self._dir_fd is not None else f"{LOCK} was removed"
            raise ConfigError(
                f"{self.run_dir} is no longer this run's ({what} while it trained): stopped without writing more, "
                f"so that two processes never write one run; once no other process uses it, --resume continues from the last checkpoint"
            )


@contextmanager
def locked(run_dir: Path) -> Iterator[bool]:
    """Hold ``run_dir``'s lock for the block (ConfigError when another process holds it); yields whether it was a run already."""
    with holding(run_dir) as held:
        yield held.was_run


@contextmanager
def holding(run_dir: Path) -> Iterator[Held]:
    """Hold ``run_dir`` for the block: a flock on the directory itself, which deleting the lock file cannot release, and on its lock file."""
    try:
        created = not run_dir.exists()
    except OSError as exc:  # a name too long for the filesystem
        raise ConfigError(f"--out {run_dir} cannot be created: {exc.strerror or exc}") from None
    usable_dir(run_dir)
    refuse_links(run_dir, (LOCK, *WRITES), folders=("tensorboard",))  # tensorboard/: the TensorBoard tracker's event files
    path = run_dir / LOCK
    was_run = path.exists() or any((run_dir / name).exists() for name in FINISHED)
    present = {name for name in WRITES if (run_dir / name).exists()}
    dir_fd = _lock_directory(run_dir)
    try:
        try:
            fd = open_own(path, os.O_RDWR | os.O_CREAT)
        except OSError as exc:
            raise ConfigError(f"cannot create the lock file {path}: {exc.strerror or exc}") from None
        try:
            # flock dies with the process that holds it, so a SIGKILLed run never leaves a stale lock.
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise ConfigError(
                    f"{run_dir} is in use by another layerdescent process (pid {holder}): wait for it to finish, or --out another directory"
                ) from None
            raise ConfigError(f"cannot lock {path}: {exc.strerror or exc}") from None
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            held = Held(run_dir, dir_fd, fd, was_run)
            try:
                yield held
            except LayerdescentError:
                if not was_run and not held.gone() and {name for name in WRITES if (run_dir / name).exists()} == present:
                    path.unlink(missing_ok=True)  # refused before writing anything: leave the directory as it was
                    if created:
                        try:
                            run_dir.rmdir()
                        except OSError:
                            pass  # something else appeared in it
                raise
        finally:
            os.close(fd)
    finally:
        if dir_fd is not None:
            os.close(dir_fd)


def refuse_foreign(run_dir: Path, was_run: bool) -> None:
    """Raise ConfigError when ``run_dir`` is not a run but holds a file a run would overwrite."""
    if was_run:
        return
    present = [name for name in WRITES if (run_dir / name).exists()]
    if present:
        raise ConfigError(
            f"{run_dir} is not a run directory but holds {present[0]}, which the run would overwrite: --out an empty or new directory"
        )


class _NotHeld:
    """What a rank that does not write holds: nothing to check."""

    def check(self) -> None:
        """Nothing: rank 0 checks the claim."""


@contextmanager
def claim(run_dir: Path) -> Iterator[Held | _NotHeld]:
    """Hold ``run_dir`` for the block, refusing foreign files: on rank 0 only, the one that writes (torchrun sets RANK first)."""
    if int(os.environ.get("RANK", "0")) != 0:
        yield _NotHeld()
        return
    with holding(run_dir) as held:
        refuse_foreign(run_dir, held.was_run)
        yield held
