"""The SLURM executor: every run a job through submitit (or a process here, with ``cluster = "local"``)."""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal, Union

from layerdescent.bench.executors.base import MAX_MEM_GB, MAX_MINUTES, POLL_SECONDS, Executor, ExecutorOptions, check_gpus
from layerdescent.errors import ConfigError
from layerdescent.optional import require
from layerdescent.readback import read_json
from layerdescent.run import files

ACTIVE_SLURM_STATES = ("PENDING", "RUNNING", "REQUEUED", "CONFIGURING", "COMPLETING", "RESIZING", "SUSPENDED")


@dataclass(frozen=True)
class SlurmOptions(ExecutorOptions):
    """The SLURM executor's [bench.executor] keys."""

    partition: Union[str, None] = None
    """The SLURM partition; unset: the cluster's default."""
    time: int = 60
    """Minutes a job may run."""
    mem_gb: Union[float, None] = None
    """Memory per job in GB; unset: the partition's default."""
    gpus_per_run: float = 0.0
    """GPUs per job."""
    account: Union[str, None] = None
    """The SLURM account jobs are charged to; unset: the user's default."""
    cluster: Literal["slurm", "local"] = "slurm"
    """`slurm`, or `local`: the jobs as processes here, for trying a bench out."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_gpus(self.gpus_per_run)
        if not 1 <= self.time <= MAX_MINUTES:
            raise ConfigError(f"bench.executor.time must be in 1..{MAX_MINUTES} minutes (a year), got {self.time}")
        if self.mem_gb is not None and not (math.isfinite(self.mem_gb) and 0 < self.mem_gb <= MAX_MEM_GB):
            raise ConfigError(f"bench.executor.mem_gb must be a number of GB in (0, {MAX_MEM_GB}], got {self.mem_gb}")


class Slurm(Executor):
    """Every run a SLURM job through submitit (or a process here: [bench.executor] cluster = "local")."""

    name = "slurm"
    Options = SlurmOptions
    requires: ClassVar[dict[str, str]] = {"submitit": "layerdescent[slurm]"}
    detaches = True

    def start(self) -> None:
        self.submitit = submitit = require("submitit", "slurm", "--executor slurm")
        options = self.options
        if options.cluster == "slurm" and shutil.which("sbatch") is None:
            raise ConfigError(
                '--executor slurm: there is no sbatch here; run the bench on a SLURM login node (or set [bench.executor] cluster = "local" to try it as local jobs)'
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
        jobs = read_json(
            self.jobs_file, optional=True, fix="delete it and run the bench again (it then submits the runs it cannot find anew)"
        )
        return {str(k): str(v) for k, v in jobs.items() if isinstance(v, (str, int))} if isinstance(jobs, dict) else {}

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
        files.write_atomic(self.jobs_file, json.dumps(jobs, indent=2) + "\n")
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
