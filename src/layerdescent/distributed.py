"""Data parallelism over torch.distributed: one process per device, launched by ``torchrun``.

    torchrun --nproc_per_node=2 -m layerdescent.cli run run.toml     # 2 CPU processes (gloo)
    torchrun --nproc_per_node=8 -m layerdescent.cli run run.toml     # 8 GPUs (nccl)

Every rank takes its shard of each global batch. The layer means that drive the multipliers are
reduced over all ranks before anything uses them, so lambda is identical on every rank at every
step, and gradients are averaged over ranks, each rank's loss weighted by its sample count. Gradients are reduced
after the backward pass rather than by wrapping the model in DistributedDataParallel, because a
task may call its model's submodules directly, which DDP's forward hooks would miss.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class World:
    """This process's rank among ``size`` data-parallel processes (size 1 without torchrun)."""

    rank: int = 0
    size: int = 1
    owns_group: bool = False

    @classmethod
    def current(cls) -> World:
        """The process group this process is in now (one rank of one without torch.distributed): what a loop of a user's own joined."""
        if dist.is_available() and dist.is_initialized():
            return cls(dist.get_rank(), dist.get_world_size())
        return cls()

    @property
    def is_main(self) -> bool:
        """Whether this rank writes logs, checkpoints and results."""
        return self.rank == 0

    def sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` summed over ranks (a copy; the input is left as it was)."""
        if self.size == 1:
            return tensor
        out = tensor.clone()
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
        return out

    def weighted_mean(self, means: torch.Tensor, weight: float) -> torch.Tensor:
        """One micro-batch's layer means over every rank, each rank's weighted by its share (these means on one rank)."""
        if self.size == 1:
            return means
        flat = self.sum(torch.cat([means * weight, torch.tensor([float(weight)], dtype=means.dtype, device=means.device)]))
        return flat[:-1] / flat[-1]

    def reduce_step(self, means: torch.Tensor, tables: dict[str, tuple[Any, Any]]) -> tuple[torch.Tensor, dict[str, tuple[Any, Any]]]:
        """A step's layer means averaged over ranks and its per-group sums and counts added, in one all-reduce (each rank saw its own rows)."""
        parts = [means, *(t.to(means.dtype).flatten() for sums, counts in tables.values() for t in (sums, counts))]
        flat = self.sum(torch.cat(parts))
        width = means.numel()
        offset, reduced = width, {}
        for name, (sums, counts) in tables.items():
            sums_, offset = flat[offset : offset + sums.numel()].view_as(sums).to(sums.dtype), offset + sums.numel()
            counts_, offset = flat[offset : offset + counts.numel()].view_as(counts).to(counts.dtype), offset + counts.numel()
            reduced[name] = (sums_, counts_)
        return flat[:width] / self.size, reduced

    def average_gradients(self, parameters: Iterable[torch.nn.Parameter]) -> None:
        """Replace each gradient by its mean over ranks, in one flat all-reduce (as DDP does: each rank's loss weighted by its share times the world size)."""
        if self.size == 1:
            return
        params = [p for p in parameters if p.requires_grad]
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch._utils._flatten_dense_tensors(grads)
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        flat /= self.size
        for p, reduced in zip(params, torch._utils._unflatten_dense_tensors(flat, grads)):
            p.grad = reduced

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj`` (tensors and plain data), in rank order."""
        if self.size == 1:
            return [obj]
        # all_gather_object cannot pickle tensors here; torch.save's format can, and reads back as data.
        buffer = io.BytesIO()
        torch.save(obj, buffer)
        out: list[Any] = [None] * self.size
        dist.all_gather_object(out, buffer.getvalue())
        return [torch.load(io.BytesIO(data), weights_only=True) for data in out]

    def barrier(self) -> None:
        """Wait for every rank."""
        if self.size > 1:
            dist.barrier()

    def close(self) -> None:
        """Leave the process group this run joined; one the caller made stays theirs."""
        if self.owns_group and dist.is_initialized():
            # gloo's threads must stop before the interpreter does, or exit aborts the process.
            dist.barrier()
            dist.destroy_process_group()


def init_world(device: str = "auto") -> tuple[World, torch.device]:
    """Join the process group torchrun describes (if any) and pick this rank's device."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    chosen = torch.device(f"cuda:{local_rank}" if use_cuda else "cpu")
    if use_cuda:
        torch.cuda.set_device(chosen)
    if size == 1:
        return World(), chosen
    owns = not dist.is_initialized()
    if owns:
        dist.init_process_group(backend="nccl" if use_cuda else "gloo")
    return World(dist.get_rank(), dist.get_world_size(), owns), chosen


def to_device(batch: Any, device: torch.device) -> Any:
    """``batch`` with every tensor inside it (dicts, lists, tuples) moved to ``device``."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(v, device) for v in batch)
    return batch
