"""The executor contract: where a bench's pending runs train, each executor registered by a plugin like a task or a solver.

    [bench.executor]            # in the bench file, or --set bench.executor.KEY=VALUE
    name = "slurm"              # --executor NAME chooses another
    partition = "gpu"           # the chosen executor's own options (its Options dataclass)

``local`` trains in this process or a pool of ``--workers`` processes; ``ray`` makes every run a
Ray task; ``slurm`` submits every run as a job through submitit. Each executor declares its
options as a frozen dataclass (``Options``, a subclass of :class:`ExecutorOptions`), read from
``[bench.executor]`` and checked like any config key; keys that only another registered executor
declares are dropped, so one bench file can hold the settings of several. A plugin's executor
subclasses :class:`Executor` and implements ``submit``, ``ready`` and ``outcome`` over its own
jobs, each of which calls ``self.job(run)``. Every executor keeps the run directory layout, the
skip and resume rules and the summary of the local one, and every job decides again, when its run
starts, whether to resume it, so a run submitted twice trains once. ``--out`` must lie on a
filesystem every worker sees: each job checks that it finds the bench's marker file there before
it trains. Each job's output goes to ``OUT/logs/VARIANT/seed-N.log``; a failed run is reported by
name with the last lines of that log, and the other runs go on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import math
import os
import re
import socket
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Union

from layerdescent.errors import ConfigError, LayerdescentError, closest
from layerdescent.optional import check_installed
from layerdescent.options import build_options
from layerdescent.readback import read_bytes
from layerdescent.registry import get_registry
from layerdescent.run import files, layout

MARKER = ".layerdescent-out"  # written by the bench in --out; a worker that cannot read it sees another filesystem
LOG_TAIL = 12  # lines of a failed run's log in the bench's report
POLL_SECONDS = 0.5
# Far above any real job, low enough that a typo (an extra digit, nan) is refused before anything is submitted.
MAX_WORKERS, MAX_CPUS, MAX_GPUS, MAX_MINUTES, MAX_MEM_GB = 4096, 4096, 64, 366 * 24 * 60, 100_000


class RunsFailed(LayerdescentError):
    """Some runs of a bench failed on their executor; the others finished."""


@dataclass(frozen=True)
class ExecutorOptions:
    """What every executor takes: how many runs train at once, the threads of each, and whether the bench waits for them."""

    workers: Union[int, None] = None
    """Runs at once; unset: one for local, as many as the executor's resources allow elsewhere."""
    cpus_per_run: int = 1
    """CPUs, and torch threads, of each run (local runs take one thread each)."""
    wait: bool = True
    """False (--no-wait): submit the jobs and return; for executors whose jobs outlive the bench."""

    def __post_init__(self) -> None:
        if self.workers is not None and not 1 <= self.workers <= MAX_WORKERS:
            raise ConfigError(f"--workers (bench.executor.workers) must be in 1..{MAX_WORKERS}, got {self.workers}")
        if not 1 <= self.cpus_per_run <= MAX_CPUS:
            raise ConfigError(f"bench.executor.cpus_per_run must be in 1..{MAX_CPUS}, got {self.cpus_per_run}")


def check_gpus(gpus_per_run: float) -> None:
    """Raise ConfigError unless ``gpus_per_run`` is a number of GPUs a run may ask for."""
    if not (math.isfinite(gpus_per_run) and 0 <= gpus_per_run <= MAX_GPUS):
        raise ConfigError(f"bench.executor.gpus_per_run must be a number in 0..{MAX_GPUS}, got {gpus_per_run}")


@dataclass(frozen=True)
class ExecutorChoice:
    """The executor a bench runs on: its registered name and its options."""

    name: str = "local"
    options: ExecutorOptions = ExecutorOptions()


def executor_table(bench: dict[str, Any]) -> dict[str, Any]:
    """The bench file's ``[bench.executor]`` table (empty where it has none), refused in one line when it is not a table."""
    table = bench.get("executor", {})
    if not isinstance(table, dict):
        raise ConfigError('bench.executor must be a table, e.g. [bench.executor] name = "slurm"')
    return table


def choose_executor(bench: dict[str, Any], name: str | None = None, registry: Any = None, **given: Any) -> ExecutorChoice:
    """The executor ``name`` (else ``[bench.executor] name``, else local) with its options from that table, then ``given`` (flags)."""
    table = dict(executor_table(bench))
    chosen = table.pop("name", "local")
    if not isinstance(chosen, str):
        raise ConfigError(f"bench.executor.name must be a string, got {chosen!r}")
    name = name or chosen
    registry = registry or get_registry()
    cls = registry.executors.get(name)
    if cls is None:
        raise ConfigError(
            f"--executor {name!r} is not a registered executor{closest(name, registry.executors)} (known: {', '.join(sorted(registry.executors))}; see `layerdescent list`)"
        )
    options = build_options(cls, table, "bench.executor", f"executor {name!r}", registry.executors.values())
    given = {key: value for key, value in given.items() if value is not None}
    return ExecutorChoice(name, dataclasses.replace(options, **given) if given else options)


def mark_out(out: Path) -> str:
    """The id of ``out`` that workers must find there (written once), proof that they see the same directory."""
    files.usable_dir(out)
    marker = out / MARKER
    files.refuse_links(out, (MARKER,), folders=("logs", ".submitit"))  # the runs' logs and submitit's jobs stay inside --out
    if not marker.exists():
        files.write_atomic(marker, uuid.uuid4().hex + "\n")
    return _marker(marker, "delete it and run the bench again")


def _marker(marker: Path, fix: str) -> str:
    """The id in ``out``'s marker file, read within bounds (it is 33 bytes)."""
    return (read_bytes(marker, limit=4096, fix=fix) or b"").decode("utf-8", errors="replace").strip()


def _check_visible(out: Path, token: str) -> None:
    marker = out / MARKER
    try:
        seen = _marker(marker, "")
    except LayerdescentError:  # missing, or not the file the bench wrote: not the bench's directory either way
        seen = None
    if seen != token:
        raise ConfigError(
            f"--out {out} is not the bench's directory on worker {socket.gethostname()} ({marker} is missing or another one): "
            "put --out on a filesystem every worker sees (a shared or network filesystem, not a node's local disk)"
        )


def _in_use(run_dir: Path) -> bool:
    """Whether another process holds ``run_dir``'s lock (trains it) right now: on the directory itself, or on its lock file."""
    for path, flags in ((run_dir, os.O_RDONLY | os.O_DIRECTORY), (run_dir / layout.LOCK, os.O_RDONLY | os.O_NOFOLLOW)):
        try:
            fd = os.open(path, flags)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return True
        finally:
            os.close(fd)
    return False


@contextlib.contextmanager
def environment(env: dict[str, str]) -> Iterator[None]:
    """``os.environ`` with ``env`` set for the block (and the processes it starts), as it was after."""
    before = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def log_path(out: Path, run: Any) -> Path:
    """Where a run's output goes when it trains on an executor."""
    return out / "logs" / run.run_dir.parent.name / f"seed-{run.seed}.log"  # its folder's name: a label may not be one


def execute(run: Any, out: str, token: str, threads: int, env: dict[str, str]) -> str:
    """One run on a worker: check that it sees ``out``, wait out another holder, then skip, resume or train it."""
    from layerdescent.run.trainer import train

    out_dir = Path(out)
    _check_visible(out_dir, token)
    log = log_path(out_dir, run)
    log.parent.mkdir(parents=True, exist_ok=True)
    handle = os.fdopen(files.open_own(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT), "a", buffering=1)
    with environment(env), handle, contextlib.redirect_stdout(handle), contextlib.redirect_stderr(handle):
        print(f"{run.variant} seed {run.seed} on {socket.gethostname()} (pid {os.getpid()})", flush=True)
        try:
            config = dataclasses.replace(run.config, train=dataclasses.replace(run.config.train, threads=threads))
            while True:
                while _in_use(run.run_dir):  # the same run submitted twice: the second waits, then finds it done
                    time.sleep(1.0)
                if (run.run_dir / "results.json").exists():
                    return "done"
                resume = (run.run_dir / "checkpoint.pt").exists()
                try:
                    train(config, run.run_dir, resume=resume)
                except ConfigError:
                    if _in_use(run.run_dir) or (run.run_dir / "results.json").exists():
                        continue  # the twin took the lock between the check and the start
                    raise
                return "resumed" if resume else "trained"
        except BaseException:
            traceback.print_exc()
            raise


@dataclass(frozen=True)
class Job:
    """One run's work on whichever worker calls it (``job(run)``): picklable, so an executor ships it with the run."""

    out: str
    token: str  # the marker --out holds: a worker that reads another one sees another filesystem
    threads: int
    env: dict[str, str]

    def __call__(self, run: Any) -> str:
        """Skip, resume or train ``run``; returns "done", "resumed" or "trained", or raises the run's error."""
        return execute(run, self.out, self.token, self.threads, self.env)


@dataclass
class RunFailure:
    """A run that failed on its executor: its error and the last lines of its log."""

    run: Any
    error: str
    tail: list[str]


def failed_status(failure: RunFailure) -> str:
    """A failed run's status line as it ends: its error's kind alone, since the bench's closing error gives each failure whole."""
    return f"failed ({failure.error.split(':', 1)[0]}; the error and its log close the bench's output)"


def run_failure(run: Any, out: Path, exc: BaseException) -> RunFailure:
    """What a failed run tells: its own error, and the last lines of its log (of the error, where it kept none)."""
    cause = getattr(exc, "cause", None)  # Ray wraps the run's own exception
    exc = cause if isinstance(cause, BaseException) else exc
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    error = f"{type(exc).__name__}: {lines[-1] if lines else 'failed without a message'}"
    if lines and re.match(r"(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*: ", lines[-1]):  # submitit's error ends with the job's own
        error = re.sub(r"^(?:[A-Za-z_]\w*\.)+", "", lines[-1])
    log = log_path(out, run)
    tail = log.read_text(errors="replace").splitlines()[-LOG_TAIL:] if log.exists() else lines[-LOG_TAIL:]
    return RunFailure(run, error, tail)


class Executor:
    """Where a bench's pending runs train: subclass it, register it with ``register_executors``, choose it with ``--executor NAME``.

    A bench makes one with its options (``Options``, read from ``[bench.executor]``) and calls
    ``run``. The default ``run`` marks ``--out``, sets ``self.job``, calls ``start``, then keeps up
    to ``workers`` runs submitted: ``submit(run)`` starts ``self.job(run)`` on a worker and returns
    a handle, ``ready(handles)`` returns those whose job ended, ``outcome(handle)`` returns its
    status or raises its error. ``close`` comes last however the bench ends, an interrupt
    (Ctrl-C, SIGINT) included: it must stop every run still training, and return within seconds.
    A stopped run keeps its last checkpoint, so the same bench command resumes it exactly.
    """

    name: ClassVar[str] = ""  # what --executor names
    requires: ClassVar[dict[str, str]] = {}  # module -> the pip requirement that installs it; checked before a bench plans
    detaches: ClassVar[bool] = False  # its jobs outlive the bench: --no-wait submits them and returns, a later call collects them
    Options: ClassVar[type[ExecutorOptions]] = ExecutorOptions  # its [bench.executor] keys

    def __init__(self, options: ExecutorOptions, out: Path, env: dict[str, str], registry: Any = None) -> None:
        self.options = options
        self.out = Path(out)
        self.env = env  # what the runs' trackers are told (one MLflow store and experiment for the bench)
        self.registry = registry  # the bench's; a job in another process finds plugins through entry points
        self.job: Job | None = None
        self.slots: int | None = None  # runs that fit at once, once started (None: unknown)

    def start(self) -> None:
        """Start or join what runs the jobs (``self.job`` is set); raise ConfigError when that cannot work here."""

    def submit(self, run: Any) -> Any:
        """Start ``self.job(run)`` on a worker and return a handle for ``ready`` and ``outcome``."""
        raise NotImplementedError(f"executor {self.name!r} implements neither run nor submit")

    def ready(self, handles: list[Any]) -> list[Any]:
        """The ``handles`` whose job ended, after waiting about POLL_SECONDS when none has."""
        raise NotImplementedError(f"executor {self.name!r} implements neither run nor ready")

    def outcome(self, handle: Any) -> str:
        """The ended job's status ("trained", "resumed" or "done"), or its error raised."""
        raise NotImplementedError(f"executor {self.name!r} implements neither run nor outcome")

    def adopt(self, run: Any) -> Any | None:
        """A handle on the job an earlier --no-wait call submitted for ``run``, while it is queued or running (else None)."""
        return None

    def where(self) -> str:
        """Where the submitted jobs can be found, said after --no-wait."""
        return str(self.out)

    def close(self) -> None:
        """End what ``start`` began, stopping every run still training; called however the bench ends, an interrupt included."""

    def run(self, pending: list[tuple[Any, bool]], on_run: Callable[[Any, str], None] | None = None) -> tuple[list[RunFailure], int | None]:
        """Train the ``(run, resume)`` pairs of ``pending``; returns the failures and how many ran at once (None: unknown)."""
        out = self.out = self.out.resolve()
        existed, marked = out.exists(), (out / MARKER).exists()
        self.job = Job(str(out), mark_out(out), self.options.cpus_per_run, self.env)
        try:
            self.start()
        except BaseException:  # a refused executor (no sbatch, no cluster) leaves --out as it found it
            if not marked:
                (out / MARKER).unlink(missing_ok=True)
            if not existed:
                with contextlib.suppress(OSError):
                    out.rmdir()
            raise
        try:
            return self._drive([run for run, _ in pending], on_run)
        finally:
            self.close()

    def _drive(self, queue: list[Any], on_run: Callable[[Any, str], None] | None) -> tuple[list[RunFailure], int | None]:
        options, out, failures = self.options, self.out, []
        active: list[tuple[Any, Any]] = []  # (handle, run): a handle need not be hashable
        for run in list(queue):  # jobs an earlier --no-wait call submitted are waited for, never submitted twice
            handle = self.adopt(run)
            if handle is not None:
                queue.remove(run)
                active.append((handle, run))
        if not options.wait:
            adopted = [run for _, run in active]
            for run in queue:
                self.submit(run)
            for run in [*adopted, *queue]:
                if on_run:
                    on_run(run, f"{'queued or running' if run in adopted else 'submitted'} ({self.where()})")
            return failures, None
        for run in queue:
            log_path(out, run).unlink(missing_ok=True)  # a log that exists is a run that started
        cap, finished = options.workers, 0
        while queue or active:
            while queue and (cap is None or len(active) < cap):
                run = queue.pop(0)
                active.append((self.submit(run), run))
            for handle in self.ready([h for h, _ in active]):
                index = next((i for i, (h, _) in enumerate(active) if h is handle), None)
                if index is None:  # a ready() that returns equal handles rather than the same objects
                    index = next(i for i, (h, _) in enumerate(active) if h == handle)
                run = active.pop(index)[1]
                try:
                    status = self.outcome(handle)
                    finished += 1
                except Exception as exc:
                    failures.append(run_failure(run, out, exc))
                    status = failed_status(failures[-1])
                if on_run:
                    running = sum(1 for _, r in active if log_path(out, r).exists())
                    counts = f"{finished} finished, {running} running, {len(failures)} failed, {len(active) - running + len(queue)} waiting"
                    on_run(run, f"{status} [{self.name}: {counts}]")
        slots = self.slots
        return failures, (min(slots, cap) if slots and cap else slots or cap)


def executor_class(choice: ExecutorChoice, registry: Any = None) -> type[Executor]:
    """The registered executor ``choice`` names, once it is known that it can run here; else one ConfigError line."""
    table = (registry or get_registry()).executors
    cls = table.get(choice.name)
    if cls is None:
        raise ConfigError(
            f"--executor {choice.name!r} is not a registered executor{closest(choice.name, table)} (known: {', '.join(sorted(table))}; see `layerdescent list`)"
        )
    if not choice.options.wait and not cls.detaches:
        detaching = (
            " or ".join(sorted(name for name, c in table.items() if c.detaches)) or "one whose jobs outlive the bench (none is registered)"
        )
        raise ConfigError(f"--no-wait is for --executor {detaching}, whose jobs outlive the bench; a {choice.name} run ends with it")
    check_installed(cls.requires, f"--executor {choice.name}")
    return cls


def failure_report(failures: list[RunFailure], total: int, summary: Path | None, left: int = 0) -> RunsFailed:
    """One error naming every failed run, its error and its log's last lines; ``left`` of them were failed before and not retried."""
    where = f"; {summary} covers the runs that finished" if summary else ""
    diverged = sum(failure.error.startswith("DivergenceError") for failure in failures)
    # a resume is exact, so a retried divergence diverges again at the same step
    repeats = (
        f" ({diverged} diverged: retried, each diverges again where it did; change the setting its error names and --out a new directory,"
        " or --skip-failed leaves them as they are)"
        if diverged
        else ""
    )
    retry = "run the same command again to retry them"
    if left:  # the runs left are the last ``left`` failures
        others = len(failures) - left
        retry = f"{left} of them failed before and were left (--skip-failed): run without it to retry them" + (
            f"; the same command again retries the other {others}" if others else ""
        )
        repeats = ""
    lines = [f"{len(failures)} of {total} runs failed{where}; {retry}{repeats}"]
    for failure in failures:
        lines.append(f"{failure.run.variant} seed {failure.run.seed}: {failure.error}")
        lines.extend(f"  | {line}" for line in failure.tail)
    return RunsFailed("\n".join(lines))
