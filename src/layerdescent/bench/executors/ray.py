"""The Ray executor: every run a Ray task, on a local Ray instance or the cluster ``address`` joins."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, ClassVar, Union

from layerdescent.bench.executors.base import POLL_SECONDS, Executor, ExecutorOptions, Job, check_gpus
from layerdescent.optional import require


@dataclass(frozen=True)
class RayOptions(ExecutorOptions):
    """The Ray executor's [bench.executor] keys."""

    address: Union[str, None] = None
    """Join this Ray cluster (HOST:PORT); unset: start a local Ray instance."""
    gpus_per_run: float = 0.0
    """GPUs each run's task asks for."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_gpus(self.gpus_per_run)


def _call(job: Job, run: Any) -> str:
    """``job(run)`` as a plain function, the form Ray makes a remote task of."""
    return job(run)


class Ray(Executor):
    """Every run a Ray task, on a local Ray instance or the cluster bench.executor.address joins."""

    name = "ray"
    Options = RayOptions
    requires: ClassVar[dict[str, str]] = {"ray": "layerdescent[ray]"}

    def start(self) -> None:
        self.ray = ray = require("ray", "ray", "--executor ray")
        options = self.options
        self.started = False
        if not ray.is_initialized():
            if options.address:
                ray.init(address=options.address, log_to_driver=False)
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
