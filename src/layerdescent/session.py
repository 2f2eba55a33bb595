"""What one run trains, built from its config: seeds, the splits in memory, the model, its optimizer and the constrained update."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from layerdescent.config import RunConfig, TrainConfig
from layerdescent.data import Rows
from layerdescent.distributed import World, init_world
from layerdescent.errors import ConfigError, DataError
from layerdescent.problem import ExtraSGD, LayerwiseProblem
from layerdescent.registry import Registry
from layerdescent.update import LayerwiseUpdate


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch."""
    random.seed(seed)
    np.random.seed(seed % 2**32)  # a rank's offset seed may pass numpy's 32 bits; below them nothing changes
    torch.manual_seed(seed)


def epoch_steps(samples: int, train: TrainConfig) -> tuple[int, int]:
    """Micro-batches and optimizer steps in one epoch over ``samples`` training rows."""
    micro = math.ceil(samples / train.batch_size)
    return micro, math.ceil(micro / train.accumulate)


def build_primal_optimizer(model: torch.nn.Module, config: TrainConfig, extragradient: bool = False) -> torch.optim.Optimizer:
    """The model's optimizer as the config names it (Cooper's ExtraAdam/ExtraSGD for an extrapolation scheme)."""
    import cooper

    params = [p for p in model.parameters() if p.requires_grad]
    if extragradient and config.optimizer == "adamw":
        raise ConfigError("solver.scheme = 'extrapolation' has no extragradient AdamW: set train.optimizer = 'adam' (or 'sgd') and train.weight_decay as L2")
    if config.optimizer == "sgd":
        cls = ExtraSGD if extragradient else torch.optim.SGD
        return cls(params, lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay)
    cls = cooper.optim.ExtraAdam if extragradient else torch.optim.AdamW if config.optimizer == "adamw" else torch.optim.Adam
    return cls(params, lr=config.lr, weight_decay=config.weight_decay)


def set_dropout(model: torch.nn.Module, rate: float, task: str) -> None:
    """Give every dropout layer of ``model`` the rate ``train.dropout`` asks for."""
    layers = [m for m in model.modules() if isinstance(m, torch.nn.modules.dropout._DropoutNd)]
    if not layers:
        raise ConfigError(f"train.dropout = {rate:g}, but task {task!r} builds a model with no dropout layer; remove train.dropout")
    for layer in layers:
        layer.p = rate


@dataclass
class Session:
    """What a run trains: its splits in memory, model, and the constrained update."""

    rows: dict[str, Rows]
    model: torch.nn.Module
    update: LayerwiseUpdate
    labels: list[str]
    world: World = World()
    device: torch.device = torch.device("cpu")

    @property
    def problem(self) -> LayerwiseProblem:
        """The constraints' Cooper problem (multipliers, labels)."""
        return self.update.problem


def build_session(config: RunConfig, task: Any, registry: Registry) -> Session:
    """Join the data-parallel world (if any), seed, build splits, model and the constrained update of ``config``."""
    train = config.train
    if train.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("train.device = 'cuda', but this torch has no usable GPU (a CPU build, or no device visible): use 'auto' or 'cpu'")
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
    if train.dropout is not None:
        set_dropout(model, train.dropout, task.name)
    if world.rank:  # the same initial model everywhere, independent perturbations per rank
        seed_everything(config.seed + 1_000_003 * world.rank)
    solver = config.solver
    extragradient = registry.solver(solver.name).gradient_passes(solver.options) == 2
    primal = build_primal_optimizer(model, train, extragradient)
    # sync=False: the trainer averages the layer means over ranks itself, before its checks
    update = LayerwiseUpdate(config.constraints, task.num_layers, primal, solver.name, sync=False, registry=registry, band=train.band, rows=len(rows["train"]), **vars(solver.options))
    update.problem.cmp.to(device)
    return Session(rows, model, update, [f"l{k}" for k in range(task.num_layers + 1)], world, device)
