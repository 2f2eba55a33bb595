"""The run directory: its lock, what it may already hold, its recorded config, its log, and the results.json it ends with.

    with locked(run_dir) as was_run:     # one process at a time; the lock dies with its holder
        refuse_foreign(run_dir, was_run)  # never overwrite files a person put there
        ...
    config_difference(recorded_table, config)   # "train.lr (recorded 0.003, asked 0.01)" or None
    prepare(run_dir, config, registry, resume)  # record the config; a resume must ask for the recorded one
    results_table(...)                          # the results.json schema; finish() writes it beside the model
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


@contextmanager
def claim(run_dir: Path) -> Iterator[None]:
    """Hold ``run_dir`` for the block, refusing foreign files: on rank 0 only, the one that writes (torchrun sets RANK first)."""
    if int(os.environ.get("RANK", "0")) != 0:
        yield
        return
    with locked(run_dir) as was_run:
        refuse_foreign(run_dir, was_run)
        yield


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
    from layerdescent.config import config_from_dict

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
            show = lambda v: "unset" if v is missing else repr(v)  # noqa: E731
            return f"{key} (recorded {show(a)}, asked {show(b)})"
    return None


RESULTS_SCHEMA = 1
MODEL_FILE = "model.safetensors"  # the final (evaluated) model of a finished run
# Write errors that mean the disk, not the run, is the problem (EFBIG: a file size limit).
DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EIO)


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file, so a reader sees the old file or the new one."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def prepare(run_dir: Path, config: Any, registry: Any, resume: bool, write: bool = True) -> None:
    """Check that ``run_dir`` may take this run (new, or resumed under the same config) and record its config."""
    import tomli_w

    from layerdescent.config import read_toml

    config_file, checkpoint = run_dir / "config.toml", run_dir / "checkpoint.pt"
    finished = (run_dir / "results.json").exists()
    if resume:
        if config_file.exists():
            difference = config_difference(read_toml(config_file), config, registry)
            if difference:
                raise ConfigError(f"--resume: the config differs from the one recorded in {config_file} at {difference}; resume with the same config")
        if finished and not checkpoint.exists():
            raise ConfigError(f"{run_dir} holds a finished run and no checkpoint.pt: nothing to resume (train.keep_checkpoint = true keeps it); --out a new directory")
    elif checkpoint.exists() or finished:
        raise ConfigError(f"{run_dir} already holds a run; pass --resume to continue it or --out a new directory")
    if not write:
        return
    for stale in run_dir.glob(f".{checkpoint.name}.*"):
        stale.unlink()  # a checkpoint write cut short by a kill
    config_file.write_text(tomli_w.dumps(config.as_dict()))
    if not (resume and checkpoint.exists()):
        (run_dir / "metrics.jsonl").write_text("")  # nothing to continue: start the log over


def rewind_log(metrics_file: Path, checkpoint: Path, offset: int) -> None:
    """Cut metrics.jsonl back to what it held when ``checkpoint`` was written, or CheckpointError when it cannot be the same log."""
    from layerdescent.errors import CheckpointError

    if not metrics_file.exists():
        raise CheckpointError(f"{metrics_file} is missing, so the run's log cannot continue: restore it, or start the run again in a new --out")
    if offset > metrics_file.stat().st_size:
        raise CheckpointError(
            f"checkpoint {checkpoint} says metrics.jsonl held {offset} bytes, but it holds {metrics_file.stat().st_size}: "
            f"the log is not the one this checkpoint wrote; restore it, or start the run again in a new --out"
        )
    with metrics_file.open("r+b") as handle:  # drop what was logged after the checkpoint
        handle.truncate(offset)


def results_table(config: Any, task: Any, position: dict[str, Any], step_times: list[float], skipped: int, update: Any, evaluation: dict[str, Any], satisfied: dict[str, float] | None = None) -> dict[str, Any]:
    """What results.json holds (schema ``RESULTS_SCHEMA``): the run, how it trained, its multipliers and its evaluation.

    A per-sample constraint records each entry's mean lambda over the training rows, with its
    maximum, the share of rows whose multiplier binds and the share that meet it at the end (``satisfied``).
    """
    import statistics

    from layerdescent import __version__, provenance

    train = config.train
    relaxations = update.relaxations()
    return {
        "schema": RESULTS_SCHEMA,
        "layerdescent": __version__,
        "code": provenance.code(),  # which code made it, so a report can flag pairs made by two versions
        "label": config.name,
        "task": task.name,
        "solver": config.solver.name,
        "seed": config.seed,
        "num_layers": task.num_layers,
        "split": config.eval.split,
        "perturbation": task.perturbation,
        "train": {
            "steps": position["step"],
            "epochs": position["epoch"],
            **({"best_epoch": position["best_epoch"], "best_val_loss": position.get("best_val_loss")} if train.early_stopping else {}),
            "step_time_median": statistics.median(step_times) if step_times else None,
            "skipped_steps": skipped,
        },
        "constraints": {name: _constraint_record(update.labels[name], value, relaxations.get(name), (satisfied or {}).get(name)) for name, value in update.multipliers().items()},
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


def finish(run_dir: Path, model_state: dict[str, Any], results: dict[str, Any], keep_checkpoint: bool) -> None:
    """Write the tested model and results.json; drop optimizer state unless asked to keep it (it is most of the bytes)."""
    import json

    from layerdescent.checkpoint import previous_path, save_model_file

    save_model_file(run_dir / MODEL_FILE, model_state)
    write_atomic(run_dir / "results.json", json.dumps(results, indent=2) + "\n")
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


def _seen_mean(total: Any, seen: Any) -> list[float | None]:
    """Sums over the steps that saw each entry, divided by their count; null for an entry no step saw."""
    return [value if count else None for value, count in zip((total / seen.clamp(min=1)).tolist(), seen.tolist())]


class LogWindow:
    """Sums of what one metrics.jsonl line reports, over the steps since the last line."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Start a new log line."""
        self.steps = 0
        self.full = 0  # steps that read every layer, so whose violations are known
        self.feasible = 0
        self.loss: Any = None
        self.counts: Any = None
        self.violation: dict[str, Any] = {}
        self.seen: dict[str, Any] = {}  # per entry, the steps that observed it (a level not drawn is NaN)

    def add(self, means: Any, violations: dict[str, Any]) -> None:
        """Count one step's layer means and violations."""
        import torch

        self.steps += 1
        read = ~torch.isnan(means)  # a step that read the last layer alone leaves the others NaN
        self.loss = means.nan_to_num() if self.loss is None else self.loss + means.nan_to_num()
        self.counts = read.float() if self.counts is None else self.counts + read
        if not bool(read.all()):
            return
        self.full += 1
        self.feasible += all(bool(((v <= 0) | v.isnan()).all()) for v in violations.values())
        for name, value in violations.items():
            seen = (~value.isnan()).float()
            value = value.nan_to_num()
            self.violation[name] = value.clone() if name not in self.violation else self.violation[name] + value
            self.seen[name] = seen if name not in self.seen else self.seen[name] + seen

    def record(self, position: dict[str, Any], dual: dict[str, Any]) -> dict[str, Any]:
        """The metrics.jsonl record of the window (``dual``: the update's multipliers and relaxations), which then starts again."""
        full = max(self.full, 1)
        record: dict[str, Any] = {
            "event": "train",
            "epoch": position["epoch"],
            "step": position["step"],
            "loss": (self.loss / self.counts.clamp(min=1)).tolist(),
            "feasible": self.feasible / full,
            # an entry no step of the window observed (a level not drawn) logs null; the others their mean over the steps that saw them
            "violation": {k: _seen_mean(v, self.seen[k]) for k, v in self.violation.items()},
            **dual,
        }
        self.reset()
        return record
