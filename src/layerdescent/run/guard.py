"""Calls into a task plugin, checked against the contract: any break is one line naming the plugin and the method.

    task = CheckedTask(registry.task("lista")(**options), "task 'lista' (plugin 'lista')")
    task.layer_losses(model, batch)   # a float, a 1-D or integer tensor, a wrong column count: PluginError

The framework never sees a plugin's traceback: a plugin's own ConfigError (a bad option value)
passes through as it is, running out of memory says the model is too large, and anything else
it raises is reported with the method that raised it.
"""

from __future__ import annotations

from typing import Any

import datasets
import torch
import torchmetrics

from layerdescent.errors import ConfigError, LayerdescentError, PluginError
from layerdescent.registry import Registry, get_registry
from layerdescent.task import MAX_LAYERS, LayerOutput, Task, columns

SPLITS = ("train", "validation", "test")


def describe(registry: Any, task_name: str) -> str:
    """How errors name a task: ``task 'lista' (plugin 'lista')``."""
    plugin = getattr(registry, "owner", {}).get(("Task", task_name))
    return f"task {task_name!r}" + (f" (plugin {plugin!r})" if plugin else "")


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [""])[0][:200]


def _out_of_memory(exc: BaseException) -> bool:
    return isinstance(exc, (MemoryError, torch.OutOfMemoryError)) or "can't allocate memory" in str(exc) or "out of memory" in str(exc)


class calling:  # lower-case: it reads as a function, ``with calling(who, method):``
    """Turn whatever plugin code raises inside the block into one PluginError naming ``who`` and ``method``."""

    # A class, not a @contextmanager generator: Ctrl-C landing between a generator's __enter__ and the
    # block would leave it suspended, and its close() at garbage collection would report that as the plugin's GeneratorExit.
    def __init__(self, who: str, method: str) -> None:
        self.who, self.method = who, method

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        # Ctrl-C is the user's: the command stops as interrupted, resumable
        if exc is None or isinstance(exc, (LayerdescentError, KeyboardInterrupt)):
            return
        who, method = self.who, self.method
        if isinstance(exc, Exception):  # a plugin's bug, reported by name instead of as a traceback
            if _out_of_memory(exc):
                raise PluginError(
                    f"{who}: {method} ran out of memory: the model or data are too large for this machine; lower the task's size options (e.g. task.layers)"
                ) from None
            raise PluginError(f"{who}: {method} raised {type(exc).__name__}: {_first_line(exc)}") from None
        # sys.exit(), GeneratorExit, a bare BaseException: a plugin cannot end the command silently
        raise PluginError(f"{who}: {method} raised {base_exception(exc)}; a plugin must raise an Exception, not end the process") from None


def base_exception(exc: BaseException) -> str:
    """How an error line names a BaseException that is not an Exception: ``SystemExit(0) (sys.exit())``, ``GeneratorExit``."""
    if isinstance(exc, SystemExit):
        return f"SystemExit({exc.code!r}) (sys.exit())"
    return type(exc).__name__ + (f": {_first_line(exc)}" if str(exc) else "")


def build_task(registry: Registry | None, name: str, options: dict[str, Any]) -> CheckedTask:
    """Task ``name`` of ``registry`` (None: the installed plugins) built from ``options``, every call into it checked against the contract."""
    registry = registry or get_registry()
    who = describe(registry, name)
    with calling(who, "__init__"):
        task = registry.task(name)(**options)
    return CheckedTask(task, who)


class CheckedTask:
    """A task whose calls from the framework are checked; every other attribute is the task's own."""

    def __init__(self, task: Task, who: str) -> None:
        self._task = task
        self._who = who
        self._layers: int | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._task, name)

    @property
    def inner(self) -> Task:
        """The plugin's own task object."""
        return self._task

    @property
    def num_layers(self) -> int:
        if self._layers is None:
            with calling(self._who, "num_layers"):
                value = self._task.num_layers
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise PluginError(f"{self._who}: num_layers is {value!r}, not an integer >= 1")
            if value > MAX_LAYERS:  # a typo in a depth option, or a model that is not one: building it would not end
                raise ConfigError(
                    f"{self._who}: num_layers is {value:,}; layerdescent trains at most {MAX_LAYERS} layers (lower the task's depth option)"
                )
            self._layers = value
        return self._layers

    def build_model(self) -> torch.nn.Module:
        with calling(self._who, "build_model"):
            model = self._task.build_model()
        if not isinstance(model, torch.nn.Module):
            raise PluginError(f"{self._who}: build_model returned {type(model).__name__}, not a torch.nn.Module")
        if not any(p.requires_grad for p in model.parameters()):
            raise PluginError(f"{self._who}: build_model returned a model with no trainable parameter: nothing would train")
        return model

    def build_datasets(self) -> dict[str, datasets.Dataset]:
        with calling(self._who, "build_datasets"):
            splits = self._task.build_datasets()
        if not isinstance(splits, dict):
            raise PluginError(f"{self._who}: build_datasets returned {type(splits).__name__}, not a dict of splits {', '.join(SPLITS)}")
        for name in SPLITS:
            if name in splits and not isinstance(splits[name], datasets.Dataset):
                raise PluginError(
                    f"{self._who}: build_datasets returned split {name!r} as {type(splits[name]).__name__}, not a datasets.Dataset"
                )
        return splits

    def domain_dataset(self, name: str) -> datasets.Dataset:
        with calling(self._who, f"domain_dataset({name!r})"):
            return self._task.domain_dataset(name)

    def collate(self, rows: dict[str, Any]) -> Any:
        if isinstance(rows, list):  # a DataLoader's default batching: the plugin would fail deep inside, on a list index
            raise ConfigError(
                f"{self._who}: collate takes split[indices], a dict of columns, not a list of rows: use task.collate_rows for a DataLoader's batches (DataLoader(split, batch_size=32, collate_fn=task.collate_rows))"
            )
        with calling(self._who, "collate"):
            return self._task.collate(rows)

    def collate_rows(self, rows: list[dict[str, Any]]) -> Any:
        return self.collate(columns(rows))

    def metrics(self) -> torchmetrics.MetricCollection:
        with calling(self._who, "metrics"):
            metrics = self._task.metrics()
        if not isinstance(metrics, torchmetrics.MetricCollection):
            raise PluginError(f"{self._who}: metrics returned {type(metrics).__name__}, not a torchmetrics.MetricCollection")
        return metrics

    def layer_losses(self, model: torch.nn.Module, batch: Any, gamma: float = 0.0) -> LayerOutput:
        with calling(self._who, "layer_losses"):
            out = self._task.layer_losses(model, batch, gamma=gamma)
        return self._checked(out, "layer_losses", self.num_layers + 1)

    def last_layer_losses(self, model: torch.nn.Module, batch: Any, gamma: float = 0.0) -> LayerOutput | None:
        with calling(self._who, "last_layer_losses"):
            out = self._task.last_layer_losses(model, batch, gamma=gamma)
        return None if out is None else self._checked(out, "last_layer_losses", 1)

    def overrides(self, method: str) -> bool:
        """Whether the plugin implements ``method`` itself rather than inheriting Task's."""
        return getattr(type(self._task), method) is not getattr(Task, method)

    def _checked(self, out: Any, method: str, columns: int) -> LayerOutput:
        """``out`` if it is what ``method`` promises: a LayerOutput of floating B x ``columns`` losses."""
        if not isinstance(out, LayerOutput):
            raise PluginError(f"{self._who}: {method} returned {type(out).__name__}, not a LayerOutput(losses=B x (L+1) tensor)")
        losses = out.losses
        if not losses.is_floating_point():
            raise PluginError(
                f"{self._who}: {method} returned losses of dtype {losses.dtype}; they must be floating point (a per-sample loss, not a count)"
            )
        if losses.shape[1] != columns:
            what = "one column per layer 0..L" if columns > 1 else "one column, the last layer"
            raise PluginError(
                f"{self._who}: {method} returned losses with {losses.shape[1]} columns; it needs {columns} ({what}; num_layers = {self.num_layers})"
            )
        return out
