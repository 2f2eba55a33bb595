"""The run directory: its lock, what it may already hold, its recorded config, its log, and the results.json (or failure.json) it ends with.

with locked(run_dir) as was_run:     # one process at a time; the lock dies with its holder
    refuse_foreign(run_dir, was_run)  # never overwrite files a person put there
with claim(run_dir) as held: ...     # both, on the rank that writes; held.check() before each checkpoint
write_atomic(path, text)             # every file is replaced whole, never written through a link
    ...
config_difference(recorded_table, config)   # "train.lr (recorded 0.003, asked 0.01)" or None
prepare(run_dir, config, registry, resume)  # record the config; a resume must ask for the recorded one
results_table(...)                          # the results.json schema; finish() writes it beside the model
partial_evaluation(run_dir, key)            # an interrupted evaluation's records, where ``key`` (model and eval config) matches
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from layerdescent.errors import ConfigError, LayerdescentError

LOCK = ".layerdescent.lock"  # also marks the directory as a run's, even before its first checkpoint
EVALUATION_PARTIAL = "evaluation.partial.json"  # the records an evaluation has taken so far, so an interrupted one resumes at the next
FAILURE = "failure.json"  # how a run that failed while training or in its final evaluation ended, until it trains again (`bench --status` reads it)
WRITES = (
    "config.toml",
    "metrics.jsonl",
    "checkpoint.pt",
    "checkpoint.prev.pt",
    "best.pt",
    "results.json",
    "model.safetensors",
    EVALUATION_PARTIAL,
    FAILURE,
)
# A directory holding one of these is a run, lock file or not (older runs; a failed run copied or committed without it).
FINISHED = ("checkpoint.pt", "results.json", FAILURE)
# How a run executes, not what it computes: a finished run is the same run whatever these say.
EXECUTION_KEYS = ("train.threads", "train.progress", "train.keep_checkpoint", "train.checkpoint_every", "train.trackers")


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


def save_failure(run_dir: Path, epoch: int, step: int, exc: BaseException, stage: str) -> None:
    """Record in ``run_dir`` that its run failed at ``step`` of ``stage`` (training or its final evaluation), and why."""
    import json

    record = {"epoch": epoch, "step": step, "stage": stage, "error": f"{type(exc).__name__}: {exc}"}
    try:
        write_atomic(run_dir / FAILURE, json.dumps(record) + "\n")
    except OSError:
        pass  # a full disk, say: the run's own error is the one to raise


def failure(run_dir: Path) -> dict[str, Any] | None:
    """The failure ``run_dir``'s run ended with (epoch, step, stage, error), or None."""
    import json

    try:
        record = json.loads((run_dir / FAILURE).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def last_record(run_dir: Path, tail: int = 1 << 20) -> dict[str, Any] | None:
    """The last whole record of the run's metrics.jsonl that names a step (from its last ``tail`` bytes), or None."""
    import json

    try:
        with open(run_dir / "metrics.jsonl", "rb") as handle:
            handle.seek(max(0, handle.seek(0, os.SEEK_END) - tail))
            lines = handle.read().splitlines()
    except OSError:
        return None
    for line in reversed(lines):  # the last may be half written
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("step"), int):
            return record
    return None


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


def flat_keys(table: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted keys for nested tables; constraints are numbered: constraints.0.alpha."""
    if isinstance(table, list) and table and all(isinstance(x, dict) for x in table):
        table = {str(i): x for i, x in enumerate(table)}
    if not isinstance(table, dict):
        return {prefix.rstrip("."): table}
    out: dict[str, Any] = {}
    for key, value in table.items():
        out.update(flat_keys(value, f"{prefix}{key}."))
    return out


def config_difference(recorded: dict[str, Any], wanted: Any, registry: Any = None) -> str | None:
    """The first key on which a recorded config table differs from RunConfig ``wanted`` (defaults filled in), or None.

    Both sides go through the same validation, so a run recorded before an option existed, whose
    table lacks the key, compares equal to a config that leaves the option at its default.
    """
    from layerdescent.run.config import config_from_dict

    try:
        resolved = config_from_dict(recorded, registry).as_dict()
    except LayerdescentError as exc:
        return f"the recorded config no longer loads ({(str(exc).splitlines() or [''])[0]})"
    have, want = flat_keys(resolved), flat_keys(wanted.as_dict())
    missing = object()
    for key in dict.fromkeys([*want, *have]):
        if key in EXECUTION_KEYS:
            continue
        a, b = have.get(key, missing), want.get(key, missing)
        if a != b:
            show = lambda v: "unset" if v is missing else repr(v)
            return f"{key} (recorded {show(a)}, asked {show(b)})"
    return None


RESULTS_SCHEMA = 1
MODEL_FILE = "model.safetensors"  # the final (evaluated) model of a finished run
# Write errors that mean the disk, not the run, is the problem (EFBIG: a file size limit; EACCES, EPERM: a folder made read-only).
DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EIO, errno.EACCES, errno.EPERM)


def write_failure(run_dir: Path, exc: OSError) -> Exception:
    """The one-line DiskError for a write to ``run_dir`` that failed with ``exc``: what failed, and what to do before --resume."""
    from layerdescent.errors import DiskError

    fix = {
        errno.EACCES: "make it writable",
        errno.EPERM: "make it writable",
        errno.EROFS: "make it writable",
        errno.EFBIG: "raise the file size limit (ulimit -f)",
    }.get(exc.errno, "free space")
    return DiskError(
        f"cannot write to {run_dir}: {exc.strerror or exc} ({getattr(exc, 'filename', None) or 'a run file'}); "
        f"the last checkpoint is intact: {fix} and continue with --resume"
    )


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


def open_log(path: Path) -> Any:
    """``path`` (metrics.jsonl) opened to append, line-buffered, so that `tail -f` follows a run; never through a link."""
    return os.fdopen(open_own(path, os.O_WRONLY | os.O_APPEND), "a", buffering=1)


def prepare(run_dir: Path, config: Any, registry: Any, resume: bool, write: bool = True) -> None:
    """Check that ``run_dir`` may take this run (new, or resumed under the same config) and record its config."""
    import tomli_w

    from layerdescent.run.config import read_toml

    config_file, checkpoint = run_dir / "config.toml", run_dir / "checkpoint.pt"
    finished = (run_dir / "results.json").exists()
    if resume:
        if config_file.exists():
            difference = config_difference(read_toml(config_file), config, registry)
            if difference:
                raise ConfigError(
                    f"--resume: the config differs from the one recorded in {config_file} at {difference}; resume with the same config"
                )
        if finished and not checkpoint.exists():
            raise ConfigError(
                f"{run_dir} holds a finished run and no checkpoint.pt: nothing to resume (train.keep_checkpoint = true keeps it); --out a new directory"
            )
    elif checkpoint.exists() or finished:
        raise ConfigError(f"{run_dir} already holds a run; pass --resume to continue it or --out a new directory")
    if not write:
        return
    for name in WRITES:
        for stale in run_dir.glob(f".{name}.*"):
            stale.unlink()  # a write cut short by a kill
    (run_dir / FAILURE).unlink(missing_ok=True)  # it trains again: the old failure no longer says how it ended
    write_atomic(config_file, tomli_w.dumps(config.as_dict()))
    if not (resume and checkpoint.exists()):
        write_atomic(run_dir / "metrics.jsonl", "")  # nothing to continue: start the log over


def rewind_log(metrics_file: Path, checkpoint: Path, offset: int) -> None:
    """Cut metrics.jsonl back to what it held when ``checkpoint`` was written, or CheckpointError when it cannot be the same log."""
    from layerdescent.errors import CheckpointError

    if not metrics_file.exists():
        raise CheckpointError(
            f"{metrics_file} is missing, so the run's log cannot continue: restore it, or start the run again in a new --out"
        )
    fd = open_own(metrics_file, os.O_RDWR)
    with os.fdopen(fd, "r+b") as handle:
        size = os.fstat(fd).st_size
        if offset > size:
            raise CheckpointError(
                f"checkpoint {checkpoint} says metrics.jsonl held {offset} bytes, but it holds {size}: "
                f"the log is not the one this checkpoint wrote; restore it, or start the run again in a new --out"
            )
        problem = _log_problem(handle.read(offset))
        if problem:
            raise CheckpointError(
                f"{metrics_file}{problem}, before the point checkpoint {checkpoint} continues from: the log was damaged; restore it, or start the run again in a new --out"
            )
        handle.truncate(offset)  # drop what was logged after the checkpoint


def _log_problem(kept: bytes) -> str | None:
    """Why the part of a log a resume keeps is not whole JSON records, one a line (``:LINE ...``), or None."""
    import json

    if kept and not kept.endswith(b"\n"):
        return " does not end a line where the checkpoint says it does"
    for number, line in enumerate(kept.splitlines(), 1):
        try:
            record = json.loads(line)
        except ValueError:  # not UTF-8, or not JSON
            return f":{number} is not a JSON record"
        if not isinstance(record, dict) or not isinstance(record.get("event"), str):
            return f":{number} is not a log record"
    return None


def results_table(
    config: Any,
    task: Any,
    position: Any,
    step_times: list[float],
    skipped: int,
    update: Any,
    evaluation: dict[str, Any],
    satisfied: dict[str, float] | None = None,
) -> dict[str, Any]:
    """What results.json holds (schema ``RESULTS_SCHEMA``): the run, how it trained, its multipliers and its evaluation.

    A per-sample constraint records each entry's mean lambda over the training rows, with its
    maximum, the share of rows whose multiplier binds and the share that meet it at the end (``satisfied``).
    """
    import statistics

    from layerdescent import __version__
    from layerdescent.run import provenance

    train = config.train
    relaxations = update.relaxations()
    return {
        "schema": RESULTS_SCHEMA,
        "layerdescent": __version__,
        "code": provenance.code(),  # which code made it, so a report can flag pairs made by two versions
        "machine": provenance.machine(),  # where: float results differ in their last digits between CPU models
        "label": config.name,
        "task": task.name,
        "solver": config.solver.name,
        "seed": config.seed,
        "num_layers": task.num_layers,
        "split": config.eval.split,
        "perturbation": task.perturbation,
        "train": {
            "steps": position.step,
            "epochs": position.epoch,
            **({"best_epoch": position.best_epoch, "best_val_loss": position.best_val_loss} if train.early_stopping else {}),
            "step_time_median": statistics.median(step_times) if step_times else None,
            "skipped_steps": skipped,
        },
        "constraints": {
            name: _constraint_record(update.labels[name], value, relaxations.get(name), (satisfied or {}).get(name))
            for name, value in update.multipliers().items()
        },
        **evaluation,
    }


def _constraint_record(labels: list[str], value: Any, relaxation: Any, satisfied: float | None) -> dict[str, Any]:
    """results.json's entry for one constraint: labels and final lambdas (a per-sample table as its per-entry summary)."""
    if value.dim() != 2:
        return {"labels": labels, "lambda": value.tolist(), **({"relaxation": relaxation.tolist()} if relaxation is not None else {})}
    return {
        "labels": labels,
        "lambda": value.mean(dim=0).tolist(),
        **({"relaxation": relaxation.mean(dim=0).tolist()} if relaxation is not None else {}),
        "per_sample": {
            "rows": value.shape[0],
            "lambda_max": value.max(dim=0).values.tolist(),
            "binding_rows": float((value > 0).any(dim=1).double().mean()),
            "satisfied_rows": satisfied,
        },
    }


def partial_evaluation(run_dir: Path, key: dict[str, Any]) -> dict[str, Any] | None:
    """The records an interrupted evaluation of the same model under the same eval config saved, or None (none, another's, or unreadable: evaluate again)."""
    import json

    try:
        saved = json.loads((run_dir / EVALUATION_PARTIAL).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(saved, dict) or saved.get("key") != key or not isinstance(saved.get("evaluation"), dict):
        return None
    return saved["evaluation"]


def save_partial_evaluation(run_dir: Path, key: dict[str, Any], evaluation: dict[str, Any]) -> None:
    """Record the evaluation's records so far under ``key``, replacing the file whole."""
    import json

    write_atomic(run_dir / EVALUATION_PARTIAL, json.dumps({"key": key, "evaluation": evaluation}) + "\n")


def finish(run_dir: Path, model_state: dict[str, Any], results: dict[str, Any], keep_checkpoint: bool, who: str = "the model") -> None:
    """Write the tested model and results.json; drop optimizer state unless asked to keep it (it is most of the bytes); ``who`` names the task in errors."""
    import json

    import torch

    from layerdescent.errors import DivergenceError
    from layerdescent.run.checkpoint import previous_path, save_model_file

    # A parameter the loss never reads escapes every check of the loss; the saved model must still load.
    nonfinite = next(
        (name for name, value in model_state.items() if value.is_floating_point() and not bool(torch.isfinite(value).all())), None
    )
    if nonfinite is not None:
        raise DivergenceError(
            f"{who}: parameter {nonfinite!r} holds non-finite (NaN or infinite) values after training, though the losses stayed finite (no loss reads it): "
            f"neither {MODEL_FILE} nor results.json was written; fix how the task builds or updates it"
        )
    save_model_file(run_dir / MODEL_FILE, model_state)
    write_atomic(run_dir / "results.json", json.dumps(results, indent=2) + "\n")
    (run_dir / EVALUATION_PARTIAL).unlink(missing_ok=True)  # results.json holds every record now
    if not keep_checkpoint:
        for stale in (run_dir / "checkpoint.pt", run_dir / "best.pt"):
            stale.unlink(missing_ok=True)
            previous_path(stale).unlink(missing_ok=True)


def final_model_file(run_dir: Path, config: Any) -> Path:
    """The file holding a finished run's tested model: model.safetensors, or in runs from before it best.pt / checkpoint.pt."""
    for name in (MODEL_FILE, "best.pt" if config.train.early_stopping else "checkpoint.pt"):
        if (run_dir / name).exists():
            return run_dir / name
    raise ConfigError(f"{run_dir} has neither {MODEL_FILE} nor a checkpoint, so its model is gone: re-run it to evaluate it again")
