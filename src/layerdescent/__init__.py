"""Train neural networks whose every layer must lower the loss, on Cooper's primal-dual solver."""

from importlib import import_module
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

try:
    __version__ = version("layerdescent")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0+unknown"

from layerdescent.errors import (
    AssetError,
    CheckpointError,
    ConfigError,
    DataError,
    DivergenceError,
    LayerdescentError,
    PluginError,
)
from layerdescent.hookspecs import hookimpl
from layerdescent.optional import require

# The rest of the public names load on first use (PEP 562): importing the package, the CLI or a
# plugin must not import torch, so that `layerdescent --help`, `list` and `plugins` answer at once.
_LAZY = {
    "Asset": "layerdescent.assets",
    "cache_dir": "layerdescent.assets",
    "extract": "layerdescent.assets",
    "extract_from_file": "layerdescent.assets",
    "soft_threshold": "layerdescent.prox",
    "RunConfig": "layerdescent.run.config",
    "config_from_dict": "layerdescent.run.config",
    "load_config": "layerdescent.run.config",
    "Bound": "layerdescent.core.constraints",
    "ConstraintSpec": "layerdescent.core.constraints",
    "Descent": "layerdescent.core.constraints",
    "DescentTrainer": "layerdescent.integrations.hf",
    "DescentModule": "layerdescent.integrations.lightning",
    "DescentCallback": "layerdescent.integrations.lightning",
    "evaluate": "layerdescent.run.evaluator",
    "Command": "layerdescent.commands",
    "Executor": "layerdescent.bench.executors",
    "ExecutorOptions": "layerdescent.bench.executors",
    "Registry": "layerdescent.registry",
    "get_registry": "layerdescent.registry",
    "LayerOutput": "layerdescent.task",
    "Task": "layerdescent.task",
    "evaluate_run": "layerdescent.run.reevaluate",
    "LayerwiseUpdate": "layerdescent.core.update",
    "LayerBatch": "layerdescent.core.grouping",
    "Observation": "layerdescent.core.observation",
    "LayerwiseCMP": "layerdescent.core.problem",
    "LayerwiseProblem": "layerdescent.core.problem",
    "ERM": "layerdescent.core.solvers",
    "Penalty": "layerdescent.core.penalty",
    "PrimalDual": "layerdescent.core.solvers",
    "PrimalDualOptions": "layerdescent.core.solvers",
    "Solver": "layerdescent.core.solver",
    "Tracker": "layerdescent.run.tracking",
    "train": "layerdescent.run.trainer",
    "build_session": "layerdescent.run.session",
    "Session": "layerdescent.run.session",
    "batches": "layerdescent.run.batches",
    "MicroBatch": "layerdescent.run.batches",
}

if TYPE_CHECKING:  # what static tools see; at run time __getattr__ imports them
    from layerdescent.assets import Asset, cache_dir, extract, extract_from_file
    from layerdescent.bench.executors import Executor, ExecutorOptions
    from layerdescent.commands import Command
    from layerdescent.core.constraints import Bound, ConstraintSpec, Descent
    from layerdescent.core.grouping import LayerBatch
    from layerdescent.core.observation import Observation
    from layerdescent.core.penalty import Penalty
    from layerdescent.core.problem import LayerwiseCMP, LayerwiseProblem
    from layerdescent.core.solver import Solver
    from layerdescent.core.solvers import ERM, PrimalDual, PrimalDualOptions
    from layerdescent.core.update import LayerwiseUpdate
    from layerdescent.integrations.hf import DescentTrainer
    from layerdescent.integrations.lightning import DescentCallback, DescentModule
    from layerdescent.prox import soft_threshold
    from layerdescent.registry import Registry, get_registry
    from layerdescent.run.batches import MicroBatch, batches
    from layerdescent.run.config import RunConfig, config_from_dict, load_config
    from layerdescent.run.evaluator import evaluate
    from layerdescent.run.reevaluate import evaluate_run
    from layerdescent.run.session import Session, build_session
    from layerdescent.run.tracking import Tracker
    from layerdescent.run.trainer import train
    from layerdescent.task import LayerOutput, Task


def __getattr__(name: str) -> Any:
    """Import a public name's module the first time the name is used."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'layerdescent' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = [
    "Asset",
    "AssetError",
    "Bound",
    "CheckpointError",
    "Command",
    "ConfigError",
    "ConstraintSpec",
    "DataError",
    "Descent",
    "DescentCallback",
    "DescentModule",
    "DescentTrainer",
    "DivergenceError",
    "ERM",
    "Executor",
    "ExecutorOptions",
    "LayerBatch",
    "LayerOutput",
    "LayerwiseCMP",
    "LayerwiseProblem",
    "LayerwiseUpdate",
    "LayerdescentError",
    "MicroBatch",
    "Observation",
    "Penalty",
    "PluginError",
    "PrimalDual",
    "PrimalDualOptions",
    "Registry",
    "RunConfig",
    "Session",
    "Solver",
    "Task",
    "Tracker",
    "__version__",
    "batches",
    "build_session",
    "cache_dir",
    "config_from_dict",
    "evaluate",
    "evaluate_run",
    "extract",
    "extract_from_file",
    "get_registry",
    "hookimpl",
    "load_config",
    "require",
    "soft_threshold",
    "train",
]
