"""What one run trains, built from its config (seeds, the splits in memory, the model, its optimizer and the constrained update), and a step's gradient pass over this rank's shards."""

from __future__ import annotations

import contextlib
import math
import random
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from layerdescent.core.divergence import check_nonnegative
from layerdescent.core.problem import LayerwiseProblem
from layerdescent.core.update import LayerwiseUpdate
from layerdescent.distributed import World, init_world, to_device
from layerdescent.errors import ConfigError, DataError, PluginError
from layerdescent.registry import Registry, get_registry
from layerdescent.run.config import LrSchedule, Precision, RunConfig, TrainConfig, check_depth
from layerdescent.run.data import Rows
from layerdescent.run.guard import build_task, calling, describe

# Below this many parameters train.threads = 0 trains on one thread: on 2 CPUs lista's 50k-parameter model took
# 5.5 ms an erm step on one thread and 7.1 ms on two, a 3.1M-parameter one 78 ms on one and 63 ms on two
# (python benchmarks/cost.py --task lista --out benchmarks/results/lista/cost.md).
SMALL_MODEL = 500_000


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch."""
    random.seed(seed)
    np.random.seed(seed % 2**32)  # a rank's offset seed may pass numpy's 32 bits; below them nothing changes
    torch.manual_seed(seed)


def epoch_steps(samples: int, train: TrainConfig) -> tuple[int, int]:
    """Micro-batches and optimizer steps in one epoch over ``samples`` training rows."""
    micro = math.ceil(samples / train.batch_size)
    return micro, math.ceil(micro / train.accumulate)


class CosineSchedule(torch.optim.lr_scheduler.LRScheduler):
    """train.lr_schedule = "cosine": each group's lr anneals as lr * (1 + cos(pi * step / total)) / 2 to 0 at the run's last step."""

    def __init__(self, optimizer: torch.optim.Optimizer, total: int) -> None:
        self.total = max(total, 1)
        super().__init__(optimizer)

    def get_lr(self) -> list[float]:
        """The learning rates of step ``last_epoch``, from the step count alone."""
        return [base * 0.5 * (1 + math.cos(math.pi * min(self.last_epoch, self.total) / self.total)) for base in self.base_lrs]

    def step(self, epoch: int | None = None) -> None:
        """Move to the next optimizer step (also after a step skipped for a non-finite loss, whose count the schedule follows)."""
        with warnings.catch_warnings():  # a skipped first step calls this before optimizer.step(): harmless here
            warnings.simplefilter("ignore", UserWarning)
            super().step()

    def resume(self, step: int) -> None:
        """Put the schedule at ``step`` (a checkpoint written before the schedule kept its own state)."""
        self.last_epoch = step
        for group, lr in zip(self.optimizer.param_groups, self.get_lr()):
            group["lr"] = lr
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]


def set_dropout(model: torch.nn.Module, rate: float, task: str) -> None:
    """Give every dropout layer of ``model`` the rate ``train.dropout`` asks for."""
    layers = [m for m in model.modules() if isinstance(m, torch.nn.modules.dropout._DropoutNd)]
    if not layers:
        raise ConfigError(f"train.dropout = {rate:g}, but task {task!r} builds a model with no dropout layer; remove train.dropout")
    for layer in layers:
        layer.p = rate


@dataclass
class Session:
    """What a run trains: its splits in memory, model, the constrained update and the learning-rate schedule, and how a shard of a batch is read."""

    rows: dict[str, Rows]
    model: torch.nn.Module
    update: LayerwiseUpdate
    labels: list[str]
    world: World = field(default_factory=World)
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    schedule: CosineSchedule | None = None
    task: Any = None  # the task the model is for (its layer_losses, collate)
    config: RunConfig | None = None  # the run it was built for (batches() reads its seed, batch size and band)
    who: str = "the task"  # how errors name the task and its plugin
    band: tuple[float, ...] = (0.0,)  # the training perturbation levels (train.train_gamma)

    @property
    def problem(self) -> LayerwiseProblem:
        """The constraints' Cooper problem (multipliers, labels)."""
        return self.update.problem

    def read_shard(self, shard: torch.Tensor, level: int, full: bool) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """This rank's per-row layer losses on its shard of a micro-batch (differentiable; the last layer's column alone where a last-layer-only read sufficed), and where a grouped constraint reads them, each row's index in the training split and its level's in the band.

        ``level`` indexes the training band; -1 takes the shard at every level of it, the rows
        repeated once per level. Under ``precision = "bf16"`` the forward pass runs in autocast and
        the losses leave it in float32.
        """
        grouped = bool(self.problem.groupings)
        last_only = not (full or self.update.solver.trains_every_layer or grouped or level < 0)
        if not len(shard):  # every rank takes the same branch: the task answers the same on every rank
            last_only = last_only and self.task.overrides("last_layer_losses")
            losses = torch.zeros(0, 1 if last_only else len(self.labels), device=self.device)
        else:
            losses = self._losses(shard, level, last_only)
        if not grouped:  # only per-level and per-sample constraints read who the rows are
            return losses, None, None
        if level < 0:
            return losses, shard.repeat(len(self.band)), torch.arange(len(self.band)).repeat_interleave(len(shard))
        return losses, shard, torch.full((len(shard),), level)

    def _losses(self, shard: torch.Tensor, level: int, last_only: bool) -> torch.Tensor:
        """The task's per-row layer losses on a non-empty shard, checked: they carry gradients, and their means are >= 0 where a constraint needs it."""
        task, band, who = self.task, self.band, self.who
        batch = task.collate(self.rows["train"][shard])
        if self.device.type != "cpu":  # collate builds on the CPU
            batch = to_device(batch, self.device)
        with _autocast(self.device, self.config.train.precision):
            if level < 0:  # every level of the band, in one step
                losses = torch.cat([_float32(task.layer_losses(self.model, batch, gamma=g).losses) for g in band])
            else:
                output = task.last_layer_losses(self.model, batch, gamma=band[level]) if last_only else None
                last_only = output is not None
                if output is None:
                    output = task.layer_losses(self.model, batch, gamma=band[level])
        # the losses leave autocast in float32: the Lagrangian, the layer means and the dual step never see bf16
        losses = losses if level < 0 else _float32(output.losses)
        if not losses.requires_grad and torch.is_grad_enabled():  # the alternating dual pass reads under no_grad
            method = "last_layer_losses" if last_only else "layer_losses"
            raise PluginError(
                f"{who}: {method} returned losses without gradients (computed under torch.no_grad() or detached): nothing would train"
            )
        if self.problem.needs_nonnegative:
            means = losses.detach().mean(dim=0)  # the shard has rows
            if bool((means < 0).any()):  # -inf too: the check tells it apart
                check_nonnegative(who, means, self.problem)  # a plugin's bug, which no setting fixes: raised before any step reads it
        return losses

    def backward(self, group: Sequence[torch.Tensor], levels: Sequence[int], full: bool = True) -> None:
        """Backpropagate the primal loss of a step's micro-batches (this rank's shard of each) through the update, then average the gradients over ranks and clip them.

        ``levels`` gives each micro-batch's level in the band (-1: every level); ``full`` as ``read_shard``.
        """
        train, who = self.config.train, self.who
        total = sum(len(idx) for idx in group)
        world = self.world
        for idx, level in zip(group, levels):
            shard = idx.tensor_split(world.size)[world.rank] if world.size > 1 else idx
            losses, rows, row_levels = self.read_shard(shard, level, full)
            # this rank's share of the step, times the ranks: the update averages means and gradients over ranks, as under DDP
            weight = len(shard) / total * world.size
            # a plugin that changed its parameters in place after the forward pass fails here, named
            with calling(who, "the backward pass through layer_losses"):
                # per-level or per-sample constraints read each row's index and level; the others the layer means alone
                self.update.backward(losses, weight, rows, row_levels)  # a rank whose shard is empty adds no gradient
        if not torch.is_grad_enabled():  # a pass that only counts (a dual pass under no_grad)
            return
        if world.size > 1:  # their losses were weighted as DDP's are
            world.average_gradients(self.model.parameters())
        if train.grad_clip:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), train.grad_clip)


def _autocast(device: torch.device, precision: str) -> Any:
    """The training forward pass's precision: autocast to bfloat16 under train.precision = "bf16", else nothing."""
    if precision == Precision.BF16:
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _float32(losses: torch.Tensor) -> torch.Tensor:
    """Losses a bf16 (or fp16) forward pass gave, in float32; any other dtype as it is, so that fp32 runs keep their numbers."""
    return losses.float() if losses.dtype in (torch.bfloat16, torch.float16) else losses


def build_session(config: RunConfig, task: Any = None, registry: Registry | None = None) -> Session:
    """What ``layerdescent run`` builds before its first step: the data-parallel world joined (if any), seeded, the splits in memory, the model, and its optimizer inside the constrained update.

    ``task`` defaults to the one ``config`` names, from ``registry`` (default: the installed plugins).
    """
    registry = registry or get_registry()
    if task is None:
        task = build_task(registry, config.task.name, config.task.options)
        check_depth(config, task.num_layers, registry)
    train = config.train
    if train.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            "train.device = 'cuda', but this torch has no usable GPU (a CPU build, or no device visible): use 'auto' or 'cpu'"
        )
    world, device = init_world(train.device)
    if train.threads:
        torch.set_num_threads(train.threads)
    seed_everything(config.seed)
    splits = task.build_datasets()
    rows = {}
    for split in ("train", "validation", "test"):
        if split not in splits or len(splits[split]) == 0:
            raise DataError(f"task {task.name!r} built an empty or missing {split!r} split; check its data options")
        rows[split] = Rows(splits[split])
        rows[split].check_finite(split)
    model = task.build_model().to(device)
    if not train.threads and device.type == "cpu" and sum(p.numel() for p in model.parameters()) < SMALL_MODEL:
        torch.set_num_threads(1)  # a small model's steps are too short to share: a second thread only adds its overhead
    if train.dropout is not None:
        set_dropout(model, train.dropout, task.name)
    if world.rank:  # the same initial model everywhere, independent perturbations per rank
        seed_everything(config.seed + 1_000_003 * world.rank)
    solver = config.solver
    scheme = registry.solver(solver.name).scheme_of(solver.options)
    primal = scheme.primal_optimizer([p for p in model.parameters() if p.requires_grad], train)  # the scheme's, e.g. extragradient
    update = LayerwiseUpdate(
        config.constraints,
        task.num_layers,
        primal,
        solver.name,
        registry=registry,
        band=train.band,
        rows=len(rows["train"]),
        **vars(solver.options),
    ).to(device)
    schedule = (
        CosineSchedule(primal, train.epochs * epoch_steps(len(rows["train"]), train)[1]) if train.lr_schedule == LrSchedule.COSINE else None
    )
    labels = [f"l{k}" for k in range(task.num_layers + 1)]
    return Session(rows, model, update, labels, world, device, schedule, task, config, describe(registry, config.task.name), train.band)
