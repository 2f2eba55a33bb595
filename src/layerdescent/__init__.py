"""Train neural networks whose every layer must lower the loss, on Cooper's primal-dual solver."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("layerdescent")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0+unknown"

from layerdescent.assets import Asset
from layerdescent.config import RunConfig, config_from_dict, load_config
from layerdescent.constraints import Bound, ConstraintSpec, Descent
from layerdescent.errors import (
    AssetError,
    CheckpointError,
    ConfigError,
    DataError,
    DivergenceError,
    LayerdescentError,
    PluginError,
)
from layerdescent.evaluator import evaluate
from layerdescent.hookspecs import hookimpl
from layerdescent.optional import require
from layerdescent.registry import Registry, get_registry
from layerdescent.task import LayerOutput, Task
from layerdescent.trainer import evaluate_run, train

__all__ = [
    "Asset",
    "AssetError",
    "Bound",
    "CheckpointError",
    "ConfigError",
    "ConstraintSpec",
    "DataError",
    "Descent",
    "DivergenceError",
    "LayerOutput",
    "LayerdescentError",
    "PluginError",
    "Registry",
    "RunConfig",
    "Task",
    "__version__",
    "config_from_dict",
    "evaluate",
    "evaluate_run",
    "get_registry",
    "hookimpl",
    "load_config",
    "require",
    "train",
]
