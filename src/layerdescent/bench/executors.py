"""Executors: where a bench's pending runs train, each registered by a plugin like a task or a solver.

    layerdescent bench FILE --out DIR [--workers 2]                     # local: a process pool here
    layerdescent bench FILE --out DIR --executor ray [--ray-address HOST:PORT] [--cpus-per-run 2] [--gpus-per-run 1]
    layerdescent bench FILE --out DIR --executor slurm [--partition gpu] [--time 120] [--no-wait]
    layerdescent bench FILE --out DIR --executor NAME                   # one a plugin registers (`layerdescent list`)

``local`` trains in this process or a pool of ``--workers`` processes; ``ray`` makes every run a
Ray task (a local Ray instance unless ``--ray-address`` names a cluster); ``slurm`` submits every
run as a job through submitit (``[bench.slurm]`` holds the same settings as the flags). A plugin's
executor subclasses :class:`Executor` and implements ``submit``, ``ready`` and ``outcome`` over
its own jobs, each of which calls ``self.job(run)``. Every executor keeps the run directory
layout, the skip and resume rules and the summary of the local one, and every job decides again,
when its run starts, whether to resume it, so a run submitted twice trains once. ``--out`` must
lie on a filesystem every worker sees: each job checks that it finds the bench's marker file
there before it trains. Each job's output goes to ``OUT/logs/VARIANT/seed-N.log``; a failed run is
reported by name with the last lines of that log, and the other runs go on.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import errno
import fcntl
import functools
import json
import math
import os
import re
import shutil
import signal
import socket
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar
from unittest import mock

from layerdescent.errors import ConfigError, LayerdescentError
from layerdescent.hookspecs import hookimpl
from layerdescent.optional import check_installed, require
from layerdescent.run import progress, rundir

MARKER = ".layerdescent-out"  # written by the bench in --out; a worker that cannot read it sees another filesystem
LOG_TAIL = 12  # lines of a failed run's log in the bench's report
SLURM_KEYS = ("partition", "time", "mem_gb", "cpus_per_run", "gpus_per_run", "account", "cluster")
ACTIVE_SLURM_STATES = ("PENDING", "RUNNING", "REQUEUED", "CONFIGURING", "COMPLETING", "RESIZING", "SUSPENDED")
POLL_SECONDS = 0.5
# Far above any real job, low enough that a typo (an extra digit, nan) is refused before anything is submitted.
MAX_WORKERS, MAX_CPUS, MAX_GPUS, MAX_MINUTES, MAX_MEM_GB = 4096, 4096, 64, 366 * 24 * 60, 100_000


class RunsFailed(LayerdescentError):
    """Some runs of a bench failed on their executor; the others finished."""


@dataclass(frozen=True)
class ExecutorOptions:
    """How and where a bench's runs execute: flags of `layerdescent bench`, or its ``[bench.slurm]`` table."""

    name: str = "local"
    workers: int | None = None  # runs at once; None: as many as the executor's resources allow
    ray_address: str | None = None
    cpus_per_run: int = 1
    gpus_per_run: float = 0.0
    partition: str | None = None
    time: int = 60  # minutes a SLURM job may run
    mem_gb: float | None = None
    account: str | None = None
    cluster: str = "slurm"  # submitit's cluster: slurm, or local (jobs as processes here, for trying a bench out)
    wait: bool = True

    def __post_init__(self) -> None:
        # the name is checked against the registered executors when a bench starts (executor_class)
        if self.workers is not None and self.workers < 1:
            raise ConfigError(f"--workers must be at least 1, got {self.workers}")
        if self.workers is not None and self.workers > MAX_WORKERS:
            raise ConfigError(f"--workers must be at most {MAX_WORKERS}, got {self.workers}")
        if self.cpus_per_run < 1 or self.gpus_per_run < 0:
            raise ConfigError(
                f"--cpus-per-run must be at least 1 and --gpus-per-run at least 0, got {self.cpus_per_run} and {self.gpus_per_run}"
            )
        if self.cpus_per_run > MAX_CPUS:
            raise ConfigError(f"--cpus-per-run (bench.slurm.cpus_per_run) must be at most {MAX_CPUS}, got {self.cpus_per_run}")
        if not (math.isfinite(self.gpus_per_run) and self.gpus_per_run <= MAX_GPUS):
            raise ConfigError(f"--gpus-per-run (bench.slurm.gpus_per_run) must be a number in 0..{MAX_GPUS}, got {self.gpus_per_run}")
        if not 1 <= self.time <= MAX_MINUTES:
            raise ConfigError(f"--time (bench.slurm.time) must be in 1..{MAX_MINUTES} minutes (a year), got {self.time}")
        if self.mem_gb is not None and not (math.isfinite(self.mem_gb) and 0 < self.mem_gb <= MAX_MEM_GB):
            raise ConfigError(f"--mem-gb (bench.slurm.mem_gb) must be a number of GB in (0, {MAX_MEM_GB}], got {self.mem_gb}")
        if self.cluster not in ("slurm", "local"):
            raise ConfigError(
                f"bench.slurm.cluster = {self.cluster!r} is not allowed (allowed: 'slurm', or 'local' to run the jobs as processes here)"
            )
        if self.ray_address and self.name != "ray":
            raise ConfigError("--ray-address needs --executor ray")


def slurm_table(bench: dict[str, Any]) -> dict[str, Any]:
    """The ``[bench.slurm]`` table's settings, checked: ExecutorOptions field names and values."""
    table = bench.get("slurm", {})
    if not isinstance(table, dict):
        raise ConfigError('bench.slurm must be a table, e.g. [bench.slurm] partition = "gpu"')
    unknown = sorted(set(table) - set(SLURM_KEYS))
    if unknown:
        from layerdescent.registry import closest

        raise ConfigError(f"unknown key bench.slurm.{unknown[0]}{closest(unknown[0], SLURM_KEYS)} (allowed: {', '.join(SLURM_KEYS)})")
    kinds = {
        "partition": str,
        "account": str,
        "cluster": str,
        "time": int,
        "cpus_per_run": int,
        "mem_gb": (int, float),
        "gpus_per_run": (int, float),
    }
    for key, value in table.items():
        if isinstance(value, bool) or not isinstance(value, kinds[key]):
            raise ConfigError(f"bench.slurm.{key} must be {'a string' if kinds[key] is str else 'a number'}, got {value!r}")
    return dict(table)


def mark_out(out: Path) -> str:
    """The id of ``out`` that workers must find there (written once), proof that they see the same directory."""
    rundir.usable_dir(out)
    marker = out / MARKER
    rundir.refuse_links(out, (MARKER,), folders=("logs", ".submitit"))  # the runs' logs and submitit's jobs stay inside --out
    if not marker.exists():
        rundir.write_atomic(marker, uuid.uuid4().hex + "\n")
    return marker.read_text().strip()


def _check_visible(out: Path, token: str) -> None:
    marker = out / MARKER
    try:
        seen = marker.read_text().strip()
    except OSError:
        seen = None
    if seen != token:
        raise ConfigError(
            f"--out {out} is not the bench's directory on worker {socket.gethostname()} ({marker} is missing or another one): "
            "put --out on a filesystem every worker sees (a shared or network filesystem, not a node's local disk)"
        )


def _in_use(run_dir: Path) -> bool:
    """Whether another process holds ``run_dir``'s lock (trains it) right now: on the directory itself, or on its lock file."""
    for path, flags in ((run_dir, os.O_RDONLY | os.O_DIRECTORY), (run_dir / rundir.LOCK, os.O_RDONLY | os.O_NOFOLLOW)):
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


def log_path(out: Path, run: Any) -> Path:
    """Where a run's output goes when it trains on an executor."""
    return out / "logs" / run.variant / f"seed-{run.seed}.log"


def execute(run: Any, out: str, token: str, threads: int, env: dict[str, str]) -> str:
    """One run on a worker: check that it sees ``out``, wait out another holder, then skip, resume or train it."""
    from layerdescent.run.trainer import train

    out_dir = Path(out)
    _check_visible(out_dir, token)
    log = log_path(out_dir, run)
    log.parent.mkdir(parents=True, exist_ok=True)
    handle = os.fdopen(rundir.open_own(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT), "a", buffering=1)
    with mock.patch.dict(os.environ, env), handle, contextlib.redirect_stdout(handle), contextlib.redirect_stderr(handle):
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

    A bench makes one with its settings and calls ``run``. The default ``run`` marks ``--out``, sets
    ``self.job``, calls ``start``, then keeps up to ``--workers`` runs submitted: ``submit(run)``
    starts ``self.job(run)`` on a worker and returns a handle, ``ready(handles)`` returns those whose
    job ended, ``outcome(handle)`` returns its status or raises its error; ``close`` comes last.
    """

    name: ClassVar[str] = ""  # what --executor names
    requires: ClassVar[dict[str, str]] = {}  # module -> the pip requirement that installs it; checked before a bench plans
    detaches: ClassVar[bool] = False  # its jobs outlive the bench: --no-wait submits them and returns, a later call collects them

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
        """End what ``start`` began; called however the bench ends."""

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
                    status = f"failed: {failures[-1].error}"
                if on_run:
                    running = sum(1 for _, r in active if log_path(out, r).exists())
                    counts = f"{finished} finished, {running} running, {len(failures)} failed, {len(active) - running + len(queue)} waiting"
                    on_run(run, f"{status} [{self.name}: {counts}]")
        slots = self.slots
        return failures, (min(slots, cap) if slots and cap else slots or cap)


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _watch_parent(parent: int) -> None:
    """Exit as soon as the bench that started this worker is gone (where PR_SET_PDEATHSIG is not available)."""
    while True:
        if os.getppid() != parent:
            os._exit(1)
        time.sleep(1.0)


def worker_init(parent: int) -> None:
    """Tie a worker's life to its parent's (a bench's, an evaluation's): a killed parent leaves no run going on."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:  # the bench died before the signal was armed
        os._exit(1)
    progress.share_terminal()  # one terminal, several runs: timed lines, not bars drawn over each other
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True, name="layerdescent-parent-watch").start()


def _train_one(run: Any, resume: bool) -> None:
    """A worker process's job: one run on one torch thread."""
    from layerdescent.run.trainer import train

    config = dataclasses.replace(run.config, train=dataclasses.replace(run.config.train, threads=1))
    train(config, run.run_dir, resume=resume)


def _settle(
    run: Any, resume: bool, outcome: Callable[[], Any], out: Path, failures: list, on_run: Callable[[Any, str], None] | None
) -> None:
    """Wait for one run's ``outcome`` and tell how it ended; a failed run is recorded and the others go on."""
    try:
        outcome()
        status = "resumed" if resume else "trained"
    except Exception as exc:
        failures.append(run_failure(run, out, exc))
        status = f"failed: {failures[-1].error}"
    if on_run:
        on_run(run, status)


class _Local(Executor):
    """This machine: --workers N processes of one torch thread each (default: one run at a time, in the bench's process)."""

    name = "local"

    def run(self, pending: list[tuple[Any, bool]], on_run: Callable[[Any, str], None] | None = None) -> tuple[list[RunFailure], int | None]:
        from layerdescent.run.trainer import train

        workers, failures = self.options.workers or 1, []
        if workers == 1:
            with mock.patch.dict(os.environ, self.env):  # for the block and the workers it starts
                for run, resume in pending:
                    _settle(
                        run,
                        resume,
                        functools.partial(train, run.config, run.run_dir, resume=resume, registry=self.registry),
                        self.out,
                        failures,
                        on_run,
                    )
        else:
            with (
                mock.patch.dict(os.environ, self.env),
                ProcessPoolExecutor(workers, initializer=worker_init, initargs=(os.getpid(),)) as pool,
            ):
                jobs = {pool.submit(_train_one, run, resume): (run, resume) for run, resume in pending}
                for job in as_completed(jobs):  # told as each ends
                    _settle(*jobs[job], job.result, self.out, failures, on_run)
        return failures, workers


def _call(job: Job, run: Any) -> str:
    """``job(run)`` as a plain function, the form Ray makes a remote task of."""
    return job(run)


class _Ray(Executor):
    """Every run a Ray task, on a local Ray instance or the cluster --ray-address joins."""

    name = "ray"
    requires: ClassVar[dict[str, str]] = {"ray": "layerdescent[ray]"}

    def start(self) -> None:
        self.ray = ray = require("ray", "ray", "--executor ray")
        options = self.options
        self.started = False
        if not ray.is_initialized():
            if options.ray_address:
                ray.init(address=options.ray_address, log_to_driver=False)
            else:
                cpus = (options.workers or 0) * options.cpus_per_run or os.cpu_count() or 1
                ray.init(
                    num_cpus=cpus,
                    num_gpus=options.gpus_per_run * (options.workers or 0) or None,
                    include_dashboard=False,
                    log_to_driver=False,
                )
            self.started = True
        self.remote = ray.remote(num_cpus=options.cpus_per_run, num_gpus=options.gpus_per_run, max_retries=0)(_call)
        self.slots = max(1, int(ray.cluster_resources().get("CPU", 1) // options.cpus_per_run))

    def submit(self, run: Any) -> Any:
        return self.remote.remote(self.job, run)

    def ready(self, handles: list[Any]) -> list[Any]:
        done, _ = self.ray.wait(handles, num_returns=len(handles), timeout=POLL_SECONDS)
        return done

    def outcome(self, handle: Any) -> str:
        return self.ray.get(handle)

    def close(self) -> None:
        if getattr(self, "started", False):
            self.ray.shutdown()


class _Slurm(Executor):
    """Every run a SLURM job through submitit (or a process here: [bench.slurm] cluster = "local")."""

    name = "slurm"
    requires: ClassVar[dict[str, str]] = {"submitit": "layerdescent[slurm]"}
    detaches = True

    def start(self) -> None:
        self.submitit = submitit = require("submitit", "slurm", "--executor slurm")
        options = self.options
        if options.cluster == "slurm" and shutil.which("sbatch") is None:
            raise ConfigError(
                '--executor slurm: there is no sbatch here; run the bench on a SLURM login node (or set [bench.slurm] cluster = "local" to try it as local jobs)'
            )
        self.folder = self.out / ".submitit"
        self.jobs_file = self.folder / "jobs.json"
        self.executor = submitit.AutoExecutor(folder=str(self.folder), cluster=options.cluster)
        parameters: dict[str, Any] = {"timeout_min": options.time, "cpus_per_task": options.cpus_per_run, "tasks_per_node": 1, "nodes": 1}
        if options.gpus_per_run:
            parameters["gpus_per_node"] = int(options.gpus_per_run)
        if options.mem_gb:
            parameters["mem_gb"] = options.mem_gb
        if options.partition:
            parameters["slurm_partition"] = options.partition
        if options.account:
            parameters["slurm_account"] = options.account
        self.executor.update_parameters(**parameters)

    def recorded(self) -> dict[str, str]:
        """The job id of every run submitted into this --out, by variant and seed."""
        try:
            return json.loads(self.jobs_file.read_text())
        except (OSError, ValueError):
            return {}

    def adopt(self, run: Any) -> Any | None:
        job_id = self.recorded().get(_key(run))
        if job_id is None:
            return None
        if self.options.cluster == "local":
            # submitit's local job id is its controller's pid, which outlives the call that started it
            job = self.submitit.LocalJob(str(self.folder), job_id)
            return _LocalJob(job) if _alive(int(job_id)) else None
        job = self.submitit.SlurmJob(str(self.folder), job_id)
        return job if job.state.split()[0] in ACTIVE_SLURM_STATES else None

    def where(self) -> str:
        return str(self.folder)

    def submit(self, run: Any) -> Any:
        self.executor.update_parameters(name=f"layerdescent-{run.variant}-seed-{run.seed}")
        job = self.executor.submit(self.job, run)
        jobs = self.recorded()
        jobs[_key(run)] = job.job_id
        rundir.write_atomic(self.jobs_file, json.dumps(jobs, indent=2) + "\n")
        return job

    def ready(self, handles: list[Any]) -> list[Any]:
        done = [job for job in handles if job.done()]
        if not done:
            time.sleep(POLL_SECONDS)
        return done

    def outcome(self, handle: Any) -> str:
        return handle.result()


class _LocalJob:
    """A local job started by another call: done once its controller process is gone."""

    def __init__(self, job: Any) -> None:
        self.job = job

    def done(self) -> bool:
        return not _alive(int(self.job.job_id))

    def result(self) -> Any:
        return self.job.result()


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, finished but not yet reaped, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)  # no /proc (macOS): existence is all that can be known
        except OSError:
            return False
        return True
    return state not in ("Z", "X")


def _key(run: Any) -> str:
    return f"{run.variant}/seed-{run.seed}"


@hookimpl
def register_executors(register) -> None:
    """The built-in executors go through the same hook a third-party plugin uses."""
    for executor in (_Local, _Ray, _Slurm):
        register(executor)


def executor_class(options: ExecutorOptions, registry: Any = None) -> type[Executor]:
    """The registered executor ``options`` names, once it is known that it can run here; else one ConfigError line."""
    from layerdescent.registry import closest, get_registry

    table = (registry or get_registry()).executors
    cls = table.get(options.name)
    if cls is None:
        raise ConfigError(
            f"--executor {options.name!r} is not a registered executor{closest(options.name, table)} (known: {', '.join(sorted(table))}; see `layerdescent list`)"
        )
    if not options.wait and not cls.detaches:
        detaching = (
            " or ".join(sorted(name for name, c in table.items() if c.detaches)) or "one whose jobs outlive the bench (none is registered)"
        )
        raise ConfigError(f"--no-wait is for --executor {detaching}, whose jobs outlive the bench; a {options.name} run ends with it")
    check_installed(cls.requires, f"--executor {options.name}")
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
